package node_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/podvol/podvol/internal/errkind"
	"github.com/podvol/podvol/internal/node"
)

// Kubelet asks for a raw block volume's stats at its own map path, a bind
// of the file podvol published (volumeDevices/<pv>/dev/<pod uid>): that
// path answers with the volume's size, and a device node of another
// volume does not.
func TestBlockStatsAtKubeletMapPath(t *testing.T) {
	e := newEnv(t)
	a, b := e.volume("ext4"), e.volume("ext4")
	block := func(r *node.PublishRequest) { r.Block = true }
	for _, v := range []*volume{a, b} {
		must(t, e.node.Stage(ctx, stageBlock(v)))
		must(t, e.publish(v, v.target, block))
	}
	mapPath := func(v *volume) string {
		dir := filepath.Join(e.kubelet, "plugins/kubernetes.io/csi/volumeDevices", v.ID, "dev")
		must(t, os.MkdirAll(dir, 0o750))
		p := filepath.Join(dir, "pod-uid")
		must(t, os.WriteFile(p, nil, 0o640))
		must(t, e.dev.Mount(ctx, v.target, p, "", []string{"bind"}))
		return p
	}
	mapA, mapB := mapPath(a), mapPath(b)
	for _, path := range []string{a.target, a.staging, mapA} {
		st, err := e.node.VolumeStats(ctx, a.ID, path)
		must(t, err)
		if !st.Block || st.TotalBytes != e.record(a.ID).SizeBytes {
			t.Fatalf("stats of %s at %s: %+v, want block of %d bytes", a.ID, path, st, e.record(a.ID).SizeBytes)
		}
	}
	_, err := e.node.VolumeStats(ctx, a.ID, mapB)
	wantErr(t, err, errkind.ErrNotFound, "stats of a at b's map path")
	_, err = e.node.VolumeStats(ctx, a.ID, filepath.Dir(mapA))
	wantErr(t, err, errkind.ErrNotFound, "stats of a at a directory")
	for _, p := range []string{mapA, mapB} {
		must(t, e.dev.Unmount(p))
	}
	for _, v := range []*volume{a, b} {
		must(t, e.node.Unpublish(ctx, v.ID, v.target))
		must(t, e.node.Unstage(ctx, v.ID, v.staging))
	}
	e.clean()
}
