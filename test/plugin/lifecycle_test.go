package plugin_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"

	"github.com/podvol/podvol/test/plugintest"
)

var defaultOpts = plugintest.Options{}

func TestDataSurvivesRestageAndRestart(t *testing.T) {
	for _, fs := range []string{"ext4", "xfs"} {
		t.Run(fs, func(t *testing.T) {
			e := newEnv(t, defaultOpts)
			c := mountCap(fs, csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
			id := e.create("pvc-data", 512<<20, c, nil).GetVolumeId()
			e.up(id, c)
			writeFile(t, filepath.Join(e.target(id), "data"), "first")

			e.must("unpublish", e.unpublish(id))
			e.must("unstage", e.unstage(id))
			e.assertClean()
			e.up(id, c)
			if got := readFile(t, filepath.Join(e.target(id), "data")); got != "first" {
				t.Fatalf("after restage: %q", got)
			}

			// A plugin restart while published changes nothing for the
			// pod; the repeated calls kubelet makes are no-ops.
			writeFile(t, filepath.Join(e.target(id), "data"), "second")
			e.p.Restart()
			e.up(id, c)
			if got := readFile(t, filepath.Join(e.target(id), "data")); got != "second" {
				t.Fatalf("after restart: %q", got)
			}
			e.down(id)
			e.assertClean()
		})
	}
}

// TestRestartAfterReboot: a reboot takes every mount and loop device; the
// plugin restores the staging mount from its store, and the kubelet's
// repeated stage and publish find the data.
func TestRestartAfterReboot(t *testing.T) {
	e := newEnv(t, defaultOpts)
	id := e.create("pvc-reboot", 64<<20, rwo, nil).GetVolumeId()
	e.up(id, rwo)
	writeFile(t, filepath.Join(e.target(id), "data"), "kept")
	e.p.Kill()
	plugintest.ForceClean(e.dir) // what the reboot does
	e.assertClean()

	e.p.Restart()
	if _, mounts := plugintest.Leftovers(e.dir); len(mounts) != 1 || mounts[0] != e.staging(id) {
		t.Fatalf("after restart: mounts %v, want the staging mount restored", mounts)
	}
	e.up(id, rwo)
	if got := readFile(t, filepath.Join(e.target(id), "data")); got != "kept" {
		t.Fatalf("after reboot: %q", got)
	}
	e.down(id)
	e.assertClean()
}

func TestReadOnlyPublish(t *testing.T) {
	e := newEnv(t, defaultOpts)
	id := e.create("pvc-ro", 64<<20, rwo, nil).GetVolumeId()
	e.must("stage", e.stage(id, rwo))
	_, err := e.p.Node().NodePublishVolume(ctx(t), &csi.NodePublishVolumeRequest{
		VolumeId: id, StagingTargetPath: e.staging(id), TargetPath: e.target(id), VolumeCapability: rwo, Readonly: true,
	})
	e.must("publish read-only", err)
	werr := os.WriteFile(filepath.Join(e.target(id), "f"), []byte("x"), 0o644)
	if werr == nil || !os.IsPermission(werr) && !isROFS(werr) {
		t.Fatalf("write to a read-only publication: %v, want EROFS", werr)
	}
	e.down(id)
	e.assertClean()
}

func isROFS(err error) bool {
	return errors.Is(err, unix.EROFS)
}

func TestBlockVolumeIsTheDevice(t *testing.T) {
	e := newEnv(t, defaultOpts)
	c := blockCap()
	id := e.create("pvc-block", 32<<20, c, nil).GetVolumeId()
	e.up(id, c)
	f, err := os.OpenFile(e.target(id), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("raw block data"), 4096); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	st, err := e.p.Node().NodeGetVolumeStats(ctx(t), &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: e.target(id)})
	e.must("stats", err)
	if got := st.GetUsage()[0].GetTotal(); got != 32<<20 {
		t.Fatalf("block stats total %d, want %d", got, 32<<20)
	}
	e.must("unpublish", e.unpublish(id))
	e.must("unstage", e.unstage(id))
	e.up(id, c)
	b := make([]byte, 14)
	f, _ = os.Open(e.target(id))
	_, _ = f.ReadAt(b, 4096)
	f.Close()
	if string(b) != "raw block data" {
		t.Fatalf("after restage read %q", b)
	}
	e.down(id)
	e.assertClean()
}
