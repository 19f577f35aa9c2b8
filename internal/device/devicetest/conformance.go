package devicetest

import (
	"context"
	"os"
	"path/filepath"
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
	c := &conf{t: t, m: m, refusingDir: refusingDir}
	for _, check := range []struct {
		name string
		run  func(*testing.T, *conf)
	}{
		{"LoopDirectIOAndBlockSize", checkLoopDirectIOAndBlockSize},
		{"DirectIORefusedAttachesBuffered", checkDirectIORefusedAttachesBuffered},
		{"FilesystemKeepsItsSectorSize", checkFilesystemKeepsItsSectorSize},
		{"LoopAttachListDetach", checkLoopAttachListDetach},
		{"FreedNumberIsReused", checkFreedNumberIsReused},
		{"AttachRefusesSymlink", checkAttachRefusesSymlink},
		{"DeletedImageIsListedSo", checkDeletedImageIsListedSo},
		{"TagOutlivesTheImage", checkTagOutlivesTheImage},
		{"FormatProbeMountStatfs", checkFormatProbeMountStatfs},
		{"BindMountsAndStacking", checkBindMountsAndStacking},
		{"BlockBind", checkBlockBind},
		{"DetachWhileMounted", checkDetachWhileMounted},
		{"FreezeThroughOneHandle", checkFreezeThroughOneHandle},
		{"FrozenOutlivesItsHandleAndMount", checkFrozenOutlivesItsHandleAndMount},
		{"GrowImageDeviceFilesystem", checkGrowImageDeviceFilesystem},
		{"XFSDuplicateUUID", checkXFSDuplicateUUID},
	} {
		t.Run(check.name, func(t *testing.T) { check.run(t, c.sub(t)) })
	}
}

type conf struct {
	t *testing.T
	m device.Interface
	// refusingDir returns a directory on a filesystem that refuses direct
	// I/O (see Conformance).
	refusingDir func(t *testing.T) string
}

func (c *conf) sub(t *testing.T) *conf { return &conf{t: t, m: c.m, refusingDir: c.refusingDir} }

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
