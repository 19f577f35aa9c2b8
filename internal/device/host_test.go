package device_test

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/podvol/podvol/internal/device"
	"github.com/podvol/podvol/internal/device/devicetest"
)

// TestHostConformance runs the checks the fake passes against the real
// machine: what the unit tests above this package learn from the fake holds
// for the kernel.
func TestHostConformance(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the host's conformance needs real loop devices and mounts: run it as root")
	}
	devicetest.Conformance(t, device.Host{}, ramfs)
}

// ramfs mounts a ramfs, a filesystem that refuses direct I/O (O_DIRECT
// opens fail with EINVAL), for the length of the test. tmpfs would not do:
// it takes direct I/O since Linux 6.6.
func ramfs(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("podvol-test", dir, "ramfs", 0, "mode=0700"); err != nil {
		t.Fatalf("mount ramfs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmount ramfs %s: %v", dir, err)
		}
	})
	return dir
}
