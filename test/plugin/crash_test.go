package plugin_test

import (
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// crash makes the next call die at failpoint fp: the plugin is restarted with
// the point enabled, the call fails as the process is SIGKILLed, and the
// plugin is started again without it.
func (e *env) crash(fp string, call func() error) {
	e.t.Helper()
	e.p.Restart("PODVOL_FAILPOINTS=" + fp)
	err := call()
	if status.Code(err) != codes.Unavailable {
		e.t.Fatalf("call at failpoint %s: got %v, want the connection to die", fp, err)
	}
	if !e.p.WaitExit(10 * time.Second) {
		e.t.Fatalf("plugin did not die at failpoint %s", fp)
	}
	e.p.Restart()
}

func TestCrashDuringCreateVolume(t *testing.T) {
	for _, fp := range []string{"create-after-record", "create-after-image"} {
		t.Run(fp, func(t *testing.T) {
			e := newEnv(t, defaultOpts)
			e.crash(fp, func() error {
				_, err := e.p.Controller().CreateVolume(ctx(t), &csi.CreateVolumeRequest{Name: "pvc-1", VolumeCapabilities: []*csi.VolumeCapability{rwo}})
				return err
			})
			if ids, imgs := e.volumeIDs(), e.images(); len(ids)+len(imgs) > 0 {
				t.Fatalf("after restart: volumes %v, images %v; want the half-made volume rolled back", ids, imgs)
			}
			// The CO retries: the volume is then made whole.
			v := e.create("pvc-1", 64<<20, rwo, nil)
			e.up(v.GetVolumeId(), rwo)
			writeFile(t, filepath.Join(e.target(v.GetVolumeId()), "f"), "ok")
			e.down(v.GetVolumeId())
			e.assertClean()
			if imgs := e.images(); len(imgs) > 0 {
				t.Fatalf("images left: %v", imgs)
			}
		})
	}
}

func TestCrashDuringNodeStageVolume(t *testing.T) {
	for _, fp := range []string{"stage-after-record", "stage-after-loop", "stage-after-mount"} {
		for _, c := range []*csi.VolumeCapability{rwo, blockCap()} {
			name := fp + "/mount"
			if c.GetBlock() != nil {
				if fp == "stage-after-mount" {
					continue // block volumes are not mounted when staged
				}
				name = fp + "/block"
			}
			t.Run(name, func(t *testing.T) {
				e := newEnv(t, defaultOpts)
				id := e.create("pvc-1", 64<<20, c, nil).GetVolumeId()
				e.crash(fp, func() error { return e.stage(id, c) })
				// Rolled back: nothing attached or mounted, and the
				// kubelet's retry stages the volume afresh.
				e.assertClean()
				e.up(id, c)
				if c.GetBlock() == nil {
					writeFile(t, filepath.Join(e.target(id), "f"), "ok")
				}
				e.down(id)
				e.assertClean()
			})
		}
	}
}

func TestCrashDuringNodePublishVolume(t *testing.T) {
	e := newEnv(t, defaultOpts)
	id := e.create("pvc-1", 64<<20, rwo, nil).GetVolumeId()
	e.must("stage", e.stage(id, rwo))
	e.crash("publish-after-record", func() error { return e.publish(id, rwo) })
	e.must("publish after restart", e.publish(id, rwo))
	writeFile(t, filepath.Join(e.target(id), "f"), "ok")
	e.down(id)
	e.assertClean()
}

func TestCrashDuringDeleteVolume(t *testing.T) {
	for _, fp := range []string{"delete-after-mark", "delete-after-image"} {
		t.Run(fp, func(t *testing.T) {
			e := newEnv(t, defaultOpts)
			id := e.create("pvc-1", 64<<20, rwo, nil).GetVolumeId()
			e.up(id, rwo)
			e.must("unpublish", e.unpublish(id))
			e.must("unstage", e.unstage(id))
			e.crash(fp, func() error { return e.delete(id) })
			if ids, imgs := e.volumeIDs(), e.images(); slices.Contains(ids, id) || len(imgs) > 0 {
				t.Fatalf("after restart: volumes %v, images %v; want the deletion finished", ids, imgs)
			}
			e.must("DeleteVolume retry", e.delete(id))
			e.assertClean()
		})
	}
}
