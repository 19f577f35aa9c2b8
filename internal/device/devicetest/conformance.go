package devicetest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/podvol/podvol/internal/device"
)

// Conformance checks that m behaves as the kernel does in everything the
// packages above rely on, the way testing/fstest.TestFS checks an fs.FS. It
// runs against the Fake in this package's tests, and against device.Host
// (real loop devices, mkfs and mounts: root) in internal/device's, so that
// the fake is shown to be faithful wherever it is tested here. Everything it
// makes lives under t.TempDir() and is undone when it ends.
//
// refusingDir returns a directory on a filesystem that refuses direct I/O
// (for the host: a ramfs mount, undone at the test's end).
func Conformance(t *testing.T, m device.Interface, refusingDir func(t *testing.T) string) {
	ctx := context.Background()
	c := &conf{t: t, m: m}

	t.Run("LoopDirectIOAndBlockSize", func(t *testing.T) {
		c := c.sub(t)
		img := c.image(32 << 20)
		pool := device.PoolBlockSize(img)
		for _, tc := range []struct {
			opts device.LoopOptions
			want device.LoopIO
		}{
			{device.LoopOptions{DirectIO: true}, device.LoopIO{DirectIO: true, BlockSize: pool}},
			{device.LoopOptions{}, device.LoopIO{BlockSize: pool}},
			{device.LoopOptions{BlockSize: 512}, device.LoopIO{BlockSize: 512}},
			{device.LoopOptions{DirectIO: true, BlockSize: 4096}, device.LoopIO{DirectIO: true, BlockSize: 4096}},
		} {
			dev := c.attachWith(img, tc.opts)
			if got, err := m.LoopStatus(dev); err != nil || got != tc.want {
				t.Errorf("attached with %+v: LoopStatus %+v, %v; want %+v", tc.opts, got, err, tc.want)
			}
			if size, err := m.DeviceSize(dev); err != nil || size != 32<<20 {
				t.Errorf("attached with %+v: DeviceSize %d, %v", tc.opts, size, err)
			}
			must(t, m.DetachLoop(dev, img))
		}
		if dev, err := m.AttachLoop(img, device.LoopOptions{BlockSize: 1000}); err == nil {
			_ = m.DetachLoop(dev, img)
			t.Fatal("attached with a logical block size of 1000")
		}
		if _, err := m.LoopStatus("/dev/loop99999"); err == nil {
			t.Fatal("LoopStatus of a device that does not exist")
		}
	})

	t.Run("DirectIORefusedAttachesBuffered", func(t *testing.T) {
		c := c.sub(t)
		img := filepath.Join(refusingDir(t), "img")
		f, err := os.Create(img)
		must(t, err)
		must(t, f.Truncate(32<<20))
		must(t, f.Close())
		dev := c.attachWith(img, device.LoopOptions{DirectIO: true})
		if got, err := m.LoopStatus(dev); err != nil || got.DirectIO {
			t.Fatalf("on a filesystem that refuses direct I/O: LoopStatus %+v, %v; want buffered", got, err)
		}
		must(t, m.DetachLoop(dev, img))
	})

	// A filesystem made for smaller sectors than the pool's block size
	// (xfs made by podvol before it chose block sizes: 512-byte sectors)
	// still mounts: the device takes its sector size. One made now has
	// the pool's.
	t.Run("FilesystemKeepsItsSectorSize", func(t *testing.T) {
		c := c.sub(t)
		old := c.image(300 << 20)
		pool := device.PoolBlockSize(old)
		dev := c.attachWith(old, device.LoopOptions{BlockSize: 512})
		must(t, m.Format(ctx, dev, "xfs"))
		must(t, m.DetachLoop(dev, old))
		dev = c.attachWith(old, device.LoopOptions{DirectIO: true})
		if got, err := m.LoopStatus(dev); err != nil || got.BlockSize != 512 || !got.DirectIO {
			t.Fatalf("xfs with 512-byte sectors attached as %+v, %v; want 512-byte blocks, direct I/O", got, err)
		}
		mnt := c.dir("old")
		c.mount(dev, mnt, "xfs")
		must(t, m.Unmount(mnt))
		must(t, m.DetachLoop(dev, old))
		if pool > 512 {
			dev = c.attachWith(old, device.LoopOptions{BlockSize: pool})
			if err := m.Mount(ctx, dev, mnt, "xfs", nil); err == nil {
				_ = m.Unmount(mnt)
				t.Fatalf("xfs with 512-byte sectors mounted on a device of %d-byte blocks", pool)
			}
			must(t, m.DetachLoop(dev, old))
		}
		for _, fs := range []string{"xfs", "ext4"} {
			img := c.image(300 << 20)
			must(t, m.Format(ctx, img, fs))
			dev := c.attachWith(img, device.LoopOptions{DirectIO: true})
			if got, err := m.LoopStatus(dev); err != nil || got.BlockSize != pool || !got.DirectIO {
				t.Fatalf("new %s attached as %+v, %v; want the pool's %d-byte blocks, direct I/O", fs, got, err, pool)
			}
			mnt := c.dir("new-" + fs)
			c.mount(dev, mnt, fs)
			must(t, m.Unmount(mnt))
			must(t, m.DetachLoop(dev, img))
		}
	})

	t.Run("LoopAttachListDetach", func(t *testing.T) {
		c := c.sub(t)
		img := c.image(32 << 20)
		dev := c.attach(img)
		if got := m.LoopBackingFile(dev); got != img {
			t.Fatalf("backing file of %s: %q, want %q", dev, got, img)
		}
		if devs, err := m.LoopsFor(img); err != nil || !slices.Equal(devs, []string{dev}) {
			t.Fatalf("LoopsFor: %v, %v", devs, err)
		}
		if all, err := m.LoopDevices(); err != nil || all[dev] != img {
			t.Fatalf("LoopDevices()[%s] = %q, %v", dev, all[dev], err)
		}
		if size, err := m.DeviceSize(dev); err != nil || size != 32<<20 {
			t.Fatalf("DeviceSize: %d, %v", size, err)
		}
		// A number listed with another file serves someone else now.
		if err := m.DetachLoop(dev, img+".other"); err != nil || m.LoopBackingFile(dev) != img {
			t.Fatalf("detach listed with another file: %v; backing now %q", err, m.LoopBackingFile(dev))
		}
		must(t, m.DetachLoop(dev, img))
		if err := m.DetachLoop(dev, img); err != nil {
			t.Fatalf("detaching twice: %v", err)
		}
		if devs, _ := m.LoopsFor(img); len(devs) != 0 {
			t.Fatalf("still attached: %v", devs)
		}
		if got := m.LoopBackingFile(dev); got != "" {
			t.Fatalf("a detached device serves %q", got)
		}
	})

	t.Run("FreedNumberIsReused", func(t *testing.T) {
		c := c.sub(t)
		a, b, d := c.image(1<<20), c.image(1<<20), c.image(1<<20)
		devA := c.attach(a)
		devB := c.attach(b)
		if devA == devB {
			t.Fatalf("two images on one device %s", devA)
		}
		must(t, m.DetachLoop(devA, a))
		devD := c.attach(d)
		// The lowest free number is handed out next: the one just freed,
		// unless an even lower one was freed meanwhile by someone else.
		if number(devD) > number(devA) {
			t.Fatalf("after freeing %s the next device is %s", devA, devD)
		}
	})

	t.Run("AttachRefusesSymlink", func(t *testing.T) {
		c := c.sub(t)
		img := c.image(1 << 20)
		link := filepath.Join(filepath.Dir(img), "link")
		must(t, os.Symlink(img, link))
		if dev, err := m.AttachLoop(link, device.LoopOptions{}); err == nil {
			_ = m.DetachLoop(dev, img)
			t.Fatal("attached through a symlink")
		}
	})

	t.Run("DeletedImageIsListedSo", func(t *testing.T) {
		c := c.sub(t)
		img := c.image(1 << 20)
		dev := c.attach(img)
		must(t, os.Remove(img))
		if got := m.LoopBackingFile(dev); got != img+" (deleted)" {
			t.Fatalf("backing file of a deleted image: %q", got)
		}
		if devs, _ := m.LoopsFor(img); len(devs) != 0 {
			t.Fatalf("LoopsFor a deleted image: %v", devs)
		}
		must(t, m.DetachLoop(dev, img+" (deleted)"))
	})

	t.Run("FormatProbeMountStatfs", func(t *testing.T) {
		c := c.sub(t)
		img := c.image(64 << 20)
		dev := c.attach(img)
		if got, err := m.Probe(ctx, dev); err != nil || got != "" {
			t.Fatalf("blank device probed as %q, %v", got, err)
		}
		must(t, m.Format(ctx, dev, "ext4"))
		if got, err := m.Probe(ctx, dev); err != nil || got != "ext4" {
			t.Fatalf("probe after format: %q, %v", got, err)
		}
		must(t, m.FsckIfNeeded(ctx, dev, "ext4"))
		mnt := c.dir("mnt")
		c.mount(dev, mnt, "ext4", "noatime")
		mt, err := m.MountedAt(mnt)
		if err != nil || mt == nil || mt.Source != dev || mt.FsType != "ext4" || mt.ReadOnly() {
			t.Fatalf("MountedAt: %+v, %v", mt, err)
		}
		if mps, _ := m.MountsOf(dev); !slices.Equal(mps, []string{mnt}) {
			t.Fatalf("MountsOf: %v", mps)
		}
		st, err := m.Statfs(mnt)
		if err != nil || st.TotalBytes <= 0 || st.TotalBytes > 64<<20 || st.TotalInodes <= 0 {
			t.Fatalf("Statfs: %+v, %v", st, err)
		}
		must(t, m.ReadableRoot(mnt))
		if err := m.Format(ctx, dev, "ext4"); err == nil {
			t.Fatal("formatted a mounted device")
		}
		if err := m.FsckIfNeeded(ctx, dev, "ext4"); err == nil {
			t.Fatal("e2fsck ran on a mounted filesystem")
		}
		// A copy carries the filesystem; blkid finds it in the file.
		cp := filepath.Join(filepath.Dir(img), "copy.img")
		must(t, m.CopyImage(img, cp, 64<<20, false))
		if got, err := m.Probe(ctx, cp); err != nil || got != "ext4" {
			t.Fatalf("probe of a copy: %q, %v", got, err)
		}
		must(t, m.Unmount(mnt))
		if err := m.Unmount(mnt); err != nil {
			t.Fatalf("unmounting twice: %v", err)
		}
		if err := m.Unmount(filepath.Join(mnt, "nowhere")); err != nil {
			t.Fatalf("unmounting a path that does not exist: %v", err)
		}
		if mt, _ := m.MountedAt(mnt); mt != nil {
			t.Fatalf("still mounted: %+v", mt)
		}
		if err := m.Mount(ctx, dev, mnt, "xfs", nil); err == nil {
			_ = m.Unmount(mnt)
			t.Fatal("mounted ext4 as xfs")
		}
	})

	t.Run("BindMountsAndStacking", func(t *testing.T) {
		c := c.sub(t)
		img := c.image(32 << 20)
		dev := c.attach(img)
		must(t, m.Format(ctx, dev, "ext4"))
		stage, target, ro := c.dir("stage"), c.dir("target"), c.dir("ro")
		c.mount(dev, stage, "ext4")
		c.mount(stage, target, "", "bind")
		c.mount(stage, ro, "", "bind", "ro")
		if mt, _ := m.MountedAt(target); mt == nil || mt.Source != dev || mt.ReadOnly() {
			t.Fatalf("bind mount: %+v", mt)
		}
		if mt, _ := m.MountedAt(ro); mt == nil || mt.Source != dev || !mt.ReadOnly() {
			t.Fatalf("read-only bind mount: %+v", mt)
		}
		if mps, _ := m.MountsOf(dev); len(mps) != 3 {
			t.Fatalf("MountsOf: %v", mps)
		}
		// The bind is the filesystem of dev, but only the staging path is
		// the root of its mount: the target is as well (a bind of the root).
		if err := m.MountedFrom(target, dev); err != nil {
			t.Fatalf("MountedFrom(bind of the root): %v", err)
		}
		sub := filepath.Join(stage, "sub")
		must(t, os.Mkdir(sub, 0o755))
		if err := m.MountedFrom(sub, dev); !errors.Is(err, device.ErrNotMounted) {
			t.Fatalf("MountedFrom(a directory inside): %v", err)
		}
		// A second bind at the same path stacks; Unmount takes both.
		c.mount(stage, target, "", "bind")
		must(t, m.Unmount(target))
		if mt, _ := m.MountedAt(target); mt != nil {
			t.Fatalf("stacked mount left: %+v", mt)
		}
		// The staging mount can go while binds of it remain: the
		// filesystem stays, and so does its device's source.
		must(t, m.Unmount(stage))
		if mps, _ := m.MountsOf(dev); !slices.Equal(mps, []string{ro}) {
			t.Fatalf("MountsOf after unmounting the stage: %v", mps)
		}
		if err := m.MountedFrom(stage, dev); !errors.Is(err, device.ErrNotMounted) {
			t.Fatalf("MountedFrom(unmounted staging path): %v", err)
		}
		// A bind of a directory on no volume is the host's filesystem.
		host := c.dir("host")
		c.mount(host, target, "", "bind")
		if mt, _ := m.MountedAt(target); mt == nil || mt.Source == dev {
			t.Fatalf("bind of a host directory: %+v", mt)
		}
		if err := m.MountedFrom(target, dev); !errors.Is(err, device.ErrNotMounted) {
			t.Fatalf("MountedFrom(a host bind): %v", err)
		}
	})

	t.Run("BlockBind", func(t *testing.T) {
		c := c.sub(t)
		img := c.image(1 << 20)
		dev := c.attach(img)
		target := filepath.Join(c.dir("pod"), "dev")
		must(t, os.WriteFile(target, nil, 0o640))
		c.mount(dev, target, "", "bind")
		mt, err := m.MountedAt(target)
		if err != nil || mt == nil || strings.TrimPrefix(mt.Root, "/") != strings.TrimPrefix(dev, "/dev/") {
			t.Fatalf("bind of %s: %+v, %v", dev, mt, err)
		}
		if mps, _ := m.MountsOf(dev); len(mps) != 0 {
			t.Fatalf("a device node's bind is not a mount of the device: %v", mps)
		}
		// Kubelet binds the published file on to a path of its own.
		mapped := filepath.Join(c.dir("map"), "pod-uid")
		must(t, os.WriteFile(mapped, nil, 0o640))
		c.mount(target, mapped, "", "bind")
		for _, p := range []string{dev, target, mapped} {
			if err := m.DeviceNodeOf(p, dev); err != nil {
				t.Fatalf("DeviceNodeOf(%s, %s): %v", p, dev, err)
			}
		}
		other := c.attach(c.image(1 << 20))
		for _, p := range []string{other, img, filepath.Dir(mapped), filepath.Join(c.dir("none"), "x")} {
			if err := m.DeviceNodeOf(p, dev); err == nil {
				t.Fatalf("DeviceNodeOf(%s, %s) = nil, want an error", p, dev)
			}
		}
	})

	t.Run("DetachWhileMounted", func(t *testing.T) {
		c := c.sub(t)
		img := c.image(32 << 20)
		dev := c.attach(img)
		must(t, m.Format(ctx, dev, "ext4"))
		mnt := c.dir("mnt")
		c.mount(dev, mnt, "ext4")
		if err := m.DetachLoop(dev, img); err == nil {
			t.Fatal("detached a device whose filesystem is mounted")
		}
		if got := m.LoopBackingFile(dev); got != img {
			t.Fatalf("a mounted device lost its image: %q", got)
		}
		// The detach asked for happens when the filesystem goes.
		must(t, m.Unmount(mnt))
		c.eventually("the device detaches once unmounted", func() bool { return m.LoopBackingFile(dev) == "" })
	})

	t.Run("FreezeThroughOneHandle", func(t *testing.T) {
		c := c.sub(t)
		img := c.image(32 << 20)
		dev := c.attach(img)
		must(t, m.Format(ctx, dev, "ext4"))
		mnt := c.dir("mnt")
		c.mount(dev, mnt, "ext4")
		inside := filepath.Join(mnt, "inside")
		must(t, os.Mkdir(inside, 0o755))
		for _, p := range []string{c.dir("elsewhere"), inside} {
			if h, err := m.OpenFilesystemOn(p, dev); !errors.Is(err, device.ErrNotMounted) {
				if h != nil {
					h.Close()
				}
				t.Fatalf("OpenFilesystemOn(%s): %v, want ErrNotMounted", p, err)
			}
		}
		h, err := m.OpenFilesystemOn(mnt, dev)
		must(t, err)
		must(t, h.Freeze())
		thawed := false
		t.Cleanup(func() {
			if !thawed {
				_ = h.Thaw()
				_ = h.Close()
			}
		})
		if err := h.Freeze(); err == nil {
			t.Fatal("froze a frozen filesystem")
		}
		// An open descriptor keeps the mount busy.
		if err := m.Unmount(mnt); err == nil {
			t.Fatal("unmounted a filesystem with a descriptor open on it")
		}
		must(t, h.Thaw())
		must(t, h.Thaw()) // thawing what is not frozen is done already
		thawed = true
		// A trim goes through the handle too; the discarded count is
		// the kernel's business (the fake reports 0).
		if n, err := h.Trim(); err != nil || n < 0 {
			t.Fatalf("trim: %d, %v", n, err)
		}
		must(t, h.Close())
		if _, err := h.Trim(); err == nil {
			t.Fatal("trimmed through a closed handle")
		}
		must(t, m.Unmount(mnt))
	})

	// A crash in the middle of a copy leaves the filesystem frozen with no
	// descriptor open: it stays frozen through an unmount, is found frozen
	// by the next mount of its device, and any handle on it thaws it.
	t.Run("FrozenOutlivesItsHandleAndMount", func(t *testing.T) {
		c := c.sub(t)
		img := c.image(32 << 20)
		dev := c.attach(img)
		must(t, m.Format(ctx, dev, "ext4"))
		mnt := c.dir("mnt")
		c.mount(dev, mnt, "ext4")
		h, err := m.OpenFilesystemOn(mnt, dev)
		must(t, err)
		must(t, h.Freeze())
		must(t, h.Close())
		t.Cleanup(func() {
			if h, err := m.OpenFilesystemOn(mnt, dev); err == nil {
				_ = h.Thaw()
				_ = h.Close()
			}
		})
		must(t, m.Unmount(mnt))
		if mps, _ := m.MountsOf(dev); len(mps) != 0 {
			t.Fatalf("MountsOf after unmount: %v", mps)
		}
		c.mount(dev, mnt, "ext4")
		h2, err := m.OpenFilesystemOn(mnt, dev)
		must(t, err)
		defer h2.Close()
		if err := h2.Freeze(); err == nil {
			t.Fatal("the filesystem mounted again was not frozen any more")
		}
		must(t, h2.Thaw())
		must(t, h2.Freeze()) // thawed: freezable again
		must(t, h2.Thaw())
	})

	t.Run("GrowImageDeviceFilesystem", func(t *testing.T) {
		c := c.sub(t)
		img := c.image(32 << 20)
		dev := c.attach(img)
		must(t, m.Format(ctx, dev, "ext4"))
		must(t, m.GrowFile(img, 48<<20))
		must(t, m.GrowFile(img, 40<<20)) // never shrinks
		if fi, _ := os.Stat(img); fi.Size() != 48<<20 {
			t.Fatalf("image is %d bytes", fi.Size())
		}
		if size, _ := m.DeviceSize(dev); size != 32<<20 {
			t.Fatalf("the device saw the growth before LOOP_SET_CAPACITY: %d", size)
		}
		must(t, m.LoopSetCapacity(dev))
		if size, _ := m.DeviceSize(dev); size != 48<<20 {
			t.Fatalf("device size after LOOP_SET_CAPACITY: %d", size)
		}
		mnt := c.dir("mnt")
		c.mount(dev, mnt, "ext4")
		before, err := m.Statfs(mnt)
		must(t, err)
		must(t, m.Unmount(mnt))
		must(t, m.GrowOffline(ctx, dev))
		c.mount(dev, mnt, "ext4")
		if st, err := m.Statfs(mnt); err != nil || st.TotalBytes < before.TotalBytes+8<<20 {
			t.Fatalf("Statfs after offline growth by 16 MiB: %+v (before %+v), %v", st, before, err)
		}
		if err := m.GrowOffline(ctx, dev); err == nil {
			t.Fatal("offline growth of a mounted filesystem")
		}
	})

	t.Run("XFSDuplicateUUID", func(t *testing.T) {
		c := c.sub(t)
		img := c.image(300 << 20)
		dev := c.attach(img)
		must(t, m.Format(ctx, dev, "xfs"))
		clone := filepath.Join(filepath.Dir(img), "clone.img")
		must(t, m.CopyImage(img, clone, 300<<20, false))
		devClone := c.attachImage(clone)
		a, b := c.dir("a"), c.dir("b")
		c.mount(dev, a, "xfs")
		if err := m.Mount(ctx, devClone, b, "xfs", nil); err == nil {
			_ = m.Unmount(b)
			t.Fatal("mounted a second xfs with the same UUID without nouuid")
		}
		c.mount(devClone, b, "xfs", "nouuid")
		before, err := m.Statfs(b)
		must(t, err)
		must(t, m.GrowFile(clone, 332<<20))
		must(t, m.LoopSetCapacity(devClone))
		must(t, m.GrowOnline(ctx, "xfs", devClone, b))
		if st, err := m.Statfs(b); err != nil || st.TotalBytes < before.TotalBytes+16<<20 {
			t.Fatalf("Statfs after online growth by 32 MiB: %+v (before %+v), %v", st, before, err)
		}
	})
}

type conf struct {
	t *testing.T
	m device.Interface
}

func (c *conf) sub(t *testing.T) *conf { return &conf{t: t, m: c.m} }

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func number(dev string) int {
	n, _ := strconv.Atoi(strings.TrimPrefix(dev, "/dev/loop"))
	return n
}

func (c *conf) image(size int64) string {
	c.t.Helper()
	dir, err := filepath.EvalSymlinks(c.t.TempDir())
	must(c.t, err)
	f, err := os.CreateTemp(dir, "img-")
	must(c.t, err)
	must(c.t, f.Truncate(size))
	must(c.t, f.Close())
	return f.Name()
}

func (c *conf) dir(name string) string {
	c.t.Helper()
	d, err := filepath.EvalSymlinks(c.t.TempDir())
	must(c.t, err)
	d = filepath.Join(d, name)
	must(c.t, os.Mkdir(d, 0o755))
	return d
}

func (c *conf) attach(img string) string { c.t.Helper(); return c.attachImage(img) }

func (c *conf) attachImage(img string) string {
	c.t.Helper()
	return c.attachWith(img, device.LoopOptions{DirectIO: true})
}

func (c *conf) attachWith(img string, opts device.LoopOptions) string {
	c.t.Helper()
	dev, err := c.m.AttachLoop(img, opts)
	must(c.t, err)
	c.t.Cleanup(func() {
		for _, b := range []string{img, img + " (deleted)"} {
			if c.m.LoopBackingFile(dev) == b {
				if err := c.m.DetachLoop(dev, b); err != nil {
					c.t.Errorf("cleanup: %v", err)
				}
			}
		}
	})
	return dev
}

func (c *conf) mount(source, target, fsType string, opts ...string) {
	c.t.Helper()
	must(c.t, c.m.Mount(context.Background(), source, target, fsType, opts))
	c.t.Cleanup(func() {
		if err := c.m.Unmount(target); err != nil {
			c.t.Errorf("cleanup: %v", err)
		}
	})
}

func (c *conf) eventually(what string, ok func() bool) {
	c.t.Helper()
	for deadline := time.Now().Add(3 * time.Second); !ok(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			c.t.Fatalf("never: %s", what)
		}
	}
}
