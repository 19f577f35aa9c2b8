package node_test

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/podvol/podvol/internal/device"
	"github.com/podvol/podvol/internal/device/devicetest"
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

// By default an unstage trims the volume's filesystem first, through its
// own mount; --discard=mount does not (the mount discards as it goes), nor
// is a raw block volume trimmed.
func TestUnstageTrims(t *testing.T) {
	for _, tc := range []struct {
		name  string
		mode  string
		block bool
		want  int
	}{
		{"fstrim", node.DiscardFstrim, false, 1},
		{"mount", node.DiscardMount, false, 0},
		{"block", node.DiscardFstrim, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.node.SetDiscard(tc.mode)
			v := e.volume("ext4")
			must(t, e.node.Stage(ctx, node.StageRequest{VolumeID: v.ID, StagingPath: v.staging, Block: tc.block}))
			must(t, e.node.Unstage(ctx, v.ID, v.staging))
			if got := e.dev.Calls(devicetest.Trim); got != tc.want {
				t.Fatalf("%d trims at unstage, want %d", got, tc.want)
			}
			e.clean()
		})
	}
}

// TrimAll trims each staged filesystem volume under its lock, and skips
// block volumes and volumes not staged.
func TestTrimAll(t *testing.T) {
	e := newEnv(t)
	fs, block, idle := e.volume("xfs"), e.volume("ext4"), e.volume("ext4")
	e.stage(fs)
	must(t, e.node.Stage(ctx, node.StageRequest{VolumeID: block.ID, StagingPath: block.staging, Block: true}))
	var locked []string
	e.node.TrimAll(ctx, func(key string) func() {
		locked = append(locked, key)
		return func() {}
	})
	if got := e.dev.Calls(devicetest.Trim); got != 1 {
		t.Fatalf("%d trims, want 1 (the staged filesystem volume)", got)
	}
	if !slices.Contains(locked, fs.ID) || slices.Contains(locked, idle.ID) {
		t.Fatalf("locked %v; want %s and not the idle %s", locked, fs.ID, idle.ID)
	}
	must(t, e.node.Unstage(ctx, fs.ID, fs.staging))
	must(t, e.node.Unstage(ctx, block.ID, block.staging))
	e.clean()
}
