// Package images checks the images `make images` writes (internal/images):
// built twice from this checkout for every platform, with the plugin's
// programs from the Debian archive this machine's apt uses. It needs root
// (the Debian cache under /var/cache/podvol, chroot) and the network (or a
// warm cache), so it runs in make test, not make check.
package images

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/podvol/podvol/internal/debpkg"
	"github.com/podvol/podvol/internal/device"
	"github.com/podvol/podvol/internal/images"
	"github.com/podvol/podvol/internal/ociimage"
)

// machines are the ELF machine of each platform's binaries, written here
// again rather than read from internal/images, so that a wrong entry there
// fails this test.
var machines = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// libDirs are where Debian's dynamic loader looks for libraries with no
// ld.so.cache: /lib/<triplet>, /usr/lib/<triplet>, /lib, /usr/lib.
var triplets = map[string]string{"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}

type built struct {
	dir     string
	digests map[string]string
	archive map[string]*ociimage.Archive
}

var (
	first, second *built
	build         images.Build
)

func repoRoot(t *testing.T) string {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

// buildTwice builds every image twice, into two directories.
func buildTwice(t *testing.T) (*built, *built) {
	t.Helper()
	if first != nil {
		return first, second
	}
	if os.Geteuid() != 0 {
		t.Fatalf("the Debian package cache %s needs root", images.DefaultCache)
	}
	repo := repoRoot(t)
	var err error
	build, err = images.ForRepo(repo, "v0.0.0-test")
	if err != nil {
		t.Fatal(err)
	}
	build.Logf = t.Logf
	// Without -trimpath (make images' only difference): the amd64 build
	// shares the build cache with the other tests and the dev cluster.
	build.TrimPath = false
	var out [2]*built
	for i := range out {
		dir, err := os.MkdirTemp("", "podvol-images-")
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		d, err := build.WriteAll(context.Background(), repo, dir, images.Platforms)
		if err != nil {
			_ = os.RemoveAll(dir)
			t.Fatal(err)
		}
		t.Logf("build %d: %s", i+1, time.Since(start).Round(100*time.Millisecond))
		b := &built{dir: dir, digests: d, archive: map[string]*ociimage.Archive{}}
		for _, name := range []string{images.Plugin, images.Controller} {
			a, err := ociimage.ReadArchive(filepath.Join(dir, name+".oci.tar"))
			if err != nil {
				t.Fatal(err)
			}
			b.archive[name] = a
		}
		out[i] = b
	}
	first, second = out[0], out[1]
	return first, second
}

func TestMain(m *testing.M) {
	code := m.Run()
	for _, b := range []*built{first, second} {
		if b != nil {
			_ = os.RemoveAll(b.dir)
		}
	}
	os.Exit(code)
}

// TestImagesAreReproducible: two builds of the same checkout give the same
// digests, and the same archives byte for byte.
func TestImagesAreReproducible(t *testing.T) {
	a, b := buildTwice(t)
	for _, name := range []string{images.Plugin, images.Controller} {
		if a.digests[name] != b.digests[name] || a.digests[name] == "" {
			t.Errorf("%s: digests %s and %s", name, a.digests[name], b.digests[name])
		}
		x, _ := os.ReadFile(filepath.Join(a.dir, name+".oci.tar"))
		y, _ := os.ReadFile(filepath.Join(b.dir, name+".oci.tar"))
		if !bytes.Equal(x, y) {
			t.Errorf("%s: the two archives differ", name)
		}
	}
}

// platformImage is one platform's manifest of an archive, read back.
type platformImage struct {
	arch   string
	config ociimage.Config
	hdrs   map[string]*tar.Header
	data   map[string][]byte
}

func platforms(t *testing.T, a *ociimage.Archive) []platformImage {
	t.Helper()
	if len(a.Index.Manifests) != 1 || a.Index.Manifests[0].MediaType != ociimage.MediaTypeIndex {
		t.Fatalf("index.json lists %+v, want one image index", a.Index.Manifests)
	}
	var idx ociimage.Index
	if err := a.JSON(a.Index.Manifests[0], &idx); err != nil {
		t.Fatal(err)
	}
	var out []platformImage
	for _, d := range idx.Manifests {
		var m ociimage.Manifest
		if err := a.JSON(d, &m); err != nil {
			t.Fatal(err)
		}
		p := platformImage{arch: d.Platform.Architecture}
		if err := a.JSON(m.Config, &p.config); err != nil {
			t.Fatal(err)
		}
		if p.config.Architecture != d.Platform.Architecture || p.config.OS != d.Platform.OS {
			t.Errorf("the index says %s/%s, the config %s/%s", d.Platform.OS, d.Platform.Architecture, p.config.OS, p.config.Architecture)
		}
		var err error
		if p.hdrs, p.data, err = a.LayerFiles(m.Layers[0]); err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}

// TestIndexHasEveryPlatform: each archive is an index of linux/amd64 and
// linux/arm64, each with the labels of the build.
func TestIndexHasEveryPlatform(t *testing.T) {
	b, _ := buildTwice(t)
	for _, name := range []string{images.Plugin, images.Controller} {
		got := map[string]bool{}
		for _, p := range platforms(t, b.archive[name]) {
			got[p.config.OS+"/"+p.arch] = true
			l := p.config.Config.Labels
			for k, want := range map[string]string{
				"org.opencontainers.image.version":  "v0.0.0-test",
				"org.opencontainers.image.revision": build.Revision,
				"org.opencontainers.image.source":   build.Source,
				"org.opencontainers.image.created":  build.Created.Format(time.RFC3339),
			} {
				if l[k] != want || want == "" {
					t.Errorf("%s %s: label %s = %q, want %q", name, p.arch, k, l[k], want)
				}
			}
			if p.config.Created != build.Created.Format(time.RFC3339) {
				t.Errorf("%s %s: created %s, want the commit's time %s", name, p.arch, p.config.Created, build.Created)
			}
		}
		if !got["linux/amd64"] || !got["linux/arm64"] || len(got) != 2 {
			t.Errorf("%s: platforms %v, want linux/amd64 and linux/arm64", name, got)
		}
	}
}

func elfOf(t *testing.T, data []byte, what string) *elf.File {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("%s is not an ELF file: %v", what, err)
	}
	return f
}

// TestBinariesAreOfTheirArchitecture: /podvol-plugin and /podvol-controller
// are static ELF executables of the image's architecture, and so is the
// plugin image's /podvol-group-snapshotter.
func TestBinariesAreOfTheirArchitecture(t *testing.T) {
	b, _ := buildTwice(t)
	for _, name := range []string{images.Plugin, images.Controller} {
		for _, p := range platforms(t, b.archive[name]) {
			f := elfOf(t, p.data["/"+name], name+" "+p.arch)
			if f.Machine != machines[p.arch] {
				t.Errorf("%s of %s is for %s", name, p.arch, f.Machine)
			}
			for _, prog := range f.Progs {
				if prog.Type == elf.PT_INTERP {
					t.Errorf("%s of %s is dynamically linked (CGO_ENABLED=0 builds a static one)", name, p.arch)
				}
			}
			if e := p.config.Config.Entrypoint; len(e) != 1 || e[0] != "/"+name {
				t.Errorf("%s of %s: entrypoint %v", name, p.arch, e)
			}
		}
	}
	// The chart runs the group snapshotter from the plugin's image.
	for _, p := range platforms(t, b.archive[images.Plugin]) {
		name := images.GroupSnapshotter
		if f := elfOf(t, p.data["/"+name], name+" "+p.arch); f.Machine != machines[p.arch] {
			t.Errorf("%s of %s is for %s", name, p.arch, f.Machine)
		}
	}
}

// TestControllerRunsAsNonRoot: the controller image's user is numeric and
// not 0; the plugin's is root (it attaches loop devices and mounts).
func TestControllerRunsAsNonRoot(t *testing.T) {
	b, _ := buildTwice(t)
	for _, p := range platforms(t, b.archive[images.Controller]) {
		user, group, _ := strings.Cut(p.config.Config.User, ":")
		uid, err := strconv.Atoi(user)
		if err != nil || uid == 0 {
			t.Errorf("controller %s: user %q, want a numeric user other than 0", p.arch, p.config.Config.User)
		}
		if gid, err := strconv.Atoi(group); err != nil || gid == 0 {
			t.Errorf("controller %s: group of %q, want a numeric group other than 0", p.arch, p.config.Config.User)
		}
	}
	for _, p := range platforms(t, b.archive[images.Plugin]) {
		if u := p.config.Config.User; u != "" && u != "0" && u != "0:0" {
			t.Errorf("plugin %s: user %q, want root", p.arch, u)
		}
	}
}

// resolve follows symlinks in the layer to a regular file.
func (p platformImage) resolve(name string) (string, bool) {
	for hops := 0; hops < 40; hops++ {
		dir, base := path.Split(path.Clean(name))
		if dir != "/" {
			d, ok := p.resolveDir(path.Clean(dir))
			if !ok {
				return name, false
			}
			dir = d + "/"
		}
		name = path.Clean(dir + base)
		h, ok := p.hdrs[name]
		if !ok {
			return name, false
		}
		switch h.Typeflag {
		case tar.TypeSymlink:
			if strings.HasPrefix(h.Linkname, "/") {
				name = h.Linkname
			} else {
				name = path.Join(path.Dir(name), h.Linkname) //nolint:gosec // G305: a lookup in the layer's map, not a path on disk
			}
		case tar.TypeReg:
			return name, true
		default:
			return name, false
		}
	}
	return name, false
}

func (p platformImage) resolveDir(dir string) (string, bool) {
	for hops := 0; hops < 40; hops++ {
		h, ok := p.hdrs[dir]
		if !ok {
			return dir, false
		}
		if h.Typeflag == tar.TypeDir {
			return dir, true
		}
		if h.Typeflag != tar.TypeSymlink {
			return dir, false
		}
		if strings.HasPrefix(h.Linkname, "/") {
			dir = path.Clean(h.Linkname)
		} else {
			dir = path.Join(path.Dir(dir), h.Linkname) //nolint:gosec // G305: likewise
		}
	}
	return dir, false
}

// checkELF checks that the file at name is an ELF of p's architecture whose
// interpreter and needed libraries are in the image, transitively.
func (p platformImage) checkELF(t *testing.T, name string, checked map[string]bool) {
	t.Helper()
	file, ok := p.resolve(name)
	if !ok {
		t.Errorf("%s: %s is not in the image", p.arch, name)
		return
	}
	if checked[file] {
		return
	}
	checked[file] = true
	f := elfOf(t, p.data[file], file)
	if f.Machine != machines[p.arch] {
		t.Errorf("%s: %s is for %s", p.arch, file, f.Machine)
	}
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			b := make([]byte, prog.Filesz)
			if _, err := prog.ReadAt(b, 0); err != nil {
				t.Fatal(err)
			}
			p.checkELF(t, strings.TrimRight(string(b), "\x00"), checked)
		}
	}
	needed, err := f.ImportedLibraries()
	if err != nil {
		t.Fatal(err)
	}
	tr := triplets[p.arch]
	for _, lib := range needed {
		found := ""
		for _, d := range []string{"/lib/" + tr, "/usr/lib/" + tr, "/lib", "/usr/lib"} {
			if _, ok := p.resolve(d + "/" + lib); ok {
				found = d + "/" + lib
				break
			}
		}
		if found == "" {
			t.Errorf("%s: %s needs %s, which is not in the image's library directories", p.arch, file, lib)
			continue
		}
		p.checkELF(t, found, checked)
	}
}

// TestPluginImageHasEveryProgram: for each platform, each program of
// device.Programs is on the image's PATH, an ELF of that architecture, with
// its interpreter and every shared library it needs in the image.
func TestPluginImageHasEveryProgram(t *testing.T) {
	b, _ := buildTwice(t)
	for _, p := range platforms(t, b.archive[images.Plugin]) {
		var path []string
		for _, e := range p.config.Config.Env {
			if v, ok := strings.CutPrefix(e, "PATH="); ok {
				path = strings.Split(v, ":")
			}
		}
		checked := map[string]bool{}
		for _, prog := range device.Programs {
			found := ""
			for _, d := range path {
				if _, ok := p.resolve(d + "/" + prog.Name); ok {
					found = d + "/" + prog.Name
					break
				}
			}
			if found == "" {
				t.Errorf("%s: %s is on none of the image's PATH %v", p.arch, prog.Name, path)
				continue
			}
			p.checkELF(t, found, checked)
		}
		if _, ok := p.resolve("/etc/mke2fs.conf"); !ok {
			t.Errorf("%s: no /etc/mke2fs.conf (mkfs.ext4's defaults)", p.arch)
		}
		t.Logf("%s: %d ELF files checked", p.arch, len(checked))
	}
}

// TestPluginProgramsRunInTheImage runs the image of this machine's
// architecture: its layer unpacked and each program chrooted into it (with
// a /proc, as in a container), so that nothing of the host is found. mkfs.ext4, e2fsck and resize2fs work on
// a file, mkfs.xfs likewise, blkid finds what they made, and mount and
// xfs_growfs print their version.
func TestPluginProgramsRunInTheImage(t *testing.T) {
	b, _ := buildTwice(t)
	var p *platformImage
	for _, x := range platforms(t, b.archive[images.Plugin]) {
		if x.arch == runtime.GOARCH {
			p = &x
		}
	}
	if p == nil {
		t.Fatalf("no image of %s", runtime.GOARCH)
	}
	root := t.TempDir()
	for name, h := range p.hdrs {
		dst := filepath.Join(root, name)
		var err error
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(dst, 0o755)
		case tar.TypeSymlink:
			if err = os.MkdirAll(filepath.Dir(dst), 0o755); err == nil {
				err = os.Symlink(h.Linkname, dst)
			}
		case tar.TypeReg:
			if err = os.MkdirAll(filepath.Dir(dst), 0o755); err == nil {
				err = os.WriteFile(dst, p.data[name], os.FileMode(h.Mode)&0o777)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	// A container has /proc: the e2fsprogs check whether a device is
	// mounted there (/etc/mtab only when /proc/mounts is missing).
	for _, d := range []string{"tmp", "proc"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o1777); err != nil {
			t.Fatal(err)
		}
	}
	for _, img := range []struct {
		name string
		size int64
	}{{"ext4.img", 64 << 20}, {"xfs.img", 320 << 20}} {
		f, err := os.Create(filepath.Join(root, "tmp", img.name))
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(img.size); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	run := func(want string, args ...string) {
		t.Helper()
		// In a mount namespace of its own, whose proc mount goes with
		// it: nothing to unmount afterwards.
		cmd := exec.Command("unshare", append([]string{"--mount", "--fork", "--", "sh", "-c", `mount -t proc proc "$0/proc" && exec chroot "$0" "$@"`, root}, args...)...)
		cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("in the image: %s: %v\n%s", strings.Join(args, " "), err, out)
			return
		}
		if !strings.Contains(string(out), want) {
			t.Errorf("in the image: %s printed %q, want %q in it", strings.Join(args, " "), out, want)
		}
	}
	run("", "mkfs.ext4", "-q", "-F", "-m", "0", "-b", "4096", "/tmp/ext4.img")
	run("", "e2fsck", "-f", "-p", "/tmp/ext4.img")
	run("", "resize2fs", "/tmp/ext4.img", "128M")
	run("TYPE=ext4", "blkid", "-p", "-o", "export", "/tmp/ext4.img")
	run("", "mkfs.xfs", "-q", "-f", "/tmp/xfs.img")
	run("TYPE=xfs", "blkid", "-p", "-o", "export", "/tmp/xfs.img")
	run("mount from util-linux", "mount", "--version")
	run("xfs_growfs version", "xfs_growfs", "-V")
}

// TestReleaseSignatureIsChecked: the Release file the build verified, with
// one byte of its signed text changed, no longer verifies.
func TestReleaseSignatureIsChecked(t *testing.T) {
	buildTwice(t)
	sources, err := debpkg.ReadSources("/")
	if err != nil {
		t.Fatal(err)
	}
	cached, err := filepath.Glob(filepath.Join(images.DefaultCache, "release", "*.InRelease"))
	if err != nil || len(cached) == 0 {
		t.Fatalf("no Release file cached under %s: %v", images.DefaultCache, err)
	}
	body, err := os.ReadFile(cached[0])
	if err != nil {
		t.Fatal(err)
	}
	var keyrings []string
	for _, s := range sources {
		keyrings = append(keyrings, s.Keyrings...)
	}
	ctx := context.Background()
	if _, err := debpkg.Verify(ctx, body, keyrings); err != nil {
		t.Fatalf("%s as fetched does not verify: %v", cached[0], err)
	}
	i := bytes.Index(body, []byte("SHA256:"))
	if i < 0 {
		t.Fatalf("%s has no SHA256 section", cached[0])
	}
	tampered := bytes.Clone(body)
	j := i + bytes.IndexByte(body[i:], '\n') + 2 // a hash's first character
	tampered[j] ^= 1
	if _, err := debpkg.Verify(ctx, tampered, keyrings); err == nil {
		t.Errorf("a Release file with its first SHA256 changed verified")
	}
}
