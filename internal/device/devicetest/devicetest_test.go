package devicetest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/podvol/podvol/internal/device"
)

func TestFakeConformance(t *testing.T) {
	f := New()
	Conformance(t, f, func(t *testing.T) string {
		dir := t.TempDir()
		f.RefuseDirectIO(dir)
		return dir
	})
}

// The controls below have no kernel counterpart, so Conformance does not
// cover them.

func setup(t *testing.T, f *Fake, fsType string) (img, dev, mnt string) {
	t.Helper()
	dir := t.TempDir()
	img = filepath.Join(dir, "img")
	must(t, os.WriteFile(img, nil, 0o600))
	must(t, os.Truncate(img, 300<<20))
	dev, err := f.AttachLoop(img, device.LoopOptions{})
	must(t, err)
	must(t, f.Format(context.Background(), dev, fsType))
	mnt = filepath.Join(dir, "mnt")
	must(t, os.Mkdir(mnt, 0o755))
	must(t, f.Mount(context.Background(), dev, mnt, fsType, nil))
	return img, dev, mnt
}

func TestInjectAndCalls(t *testing.T) {
	f := New()
	boom := errors.New("boom")
	f.FailNext(AttachLoop, boom)
	img := filepath.Join(t.TempDir(), "img")
	must(t, os.WriteFile(img, make([]byte, 4096), 0o600))
	if _, err := f.AttachLoop(img, device.LoopOptions{}); !errors.Is(err, boom) {
		t.Fatalf("first attach: %v, want the injected error", err)
	}
	dev, err := f.AttachLoop(img, device.LoopOptions{})
	if err != nil {
		t.Fatalf("FailNext failed more than once: %v", err)
	}
	f.Inject(Unmount, func(target string) error {
		if filepath.Base(target) == "stuck" {
			return unix.EBUSY
		}
		return nil
	})
	if err := f.Unmount("/x/stuck"); !errors.Is(err, unix.EBUSY) {
		t.Fatalf("Unmount(stuck): %v", err)
	}
	if err := f.Unmount("/x/free"); err != nil {
		t.Fatalf("Unmount(free): %v", err)
	}
	if got := f.Calls(AttachLoop); got != 2 {
		t.Fatalf("Calls(AttachLoop) = %d, want 2", got)
	}
	must(t, f.DetachLoop(dev, img))
	if left := f.Leftovers(); len(left) != 0 {
		t.Fatalf("leftovers: %v", left)
	}
}

func TestRebootForgetsKernelState(t *testing.T) {
	f := New()
	img, dev, mnt := setup(t, f, "ext4")
	h, err := f.OpenFilesystemOn(mnt, dev)
	must(t, err)
	must(t, h.Freeze())
	f.Reboot()
	if left := f.Leftovers(); len(left) != 0 {
		t.Fatalf("after a reboot: %v", left)
	}
	if err := h.Thaw(); err == nil {
		t.Fatal("a handle from before the reboot still works")
	}
	// The image and its filesystem are data: they survive.
	if sig, err := ReadSignature(img); err != nil || sig == nil || sig.Type != "ext4" {
		t.Fatalf("signature after reboot: %+v, %v", sig, err)
	}
}

func TestFreezeLogAndCopyConsistency(t *testing.T) {
	f := New()
	img, dev, mnt := setup(t, f, "xfs")
	dst := filepath.Join(filepath.Dir(img), "copy")
	must(t, f.CopyImage(img, dst, 0, false))
	h, err := f.OpenFilesystemOn(mnt, dev)
	must(t, err)
	must(t, h.Freeze())
	if !f.Frozen(dev) {
		t.Fatal("not frozen")
	}
	if err := f.SetGroup(mnt, 1000, false); !errors.Is(err, ErrWouldBlock) {
		t.Fatalf("SetGroup on a frozen filesystem: %v", err)
	}
	must(t, f.CopyImage(img, dst+"2", 0, false))
	must(t, h.Thaw())
	must(t, h.Close())
	log := f.FreezeLog()
	if len(log) != 2 || log[0].Thaw || !log[1].Thaw || log[0].Handle != log[1].Handle || log[0].Dev != dev {
		t.Fatalf("freeze log: %+v", log)
	}
	cs := f.Copies()
	if len(cs) != 2 || cs[0].Consistent || !cs[1].Consistent {
		t.Fatalf("copies: %+v; want the unfrozen one inconsistent, the frozen one consistent", cs)
	}
	if sig, _ := ReadSignature(dst); sig == nil || sig.Type != "xfs" {
		t.Fatalf("copy holds %+v", sig)
	}
}

func TestUnmountRefusesAMountWithOneBeneath(t *testing.T) {
	f := New()
	_, _, mnt := setup(t, f, "ext4")
	sub := filepath.Join(mnt, "sub")
	must(t, os.Mkdir(sub, 0o755))
	must(t, f.Mount(context.Background(), mnt, sub, "", []string{"bind"}))
	if err := f.Unmount(mnt); !errors.Is(err, unix.EBUSY) {
		t.Fatalf("Unmount with a mount beneath: %v", err)
	}
	must(t, f.Unmount(sub))
	must(t, f.Unmount(mnt))
}

func TestHealthFaults(t *testing.T) {
	f := New()
	_, dev, mnt := setup(t, f, "ext4")
	must(t, f.SetErrors(dev, 3, "ext4_lookup"))
	if n, fn := f.Ext4Errors(dev); n != 3 || fn != "ext4_lookup" {
		t.Fatalf("Ext4Errors: %d %q", n, fn)
	}
	if m, _ := f.MountedAt(mnt); m == nil || !m.ReadOnly() {
		t.Fatalf("errors=remount-ro not shown: %+v", m)
	}
	must(t, f.SetShutdown(dev))
	if err := f.ReadableRoot(mnt); !errors.Is(err, unix.EIO) {
		t.Fatalf("ReadableRoot of a shut-down filesystem: %v", err)
	}
	if !slices.Contains(f.Leftovers(), "mount of "+dev+" at "+mnt) {
		t.Fatalf("leftovers: %v", f.Leftovers())
	}
}
