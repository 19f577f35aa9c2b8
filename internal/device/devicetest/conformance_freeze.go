package devicetest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/podvol/podvol/internal/device"
)

// Conformance checks of freezing: handles, and a freeze that outlives its
// handle and its mount.

func checkFreezeThroughOneHandle(t *testing.T, c *conf) {
	m := c.m
	ctx := context.Background()
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
}

// A crash in the middle of a copy leaves the filesystem frozen with no
// descriptor open: it stays frozen through an unmount, is found frozen
// by the next mount of its device, and any handle on it thaws it.
func checkFrozenOutlivesItsHandleAndMount(t *testing.T, c *conf) {
	m := c.m
	ctx := context.Background()
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
}
