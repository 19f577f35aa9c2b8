package plugin_test

import (
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

// blkid returns what blkid finds on path: its TYPE and UUID, or "" for
// nothing (blkid exits 2).
func blkid(t *testing.T, path string) (fsType, uuid string) {
	t.Helper()
	out, err := exec.Command("blkid", "-p", "-o", "export", path).Output()
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) && ee.ExitCode() == 2 {
		return "", ""
	}
	if err != nil {
		t.Fatalf("blkid %s: %v", path, err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			switch k {
			case "TYPE":
				fsType = v
			case "UUID":
				uuid = v
			}
		}
	}
	return fsType, uuid
}

// A new filesystem volume's filesystem is made by CreateVolume, which runs
// while kube-scheduler waits for the claim anyway; NodeStageVolume, on the
// pod's way to running, then only attaches and mounts it: the filesystem is
// the one CreateVolume made (same UUID), and the data written through it
// stays. A raw block volume is left without any signature.
func TestCreateVolumeMakesTheFilesystem(t *testing.T) {
	e := newEnv(t, defaultOpts)
	for _, c := range []struct {
		fs   string
		size int64
	}{{"ext4", 64 << 20}, {"xfs", 300 << 20}} {
		t.Run(c.fs, func(t *testing.T) {
			cp := mountCap(c.fs, csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
			id := e.create("pvc-"+c.fs, c.size, cp, nil).GetVolumeId()
			img := filepath.Join(e.p.PoolDir, "volumes", id+".img")
			fs, uuid := blkid(t, img)
			if fs != c.fs || uuid == "" {
				t.Fatalf("after CreateVolume the image holds %q (uuid %q), want a %s filesystem", fs, uuid, c.fs)
			}
			e.up(id, cp)
			writeFile(t, filepath.Join(e.target(id), "f"), "kept")
			e.must("NodeUnpublishVolume", e.unpublish(id))
			e.must("NodeUnstageVolume", e.unstage(id))
			if fs2, uuid2 := blkid(t, img); fs2 != c.fs || uuid2 != uuid {
				t.Fatalf("after stage and unstage the image holds %s %s, want CreateVolume's %s %s (made again at stage?)", fs2, uuid2, c.fs, uuid)
			}
			e.up(id, cp)
			if got := readFile(t, filepath.Join(e.target(id), "f")); got != "kept" {
				t.Fatalf("read %q after restage", got)
			}
			if strings.Contains(e.p.Log(), "Formatting volume") {
				t.Errorf("NodeStageVolume formatted a volume CreateVolume had formatted:\n%s", e.p.Log())
			}
			e.down(id)
		})
	}
	t.Run("block", func(t *testing.T) {
		id := e.create("pvc-block", 32<<20, blockCap(), nil).GetVolumeId()
		if fs, _ := blkid(t, filepath.Join(e.p.PoolDir, "volumes", id+".img")); fs != "" {
			t.Fatalf("a new raw block volume holds %q, want nothing", fs)
		}
		e.must("DeleteVolume", e.delete(id))
	})
	e.assertClean()
}
