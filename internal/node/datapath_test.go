package node_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/podvol/podvol/internal/device"
	"github.com/podvol/podvol/internal/node"
)

// Every stage attaches with direct I/O: filesystem volumes at the pool's
// block size, raw block volumes at 512 bytes as before; --direct-io=false
// attaches as before.
func TestStageAttachesWithDirectIO(t *testing.T) {
	for _, tc := range []struct {
		name     string
		block    bool
		buffered bool
		want     func(pool int) device.LoopIO
	}{
		{"filesystem", false, false, func(pool int) device.LoopIO { return device.LoopIO{DirectIO: true, BlockSize: pool} }},
		{"block", true, false, func(int) device.LoopIO { return device.LoopIO{DirectIO: true, BlockSize: 512} }},
		{"direct-io=false", false, true, func(int) device.LoopIO { return device.LoopIO{BlockSize: 512} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.node.SetDirectIO(!tc.buffered)
			v := e.volume("xfs")
			must(t, e.node.Stage(ctx, node.StageRequest{VolumeID: v.ID, StagingPath: v.staging, Block: tc.block}))
			dev := e.record(v.ID).Stage.Device
			got, err := e.dev.LoopStatus(dev)
			must(t, err)
			if want := tc.want(device.PoolBlockSize(e.pool.ImagePath(v.ID))); got != want {
				t.Fatalf("loop device set up as %+v, want %+v", got, want)
			}
			if n, _ := e.node.DirectIORefused(); n != 0 {
				t.Fatalf("%d refusals counted where none happened", n)
			}
			must(t, e.node.Unstage(ctx, v.ID, v.staging))
		})
	}
}

// A pool whose filesystem refuses direct I/O still stages, buffered, and
// the refusal is counted for the pool's health and metric.
func TestDirectIORefusedIsCounted(t *testing.T) {
	e := newEnv(t)
	e.dev.RefuseDirectIO(filepath.Join(e.poolDir, "volumes"))
	for i := 0; i < 2; i++ {
		v := e.volume("ext4")
		dev := e.stage(v)
		e.mountedFrom(v.staging, dev)
		if got, _ := e.dev.LoopStatus(dev); got.DirectIO {
			t.Fatalf("direct I/O on a pool that refuses it: %+v", got)
		}
		n, last := e.node.DirectIORefused()
		if n != int64(i+1) || !strings.Contains(last, v.ID) {
			t.Fatalf("after %d refused stages: DirectIORefused() = %d, %q", i+1, n, last)
		}
		must(t, e.node.Unstage(ctx, v.ID, v.staging))
	}
}
