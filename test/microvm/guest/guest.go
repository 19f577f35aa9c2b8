// Package guest prepares what podvol's test microVM boots: a Debian kernel,
// unpacked from Debian's kernel package into a cache (never installed as the
// host's kernel), the few modules a direct-assigned volume needs, and an
// initramfs built at test time from busybox-static, those modules and the
// static guest agent (./agent) as /init.
package guest

import (
	"bytes"
	"compress/gzip"
	"debug/elf"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// Modules are the modules the guest loads, before their dependencies are
// added. crc32c_generic answers the crc32c that ext4, jbd2 and libcrc32c ask
// the crypto API for (a soft dependency: no modprobe in the guest to find it).
// virtiofs (and fuse) is kept for bench/microvm, which compares a
// direct-assigned disk with the same filesystem shared by virtio-fs.
var Modules = []string{"crc32c_generic", "virtio_mmio", "virtio_blk", "virtio_console", "ext4", "xfs", "virtiofs"}

// BootModules are loaded as the guest starts; the rest (a filesystem and what
// it needs) when the agent mounts that filesystem: xfs alone takes a second
// to load under TCG.
var BootModules = []string{"crc32c_generic", "virtio_mmio", "virtio_blk", "virtio_console"}

// Filesystems are the fstypes the guest can mount; Options.Filesystems adds
// others of Modules.
var Filesystems = []string{"ext4", "xfs"}

// Options adds to the initramfs what only some guests need.
type Options struct {
	Filesystems []string // e.g. virtiofs
	// Binaries are host programs copied in at their path, with the shared
	// libraries ldd lists for them at theirs.
	Binaries []string
}

// Guest is a bootable kernel and initramfs.
type Guest struct {
	Version   string // kernel release, e.g. 6.1.0-57-amd64
	Kernel    string
	Initramfs string
	Modules   []string // in load order
}

// CacheDir is ${PODVOL_CACHE:-/var/cache/podvol}.
func CacheDir() string {
	if d := os.Getenv("PODVOL_CACHE"); d != "" {
		return d
	}
	return "/var/cache/podvol"
}

// EnsurePackage installs a Debian package when the command it provides is
// missing.
func EnsurePackage(t testing.TB, command, pkg string) {
	t.Helper()
	if _, err := exec.LookPath(command); err == nil {
		return
	}
	t.Logf("%s missing: apt-get install %s", command, pkg)
	cmd := exec.Command("apt-get", "install", "-y", "-qq", "--no-install-recommends", pkg)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("apt-get install %s: %v\n%s", pkg, err, out)
	}
}

// KernelVersion is the release of the kernel Debian's linux-image-amd64
// depends on (PODVOL_MICROVM_KERNEL overrides it, e.g. 6.1.0-57-amd64).
func KernelVersion() (string, error) {
	if v := os.Getenv("PODVOL_MICROVM_KERNEL"); v != "" {
		return v, nil
	}
	out, err := exec.Command("apt-cache", "depends", "linux-image-amd64").Output()
	if err == nil {
		for _, l := range strings.Split(string(out), "\n") {
			l = strings.TrimSpace(l)
			if v, ok := strings.CutPrefix(l, "Depends: linux-image-"); ok && strings.HasSuffix(v, "-amd64") {
				return v, nil
			}
		}
	}
	// No package index: the newest kernel already in the cache will do.
	dirs, _ := filepath.Glob(filepath.Join(CacheDir(), "microvm-*", "complete"))
	if len(dirs) > 0 {
		slices.Sort(dirs)
		return strings.TrimPrefix(filepath.Base(filepath.Dir(dirs[len(dirs)-1])), "microvm-"), nil
	}
	return "", fmt.Errorf("cannot tell which kernel linux-image-amd64 depends on (apt-cache depends: %w %s)", err, out)
}

// Kernel returns the cache directory holding vmlinuz and modules/ of the
// kernel version, downloading and unpacking Debian's package the first time.
func Kernel(t testing.TB, version string) string {
	t.Helper()
	dir := filepath.Join(CacheDir(), "microvm-"+version)
	// The stamp names the modules kept: a cache that lacks one is made
	// again.
	stamp := "modules: " + strings.Join(Modules, " ") + "\n"
	complete := func() bool {
		b, err := os.ReadFile(filepath.Join(dir, "complete"))
		if err != nil {
			return false
		}
		_, kept, _ := strings.Cut(string(b), "modules: ")
		return !slices.ContainsFunc(Modules, func(m string) bool { return !slices.Contains(strings.Fields(kept), m) })
	}
	if complete() {
		return dir
	}
	if err := os.MkdirAll(CacheDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	lock, err := os.OpenFile(filepath.Join(CacheDir(), ".microvm.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	if complete() {
		return dir
	}
	work, err := os.MkdirTemp(CacheDir(), ".microvm-work-")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = os.RemoveAll(work) }() // the download and unpacked package: cache litter at worst
	pkg := "linux-image-" + version
	t.Logf("guest kernel %s not cached: apt-get download %s (unpacked into %s, not installed)", version, pkg, dir)
	cmd := exec.Command("apt-get", "download", pkg)
	cmd.Dir = work
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("apt-get download %s: %v\n%s", pkg, err, out)
	}
	debs, _ := filepath.Glob(filepath.Join(work, "*.deb"))
	if len(debs) != 1 {
		t.Fatalf("apt-get download %s left %v", pkg, debs)
	}
	root := filepath.Join(work, "root")
	if out, err := exec.Command("dpkg-deb", "-x", debs[0], root).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb -x %s: %v\n%s", debs[0], err, out)
	}
	stage := filepath.Join(work, "cache")
	if err := os.MkdirAll(filepath.Join(stage, "modules"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := copyFile(filepath.Join(root, "boot", "vmlinuz-"+version), filepath.Join(stage, "vmlinuz")); err != nil {
		t.Fatal(err)
	}
	_ = copyFile(filepath.Join(root, "boot", "config-"+version), filepath.Join(stage, "config"))
	// Keep the modules the guest may want (drivers, filesystems, libraries,
	// crypto): the whole tree is hundreds of megabytes.
	kdir := filepath.Join(root, "lib", "modules", version, "kernel")
	order, err := resolve(kdir, Modules)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range order {
		if err := copyFile(m.path, filepath.Join(stage, "modules", m.name+".ko")); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(stage, "modules", "load"), []byte(names(order)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_ = os.RemoveAll(dir)
	if err := os.Rename(stage, dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "complete"), []byte(filepath.Base(debs[0])+"\n"+stamp), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Uncompressed returns kdir/vmlinux, the ELF kernel inside vmlinuz (made once
// and cached). QEMU boots it through its PVH entry point: under TCG this
// saves the seconds the guest spends decompressing itself.
func Uncompressed(kdir string) (string, error) {
	out := filepath.Join(kdir, "vmlinux")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	if b, _ := os.ReadFile(filepath.Join(kdir, "config")); !bytes.Contains(b, []byte("\nCONFIG_PVH=y\n")) || !bytes.Contains(b, []byte("\nCONFIG_KERNEL_XZ=y\n")) {
		return "", fmt.Errorf("the kernel is not built with CONFIG_PVH and CONFIG_KERNEL_XZ")
	}
	img, err := os.ReadFile(filepath.Join(kdir, "vmlinuz"))
	if err != nil {
		return "", err
	}
	i := bytes.Index(img, []byte("\xfd7zXZ\x00"))
	if i < 0 {
		return "", fmt.Errorf("no xz stream in vmlinuz")
	}
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp)
	cmd := exec.Command("xz", "-dc", "--single-stream")
	cmd.Stdin = bytes.NewReader(img[i:])
	cmd.Stdout = f
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", fmt.Errorf("xz -d the kernel: %w: %s", err, stderr.String())
	}
	e, err := elf.Open(tmp)
	if err != nil {
		return "", fmt.Errorf("vmlinux: %w", err)
	}
	_ = e.Close() // opened only to check it is ELF
	return out, os.Rename(tmp, out)
}

type module struct {
	name string
	path string
}

func names(ms []module) string {
	var s []string
	for _, m := range ms {
		s = append(s, m.name)
	}
	return strings.Join(s, " ")
}

// resolve orders want and their dependencies (depends= of each module's
// .modinfo, as depmod reads them) so that each comes after what it needs.
// A module that is built in (absent from the tree) is skipped.
func resolve(kdir string, want []string) ([]module, error) {
	index := map[string]string{}
	err := filepath.WalkDir(kdir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if n, ok := strings.CutSuffix(d.Name(), ".ko"); ok {
			index[strings.ReplaceAll(n, "-", "_")] = p
		}
		if strings.HasSuffix(d.Name(), ".ko.xz") || strings.HasSuffix(d.Name(), ".ko.zst") {
			return fmt.Errorf("%s: compressed modules are not supported by this test's initramfs builder", p)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	var order []module
	seen := map[string]bool{}
	var visit func(name string, chain []string) error
	visit = func(name string, chain []string) error {
		name = strings.ReplaceAll(name, "-", "_")
		if seen[name] {
			return nil
		}
		if slices.Contains(chain, name) {
			return fmt.Errorf("module dependency cycle: %v", append(chain, name))
		}
		p, ok := index[name]
		if !ok {
			return nil // built in
		}
		deps, err := depends(p)
		if err != nil {
			return err
		}
		for _, d := range deps {
			if err := visit(d, append(chain, name)); err != nil {
				return err
			}
		}
		seen[name] = true
		order = append(order, module{name, p})
		return nil
	}
	for _, w := range want {
		if _, ok := index[w]; !ok {
			continue
		}
		if err := visit(w, nil); err != nil {
			return nil, err
		}
	}
	return order, nil
}

func depends(ko string) ([]string, error) {
	f, err := elf.Open(ko)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }() // read only
	s := f.Section(".modinfo")
	if s == nil {
		return nil, fmt.Errorf("%s has no .modinfo", ko)
	}
	b, err := s.Data()
	if err != nil {
		return nil, err
	}
	for _, kv := range bytes.Split(b, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("depends=")); ok {
			var out []string
			for _, d := range strings.Split(string(v), ",") {
				if d != "" {
					out = append(out, d)
				}
			}
			return out, nil
		}
	}
	return nil, nil
}

// copyFile copies a file of the unpacked package into the cache, both opened
// beneath their directories.
func copyFile(src, dst string) error {
	b, err := readIn(filepath.Dir(src), filepath.Base(src))
	if err != nil {
		return err
	}
	r, err := os.OpenRoot(filepath.Dir(dst))
	if err != nil {
		return err
	}
	defer func() { _ = r.Close() }() // a directory handle
	return r.WriteFile(filepath.Base(dst), b, 0o644)
}

func readIn(dir, name string) ([]byte, error) {
	r, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	defer func() { _ = r.Close() }() // a directory handle
	return r.ReadFile(name)
}

// Prepare returns a guest: the cached kernel and an initramfs built now in
// dir (busybox-static, the modules, the agent as /init).
func Prepare(t testing.TB, dir string) *Guest {
	t.Helper()
	return PrepareWith(t, dir, Options{})
}

// PrepareWith is Prepare with more in the initramfs.
func PrepareWith(t testing.TB, dir string, o Options) *Guest {
	t.Helper()
	EnsurePackage(t, "busybox", "busybox-static")
	version, err := KernelVersion()
	if err != nil {
		t.Fatal(err)
	}
	kdir := Kernel(t, version)
	g := &Guest{Version: version, Kernel: filepath.Join(kdir, "vmlinuz"), Initramfs: filepath.Join(dir, "initramfs.gz")}
	if vmlinux, err := Uncompressed(kdir); err == nil {
		g.Kernel = vmlinux
	} else {
		t.Logf("booting the compressed kernel (slower under TCG): %v", err)
	}
	// Only the modules of the filesystems this guest mounts: xfs alone is
	// 2 MiB that every boot unpacks.
	mdir := filepath.Join(kdir, "modules")
	filesystems := append(slices.Clone(Filesystems), o.Filesystems...)
	all, err := resolve(mdir, append(slices.Clone(BootModules), filesystems...))
	if err != nil {
		t.Fatal(err)
	}
	g.Modules = strings.Fields(names(all))

	agent := filepath.Join(dir, "agent")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", agent, "github.com/podvol/podvol/test/microvm/guest/agent")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the guest agent: %v\n%s", err, out)
	}
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Fatal(err)
	}
	if out, _ := exec.Command("file", "-L", bb).Output(); len(out) > 0 && !bytes.Contains(out, []byte("statically linked")) && !bytes.Contains(out, []byte("static-pie")) {
		t.Fatalf("%s is not static (%s): install busybox-static", bb, bytes.TrimSpace(out))
	}

	var c cpio
	for _, d := range []string{"bin", "dev", "proc", "sys", "run", "tmp", "lib", "lib/modules"} {
		c.dir(d, 0o755)
	}
	c.node("dev/console", 0o600|syscall.S_IFCHR, 5, 1)
	c.node("dev/null", 0o666|syscall.S_IFCHR, 1, 3)
	if err := c.file("init", agent, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := c.file("bin/busybox", bb, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"sh", "ls", "cat", "dd", "id", "stat", "sync", "df", "mkdir", "echo", "head", "sha256sum", "rm", "touch", "grep", "yes", "wc", "blockdev", "cmp"} {
		c.symlink("bin/"+a, "busybox")
	}
	for _, m := range g.Modules {
		if err := c.file("lib/modules/"+m+".ko", filepath.Join(kdir, "modules", m+".ko"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.binaries(o.Binaries); err != nil {
		t.Fatal(err)
	}
	// What to load at boot, and per filesystem what to add at its mount.
	boot, err := resolve(mdir, BootModules)
	if err != nil {
		t.Fatal(err)
	}
	c.data("lib/modules/load", []byte(names(boot)+"\n"), 0o644)
	for _, fs := range filesystems {
		all, err := resolve(mdir, append(slices.Clone(BootModules), fs))
		if err != nil {
			t.Fatal(err)
		}
		more := slices.DeleteFunc(all, func(m module) bool {
			return slices.ContainsFunc(boot, func(b module) bool { return b.name == m.name })
		})
		c.data("lib/modules/load."+fs, []byte(names(more)+"\n"), 0o644)
	}
	if err := c.write(g.Initramfs); err != nil {
		t.Fatal(err)
	}
	return g
}

// cpio is an initramfs in the "newc" format the kernel unpacks.
type cpio struct {
	buf bytes.Buffer
	ino uint32
}

func (c *cpio) header(name string, mode uint32, size int, target []byte, major, minor uint32) {
	c.ino++
	fmt.Fprintf(&c.buf, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, 1, 0, size, 0, 0, major, minor, len(name)+1, 0)
	c.buf.WriteString(name)
	c.buf.WriteByte(0)
	c.pad()
	c.buf.Write(target)
	c.pad()
}

func (c *cpio) pad() {
	for c.buf.Len()%4 != 0 {
		c.buf.WriteByte(0)
	}
}

func (c *cpio) dir(name string, perm uint32) { c.header(name, syscall.S_IFDIR|perm, 0, nil, 0, 0) }
func (c *cpio) node(name string, mode, major, minor uint32) {
	c.header(name, mode, 0, nil, major, minor)
}
func (c *cpio) symlink(name, target string) {
	c.header(name, syscall.S_IFLNK|0o777, len(target), []byte(target), 0, 0)
}
func (c *cpio) data(name string, b []byte, perm uint32) {
	c.header(name, syscall.S_IFREG|perm, len(b), b, 0, 0)
}
func (c *cpio) file(name, src string, perm uint32) error {
	b, err := readIn(filepath.Dir(src), filepath.Base(src))
	if err != nil {
		return err
	}
	c.data(name, b, perm)
	return nil
}

// binaries adds each program and the shared libraries ldd lists for it,
// each at its host path, with the directories above them.
func (c *cpio) binaries(progs []string) error {
	seen := map[string]bool{"/bin": true, "/lib": true, "/lib/modules": true} // made by Prepare
	add := func(p string) error {
		if seen[p] {
			return nil
		}
		seen[p] = true
		var dirs []string
		for d := filepath.Dir(p); d != "/" && !seen[d]; d = filepath.Dir(d) {
			seen[d] = true
			dirs = append(dirs, d)
		}
		for i := len(dirs) - 1; i >= 0; i-- { // parents first
			c.dir(strings.TrimPrefix(dirs[i], "/"), 0o755)
		}
		resolved, err := filepath.EvalSymlinks(p)
		if err != nil {
			return err
		}
		return c.file(strings.TrimPrefix(p, "/"), resolved, 0o755)
	}
	for _, prog := range progs {
		out, err := exec.Command("ldd", prog).Output()
		if err != nil {
			return fmt.Errorf("ldd %s: %w", prog, err)
		}
		libs := []string{prog}
		for _, l := range strings.Split(string(out), "\n") {
			for _, f := range strings.Fields(l) {
				if strings.HasPrefix(f, "/") {
					libs = append(libs, f)
				}
			}
		}
		for _, l := range libs {
			if err := add(l); err != nil {
				return err
			}
		}
	}
	return nil
}

func (c *cpio) write(path string) error {
	c.header("TRAILER!!!", 0, 0, nil, 0, 0)
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	zw, _ := gzip.NewWriterLevel(f, gzip.BestSpeed)
	if _, err := zw.Write(c.buf.Bytes()); err != nil {
		f.Close()
		return err
	}
	if err := zw.Close(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
