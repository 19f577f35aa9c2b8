package e2e

import (
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// scratch is a filesystem on a loop device that the host mounted before
// the dev cluster's nodes were made, as another test's volume is when make
// test brings the cluster up beside the host's tests.
type scratch struct{ dir, dev, img string }

var hostMount *scratch

// mountScratch mounts a small ext4 image on a loop device; nil if it cannot
// (TestNodesLetGoOfHostMounts then says so).
func mountScratch() *scratch {
	dir, err := os.MkdirTemp("", "podvol-e2e-hostmount-")
	if err != nil {
		return nil
	}
	s := &scratch{dir: dir, img: filepath.Join(dir, "img")}
	run := func(args ...string) (string, error) {
		out, err := osexec.Command(args[0], args[1:]...).CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	if err := os.MkdirAll(filepath.Join(dir, "mnt"), 0o755); err != nil {
		return nil
	}
	if _, err := run("truncate", "-s", "64M", s.img); err != nil {
		return nil
	}
	if _, err := run("mkfs.ext4", "-q", s.img); err != nil {
		return nil
	}
	if s.dev, err = run("losetup", "--find", "--show", s.img); err != nil {
		s.dev = ""
		s.remove()
		return nil
	}
	if _, err := run("mount", s.dev, filepath.Join(dir, "mnt")); err != nil {
		s.remove()
		return nil
	}
	return s
}

// unmount unmounts it on the host and asks for its loop device to go; it
// returns whether the device went within timeout: it cannot while a
// node's mount namespace still holds a copy of the mount.
func (s *scratch) unmount(timeout time.Duration) (bool, error) {
	if out, err := osexec.Command("umount", filepath.Join(s.dir, "mnt")).CombinedOutput(); err != nil {
		return false, fmt.Errorf("umount: %w: %s", err, out)
	}
	_ = osexec.Command("losetup", "-d", s.dev).Run()
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if !s.attached() {
			return true, nil
		}
	}
	return false, nil
}

func (s *scratch) attached() bool {
	b, err := os.ReadFile("/sys/block/" + filepath.Base(s.dev) + "/loop/backing_file")
	return err == nil && strings.TrimSpace(string(b)) == s.img
}

// remove undoes mountScratch, whatever is left of it.
func (s *scratch) remove() {
	if s == nil {
		return
	}
	_ = osexec.Command("umount", "-l", filepath.Join(s.dir, "mnt")).Run()
	if s.dev != "" && s.attached() {
		_ = osexec.Command("losetup", "-d", s.dev).Run()
	}
	_ = os.RemoveAll(s.dir)
}

// testNodesLetGoOfHostMounts: a node's mount namespace starts as a copy of
// the host's, and a private copy never sees the host unmount: a mount the
// host had when the node was made must not stay alive in it (make test
// failed so: a test/plugin volume's loop device, mounted while make
// conformance brought its cluster up, could not detach).
func testNodesLetGoOfHostMounts(t *testing.T) {
	if hostMount == nil {
		t.Skip("the dev cluster was up before this run (or the scratch mount could not be made): no host mount predates its nodes")
	}
	gone, err := hostMount.unmount(15 * time.Second)
	must(t, "unmount the scratch filesystem", err)
	if !gone {
		t.Fatalf("%s (%s) is still attached 15 s after the host unmounted it: a dev cluster node's mount namespace holds a copy of the mount", hostMount.dev, hostMount.img)
	}
}
