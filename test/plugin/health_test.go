package plugin_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/podvol/podvol/internal/device"
	"github.com/podvol/podvol/test/plugintest"
)

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// health returns "STATUS/Reason" for each condition the node and the
// controller side report; both must agree.
func (e *env) health(id string) []string {
	e.t.Helper()
	n, err := e.p.Node().NodeGetVolumeHealth(ctx(e.t), &csi.NodeGetVolumeHealthRequest{VolumeId: id})
	e.must("NodeGetVolumeHealth", err)
	c, err := e.p.Controller().ControllerGetVolumeHealth(ctx(e.t), &csi.ControllerGetVolumeHealthRequest{VolumeId: id})
	e.must("ControllerGetVolumeHealth", err)
	var out, ctl []string
	for _, h := range n.GetVolumeHealth().GetHealthStatuses() {
		if h.GetMessage() == "" {
			e.t.Errorf("condition %s has no message", h.GetReason())
		}
		out = append(out, h.GetStatus().String()+"/"+h.GetReason())
	}
	for _, h := range c.GetVolumeHealth().GetHealthStatuses() {
		ctl = append(ctl, h.GetStatus().String()+"/"+h.GetReason())
	}
	if strings.Join(out, ",") != strings.Join(ctl, ",") {
		e.t.Fatalf("node says %v, controller says %v", out, ctl)
	}
	return out
}

func (e *env) wantHealth(id string, want ...string) {
	e.t.Helper()
	got := e.health(id)
	if strings.Join(got, ",") != strings.Join(want, ",") {
		e.t.Fatalf("health of %s: %v, want %v", id, got, want)
	}
}

func (e *env) loopOf(id string) string {
	e.t.Helper()
	img := filepath.Join(e.p.PoolDir, "volumes", id+".img")
	for _, l := range strings.Split(run(e.t, "losetup", "-j", img), "\n") {
		if dev, _, ok := strings.Cut(l, ":"); ok {
			return dev
		}
	}
	e.t.Fatalf("no loop device for %s", id)
	return ""
}

// TestHealthFaults injects each fault for real and checks what is reported.
func TestHealthFaults(t *testing.T) {
	t.Run("healthy", func(t *testing.T) {
		e := newEnv(t, defaultOpts)
		id := e.create("v", 64<<20, rwo, nil).GetVolumeId()
		e.up(id, rwo)
		e.wantHealth(id)
		e.down(id)
	})
	t.Run("image truncated", func(t *testing.T) {
		e := newEnv(t, defaultOpts)
		id := e.create("v", 64<<20, rwo, nil).GetVolumeId()
		img := filepath.Join(e.p.PoolDir, "volumes", id+".img")
		if err := os.Truncate(img, 32<<20); err != nil {
			t.Fatal(err)
		}
		e.wantHealth(id, "DATA_LOSS/ImageTruncated")
		e.must("delete", e.delete(id))
	})
	t.Run("image missing", func(t *testing.T) {
		e := newEnv(t, defaultOpts)
		id := e.create("v", 64<<20, rwo, nil).GetVolumeId()
		if err := os.Remove(filepath.Join(e.p.PoolDir, "volumes", id+".img")); err != nil {
			t.Fatal(err)
		}
		e.wantHealth(id, "DATA_LOSS/ImageMissing")
		e.must("delete", e.delete(id))
	})
	t.Run("loop device detached", func(t *testing.T) {
		e := newEnv(t, defaultOpts)
		id := e.create("v", 64<<20, blockCap(), nil).GetVolumeId()
		e.must("stage", e.stage(id, blockCap()))
		dev := e.loopOf(id)
		run(t, "losetup", "-d", dev)
		// Test packages run in parallel and the kernel hands the freed
		// number out again at once: then it serves someone else's file.
		takenBefore := device.LoopBackingFile(dev) != ""
		got := strings.Join(e.health(id), ",")
		taken := takenBefore || device.LoopBackingFile(dev) != ""
		if got != "INACCESSIBLE/LoopDeviceDetached" && (!taken || got != "INACCESSIBLE/LoopDeviceMismatch") {
			t.Fatalf("health after %s was detached: %v", dev, got)
		}
		e.must("unstage", e.unstage(id))
		e.must("delete", e.delete(id))
		e.assertClean()
	})
	t.Run("loop device serves another file", func(t *testing.T) {
		e := newEnv(t, defaultOpts)
		id := e.create("v", 64<<20, blockCap(), nil).GetVolumeId()
		e.must("stage", e.stage(id, blockCap()))
		dev := e.loopOf(id)
		run(t, "losetup", "-d", dev)
		other := filepath.Join(e.dir, "other.img")
		if err := os.WriteFile(other, make([]byte, 1<<20), 0o600); err != nil {
			t.Fatal(err)
		}
		// If another test package took the freed number first, the device
		// serves another file all the same.
		_, _ = exec.Command("losetup", dev, other).CombinedOutput()
		e.wantHealth(id, "INACCESSIBLE/LoopDeviceMismatch")
		if err := device.DetachLoop(dev, other); err != nil {
			t.Fatal(err)
		}
		e.must("unstage", e.unstage(id))
		e.must("delete", e.delete(id))
		e.assertClean()
	})
	t.Run("staging mount gone", func(t *testing.T) {
		e := newEnv(t, defaultOpts)
		id := e.create("v", 64<<20, rwo, nil).GetVolumeId()
		e.must("stage", e.stage(id, rwo))
		run(t, "umount", e.staging(id))
		e.wantHealth(id, "INACCESSIBLE/StagingMountMissing")
		e.must("unstage", e.unstage(id))
		e.must("delete", e.delete(id))
		e.assertClean()
	})
	t.Run("remounted read-only", func(t *testing.T) {
		e := newEnv(t, defaultOpts)
		id := e.create("v", 64<<20, rwo, nil).GetVolumeId()
		e.up(id, rwo)
		run(t, "mount", "-o", "remount,ro", e.staging(id))
		e.wantHealth(id, "DEGRADED/ReadOnly")
		e.down(id)
		e.assertClean()
	})
	t.Run("ext4 errors", func(t *testing.T) {
		e := newEnv(t, defaultOpts)
		id := e.create("v", 64<<20, rwo, nil).GetVolumeId()
		e.up(id, rwo)
		trigger := filepath.Join("/sys/fs/ext4", filepath.Base(e.loopOf(id)), "trigger_fs_error")
		if err := os.WriteFile(trigger, []byte("podvol health test"), 0o200); err != nil {
			t.Fatal(err)
		}
		e.wantHealth(id, "DEGRADED/FilesystemErrors")
		e.down(id)
		e.assertClean()
	})
	t.Run("xfs shutdown", func(t *testing.T) {
		e := newEnv(t, defaultOpts)
		c := mountCap("xfs", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
		id := e.create("v", 300<<20, c, nil).GetVolumeId()
		e.up(id, c)
		run(t, "xfs_io", "-x", "-c", "shutdown", e.staging(id))
		e.wantHealth(id, "INACCESSIBLE/FilesystemShutdown")
		e.down(id)
		e.assertClean()
	})
}

func TestStorageHealthOvercommitted(t *testing.T) {
	e := newEnv(t, plugintest.Options{PoolDir: "xfs", Capacity: "20Gi"})
	storage := func() []string {
		r, err := e.p.Node().NodeGetStorageHealth(ctx(t), &csi.NodeGetStorageHealthRequest{})
		e.must("NodeGetStorageHealth", err)
		var out []string
		for _, b := range r.GetBackendHealth() {
			out = append(out, b.GetStatus().String()+"/"+b.GetReason())
		}
		return out
	}
	if got := storage(); len(got) != 0 {
		t.Fatalf("empty pool: %v", got)
	}
	e.create("big", 10<<30, blockCap(), nil)
	if got := storage(); strings.Join(got, ",") != "STORAGE_DEGRADED/PoolOvercommitted" {
		t.Fatalf("10 GiB promised on an 8 GiB filesystem: %v", got)
	}
}
