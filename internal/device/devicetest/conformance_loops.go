package devicetest

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/podvol/podvol/internal/device"
)

// Conformance checks of loop devices: direct I/O and block sizes, attach,
// list and detach, numbers, symlinks, deleted images.

func checkLoopDirectIOAndBlockSize(t *testing.T, c *conf) {
	m := c.m
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
}

func checkDirectIORefusedAttachesBuffered(t *testing.T, c *conf) {
	m := c.m
	img := filepath.Join(c.refusingDir(t), "img")
	f, err := os.Create(img)
	must(t, err)
	must(t, f.Truncate(32<<20))
	must(t, f.Close())
	dev := c.attachWith(img, device.LoopOptions{DirectIO: true})
	if got, err := m.LoopStatus(dev); err != nil || got.DirectIO {
		t.Fatalf("on a filesystem that refuses direct I/O: LoopStatus %+v, %v; want buffered", got, err)
	}
	must(t, m.DetachLoop(dev, img))
}

func checkLoopAttachListDetach(t *testing.T, c *conf) {
	m := c.m
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
}

func checkFreedNumberIsReused(t *testing.T, c *conf) {
	m := c.m
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
}

func checkAttachRefusesSymlink(t *testing.T, c *conf) {
	m := c.m
	img := c.image(1 << 20)
	link := filepath.Join(filepath.Dir(img), "link")
	must(t, os.Symlink(img, link))
	if dev, err := m.AttachLoop(link, device.LoopOptions{}); err == nil {
		_ = m.DetachLoop(dev, img)
		t.Fatal("attached through a symlink")
	}
}

func checkDeletedImageIsListedSo(t *testing.T, c *conf) {
	m := c.m
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
}

// A device's tag is what it was attached with, as long as it is attached,
// whatever happens to its backing file; a device attached without one (as
// by losetup) is named by its image's path.
func checkTagOutlivesTheImage(t *testing.T, c *conf) {
	m := c.m
	img, plain := c.image(1<<20), c.image(1<<20)
	tag := strings.Repeat("t", device.LoopTagMax-len("podvol ")) + "podvol "
	dev := c.attachWith(img, device.LoopOptions{Tag: tag})
	other := c.attach(plain)
	if got := m.LoopTag(dev); got != tag {
		t.Fatalf("tag of %s: %q, want %q", dev, got, tag)
	}
	if got := m.LoopTag(other); got != plain[:min(len(plain), device.LoopTagMax)] {
		t.Fatalf("tag of %s, attached without one: %q, want its image's path %q (cut to %d bytes)", other, got, plain, device.LoopTagMax)
	}
	must(t, os.Remove(img))
	if got := m.LoopTag(dev); got != tag {
		t.Fatalf("tag of %s once its image was deleted: %q, want %q", dev, got, tag)
	}
	if _, err := m.AttachLoop(plain, device.LoopOptions{Tag: tag + "x"}); err == nil {
		t.Fatalf("attached with a tag of %d bytes, over the %d the kernel keeps", len(tag)+1, device.LoopTagMax)
	}
	must(t, m.DetachLoop(dev, img+" (deleted)"))
	if got := m.LoopTag(dev); got != "" {
		t.Fatalf("a detached device keeps the tag %q", got)
	}
}

func checkDetachWhileMounted(t *testing.T, c *conf) {
	m := c.m
	ctx := context.Background()
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
}
