package devicetest

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/podvol/podvol/internal/device"
)

// Conformance checks of filesystems: sector sizes, mkfs, probe, mount and
// statfs, growth, duplicate xfs UUIDs.

// A filesystem made for smaller sectors than the pool's block size
// (xfs made by podvol before it chose block sizes: 512-byte sectors)
// still mounts: the device takes its sector size. One made now has
// the pool's.
func checkFilesystemKeepsItsSectorSize(t *testing.T, c *conf) {
	m := c.m
	ctx := context.Background()
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
}

func checkFormatProbeMountStatfs(t *testing.T, c *conf) {
	m := c.m
	ctx := context.Background()
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
}

func checkGrowImageDeviceFilesystem(t *testing.T, c *conf) {
	m := c.m
	ctx := context.Background()
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
}

func checkXFSDuplicateUUID(t *testing.T, c *conf) {
	m := c.m
	ctx := context.Background()
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
}
