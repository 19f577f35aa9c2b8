package images

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/podvol/podvol/internal/debpkg"
	"github.com/podvol/podvol/internal/device"
	"github.com/podvol/podvol/internal/ociimage"
)

// Arch is what an image of one architecture needs to know about it.
type Arch struct {
	Machine elf.Machine
	// LibDirs are where the dynamic loader of Debian's glibc looks for
	// shared libraries with no ld.so.cache, in its order.
	LibDirs []string
}

// Arches are the architectures podvol's images are built for.
var Arches = map[string]Arch{
	"amd64": {Machine: elf.EM_X86_64, LibDirs: []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib", "/usr/lib"}},
	"arm64": {Machine: elf.EM_AARCH64, LibDirs: []string{"/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/lib", "/usr/lib"}},
}

// ProgramDirs are the directories of the image's PATH, in its order.
var ProgramDirs = []string{"/usr/sbin", "/usr/bin", "/sbin", "/bin"}

// configFiles are files the programs read at run time: mke2fs's defaults
// for ext4 (its built-in ones differ).
var configFiles = []string{"/etc/mke2fs.conf"}

// skipDepends are dependencies whose files no program of the plugin loads:
// xfsprogs' python3, for its xfs_scrub_all script.
var skipDepends = map[string]bool{"python3": true}

// PluginTools returns the files of device.Programs for goarch, from the
// Debian packages device.Programs names and their dependencies: each
// program (and the symlinks that name it), the ELF interpreter and every
// shared library it loads (DT_NEEDED, transitively), configFiles, and the
// copyright file of each package any of those comes from.
func PluginTools(ctx context.Context, goarch, cache string, logf func(string, ...any)) ([]ociimage.File, error) {
	arch, ok := Arches[goarch]
	if !ok {
		return nil, fmt.Errorf("no image for %s: podvol's images are for %s", goarch, strings.Join(Platforms, ", "))
	}
	sources, err := debpkg.ReadSources("/")
	if err != nil {
		return nil, err
	}
	a, err := debpkg.Open(ctx, sources, goarch, cache, logf)
	if err != nil {
		return nil, err
	}
	pkgs, err := a.Resolve(device.ToolPackages(), skipDepends)
	if err != nil {
		return nil, err
	}
	// The selection is cached by what it is made of (the packages, by
	// hash, and the lists above): a warm build extracts nothing.
	key := selectionKey(goarch, pkgs)
	cached := filepath.Join(cache, "selections", key+".tar")
	if files, err := readSelection(cached); err == nil {
		return files, nil
	}
	fs := tree{files: map[string]debpkg.File{}, owner: map[string]string{}}
	for _, p := range pkgs {
		deb, err := a.Fetch(ctx, p)
		if err != nil {
			return nil, err
		}
		files, err := debpkg.Files(ctx, deb)
		if err != nil {
			return nil, err
		}
		for _, f := range files {
			if _, dup := fs.files[f.Path]; dup && !f.Dir {
				return nil, fmt.Errorf("%s is in both %s and %s", f.Path, fs.owner[f.Path], p.Name)
			}
			if !f.Dir || fs.files[f.Path].Path == "" {
				fs.files[f.Path] = f
				fs.owner[f.Path] = p.Name
			}
		}
	}
	sel := selection{tree: fs, arch: arch, goarch: goarch, picked: map[string]bool{}}
	for _, prog := range device.Programs {
		p, err := fs.lookPath(prog.Name)
		if err != nil {
			return nil, fmt.Errorf("%s (Debian package %s, linux/%s): %w", prog.Name, prog.Package, goarch, err)
		}
		if err := sel.addELF(p); err != nil {
			return nil, fmt.Errorf("%s (linux/%s): %w", prog.Name, goarch, err)
		}
	}
	for _, c := range configFiles {
		if err := sel.add(c); err != nil {
			return nil, err
		}
	}
	owners := map[string]bool{}
	for p := range sel.picked {
		if o := fs.owner[p]; o != "" {
			owners[o] = true
		}
	}
	for o := range owners {
		c := "/usr/share/doc/" + o + "/copyright"
		if _, err := fs.resolve(c); err == nil {
			if err := sel.add(c); err != nil {
				return nil, err
			}
		}
	}
	paths := make([]string, 0, len(sel.picked))
	for p := range sel.picked {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	out := make([]ociimage.File, 0, len(paths))
	for _, p := range paths {
		f := fs.files[p]
		out = append(out, ociimage.File{Path: p, Data: f.Data, Link: f.Link, Mode: f.Mode, Dir: f.Dir})
	}
	if err := writeSelection(cached, out); err != nil {
		return nil, fmt.Errorf("caching the plugin's programs: %w", err)
	}
	return out, nil
}

// selectionFormat is part of the selection's cache key: change it when
// what PluginTools selects from the same packages changes.
const selectionFormat = 1

func selectionKey(goarch string, pkgs []*debpkg.Package) string {
	h := sha256.New()
	fmt.Fprintf(h, "%d\n%s\n%v\n%v\n%v\n", selectionFormat, goarch, device.Programs, configFiles, skipDepends)
	for _, p := range pkgs {
		fmt.Fprintf(h, "%s %s\n", p.Name, p.SHA256)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// writeSelection keeps files as a tar at path.
func writeSelection(path string, files []ociimage.File) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: f.Path, Mode: f.Mode, Typeflag: tar.TypeReg, Size: int64(len(f.Data))}
		switch {
		case f.Dir:
			h.Typeflag, h.Size = tar.TypeDir, 0
		case f.Link != "":
			h.Typeflag, h.Linkname, h.Size = tar.TypeSymlink, f.Link, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(f.Data); err != nil {
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, buf.Bytes(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func readSelection(path string) ([]ociimage.File, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []ociimage.File
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		f := ociimage.File{Path: h.Name, Mode: h.Mode}
		switch h.Typeflag {
		case tar.TypeDir:
			f.Dir = true
		case tar.TypeSymlink:
			f.Link = h.Linkname
		default:
			if f.Data, err = io.ReadAll(tr); err != nil {
				return nil, err
			}
		}
		out = append(out, f)
	}
}

// tree is the files of several packages' data.tar, by path.
type tree struct {
	files map[string]debpkg.File
	owner map[string]string // path → package
}

// resolve follows symlinks (in every component) to a file that is not one,
// returning the chain of paths it went through, that file last.
func (t tree) resolve(p string) ([]string, error) {
	var chain []string
	for hops := 0; hops < 40; hops++ {
		// Resolve the directories first: a symlinked parent.
		dir, base := path.Split(path.Clean(p))
		if dir != "/" {
			dc, err := t.resolve(path.Clean(dir))
			if err != nil {
				return nil, err
			}
			chain = append(chain, dc[:len(dc)-1]...)
			dir = dc[len(dc)-1] + "/"
		}
		p = path.Clean(dir + base)
		f, ok := t.files[p]
		if !ok {
			return nil, fmt.Errorf("%s is in none of the packages", p)
		}
		chain = append(chain, p)
		if f.Link == "" {
			return chain, nil
		}
		if strings.HasPrefix(f.Link, "/") {
			p = f.Link
		} else {
			p = path.Join(path.Dir(p), f.Link)
		}
	}
	return nil, fmt.Errorf("%s: too many levels of symbolic links", p)
}

func (t tree) lookPath(name string) (string, error) {
	for _, d := range ProgramDirs {
		if _, ok := t.files[d+"/"+name]; ok {
			return d + "/" + name, nil
		}
	}
	return "", fmt.Errorf("in none of %s of the packages", strings.Join(ProgramDirs, ", "))
}

// selection is the files picked for the image.
type selection struct {
	tree   tree
	arch   Arch
	goarch string
	picked map[string]bool
}

// add picks p with the symlinks that lead to it and returns the real file.
func (s *selection) add(p string) error {
	chain, err := s.tree.resolve(p)
	if err != nil {
		return err
	}
	for _, c := range chain {
		s.picked[c] = true
	}
	return nil
}

// addELF picks the ELF program or library at p, its interpreter and the
// libraries it needs, transitively.
func (s *selection) addELF(p string) error {
	chain, err := s.tree.resolve(p)
	if err != nil {
		return err
	}
	file := chain[len(chain)-1]
	done := s.picked[file]
	for _, c := range chain {
		s.picked[c] = true
	}
	if done {
		return nil
	}
	f, err := elf.NewFile(bytes.NewReader(s.tree.files[file].Data))
	if err != nil {
		return fmt.Errorf("%s is not an ELF file: %w", file, err)
	}
	if f.Machine != s.arch.Machine {
		return fmt.Errorf("%s is for %s, not %s", file, f.Machine, s.goarch)
	}
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			b := make([]byte, prog.Filesz)
			if _, err := prog.ReadAt(b, 0); err != nil {
				return fmt.Errorf("%s: its interpreter: %w", file, err)
			}
			if err := s.addELF(strings.TrimRight(string(b), "\x00")); err != nil {
				return fmt.Errorf("%s's interpreter: %w", file, err)
			}
		}
	}
	needed, err := f.ImportedLibraries()
	if err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	for _, lib := range needed {
		found := ""
		for _, d := range s.arch.LibDirs {
			if _, err := s.tree.resolve(d + "/" + lib); err == nil {
				found = d + "/" + lib
				break
			}
		}
		if found == "" {
			return fmt.Errorf("%s needs %s, which no package of its dependencies has in %s", file, lib, strings.Join(s.arch.LibDirs, ", "))
		}
		if err := s.addELF(found); err != nil {
			return err
		}
	}
	return nil
}
