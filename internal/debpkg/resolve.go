package debpkg

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// Resolve returns the packages named and every package they depend on
// (Depends and Pre-Depends, transitively), sorted by name. Of alternatives
// the first that a package of the archive is or provides wins, as with apt.
// A dependency on a name in skip is not followed: for what the caller knows
// its files never need (an interpreter of helper scripts, say).
func (a *Archive) Resolve(names []string, skip map[string]bool) ([]*Package, error) {
	if a.provides == nil {
		a.provides = map[string][]*Package{}
		for _, p := range a.pkgs {
			for _, clause := range splitDeps(p.Provides) {
				for _, alt := range clause {
					a.provides[alt.name] = append(a.provides[alt.name], p)
				}
			}
		}
		for _, ps := range a.provides {
			sort.Slice(ps, func(i, j int) bool { return ps[i].Name < ps[j].Name })
		}
	}
	seen := map[string]*Package{}
	var visit func(name, why string) error
	visit = func(name, why string) error {
		p, ok := a.pkgs[name]
		if !ok {
			return fmt.Errorf("%s: no apt source has a package %s for %s", why, name, a.Arch)
		}
		if seen[p.Name] != nil {
			return nil
		}
		seen[p.Name] = p
		for _, clause := range splitDeps(p.PreDepends + ", " + p.Depends) {
			chosen := ""
			for _, alt := range clause {
				if skip[alt.name] {
					chosen = "-"
					break
				}
				if q, ok := a.pkgs[alt.name]; ok && alt.satisfiedBy(q.Version) {
					chosen = q.Name
					break
				}
				if ps := a.provides[alt.name]; len(ps) > 0 && alt.op == "" {
					chosen = ps[0].Name
					break
				}
			}
			if chosen == "" {
				return fmt.Errorf("%s depends on %s, which no apt source has for %s", p, clause, a.Arch)
			}
			if chosen == "-" {
				continue
			}
			if err := visit(chosen, p.String()); err != nil {
				return err
			}
		}
		return nil
	}
	for _, n := range names {
		if err := visit(n, "wanted"); err != nil {
			return nil, err
		}
	}
	out := make([]*Package, 0, len(seen))
	for _, p := range seen {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

type dep struct{ name, op, version string }

func (d dep) satisfiedBy(v string) bool {
	if d.op == "" {
		return true
	}
	c := CompareVersions(v, d.version)
	switch d.op {
	case "<<":
		return c < 0
	case "<=", "<":
		return c <= 0
	case "=":
		return c == 0
	case ">=", ">":
		return c >= 0
	case ">>":
		return c > 0
	}
	return false
}

type clause []dep

func (c clause) String() string {
	var s []string
	for _, d := range c {
		if d.op != "" {
			s = append(s, fmt.Sprintf("%s (%s %s)", d.name, d.op, d.version))
		} else {
			s = append(s, d.name)
		}
	}
	return strings.Join(s, " | ")
}

// splitDeps parses a Depends-style field: "a (>= 1), b | c:any, d".
// The architecture qualifiers (:any, :native) name the same package here,
// an image being of one architecture.
func splitDeps(field string) []clause {
	var out []clause
	for _, c := range strings.Split(field, ",") {
		var cl clause
		for _, alt := range strings.Split(c, "|") {
			alt = strings.TrimSpace(alt)
			if alt == "" {
				continue
			}
			d := dep{}
			if i := strings.IndexByte(alt, '('); i >= 0 {
				rel := strings.TrimSuffix(strings.TrimSpace(alt[i+1:]), ")")
				alt = strings.TrimSpace(alt[:i])
				op := strings.TrimRight(rel, " 0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.+~:-")
				d.op = strings.TrimSpace(op)
				d.version = strings.TrimSpace(rel[len(op):])
			}
			if i := strings.IndexAny(alt, " ["); i >= 0 {
				alt = alt[:i]
			}
			name, _, _ := strings.Cut(alt, ":")
			d.name = name
			cl = append(cl, d)
		}
		if len(cl) > 0 {
			out = append(out, cl)
		}
	}
	return out
}

// Fetch returns the path of p's .deb in the cache, downloading it when it is
// not there; either way its SHA256 is the index's.
func (a *Archive) Fetch(ctx context.Context, p *Package) (string, error) {
	f, err := a.fetch(ctx, p.source.URI+"/"+p.Filename, filepath.Join(a.cache, "debs"), p.SHA256, p.Size)
	if err != nil {
		return "", fmt.Errorf("%s: %w", p, err)
	}
	return f, nil
}

// File is one entry of a package's data.tar.
type File struct {
	Path string // absolute, cleaned
	Mode int64  // permission bits
	Dir  bool
	Link string // symlink target
	Data []byte
}

// Files returns the entries of the data.tar of the .deb at debPath, as
// dpkg-deb reads it (whatever its compression). A hard link is returned as
// a copy of its target.
func Files(ctx context.Context, debPath string) ([]File, error) {
	cmd := exec.CommandContext(ctx, "dpkg-deb", "--fsys-tarfile", debPath)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		var ee *exec.Error
		if errors.As(err, &ee) {
			return nil, fmt.Errorf("dpkg-deb is not installed (Debian: dpkg): %w", err)
		}
		return nil, err
	}
	var out []File
	byPath := map[string]int{}
	tr := tar.NewReader(stdout)
	var rerr error
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			rerr = err
			break
		}
		f := File{Path: path.Clean("/" + h.Name), Mode: h.Mode & 0o7777}
		switch h.Typeflag {
		case tar.TypeDir:
			f.Dir = true
		case tar.TypeSymlink:
			f.Link = h.Linkname
		case tar.TypeLink:
			i, ok := byPath[path.Clean("/"+h.Linkname)]
			if !ok {
				rerr = fmt.Errorf("hard link %s to %s, which comes later", h.Name, h.Linkname)
			} else {
				f.Data = out[i].Data
			}
		case tar.TypeReg:
			if f.Data, err = io.ReadAll(tr); err != nil {
				rerr = err
			}
		default:
			continue // devices, fifos: none in the packages an image takes
		}
		if rerr != nil {
			break
		}
		byPath[f.Path] = len(out)
		out = append(out, f)
	}
	if rerr != nil {
		_ = cmd.Process.Kill()
	}
	_, _ = io.Copy(io.Discard, stdout)
	if err := cmd.Wait(); err != nil && rerr == nil {
		rerr = fmt.Errorf("dpkg-deb --fsys-tarfile %s: %w: %s", debPath, err, strings.TrimSpace(stderr.String()))
	}
	if rerr != nil {
		return nil, fmt.Errorf("%s: %w", debPath, rerr)
	}
	return out, nil
}
