package driver

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/podvol/podvol/internal/device/devicetest"
	"github.com/podvol/podvol/internal/directvolume"
	"github.com/podvol/podvol/internal/inline"
	"github.com/podvol/podvol/internal/keylock"
	"github.com/podvol/podvol/internal/names"
	"github.com/podvol/podvol/internal/node"
	"github.com/podvol/podvol/internal/pool"
	"github.com/podvol/podvol/internal/size"
)

// The driver on the fake machine: the CSI calls end to end, without root.

type fakeNode struct {
	t       *testing.T
	d       *Driver
	dev     *devicetest.Fake
	kubelet string
}

func newFakeNode(t *testing.T) *fakeNode { return newFakeNodeReflink(t, false) }

// newFakeNodeReflink is newFakeNode on a pool whose filesystem has reflink
// or not.
func newFakeNodeReflink(t *testing.T, reflink bool) *fakeNode {
	t.Helper()
	return newFakeNodeNamed(t, "node-1", reflink)
}

// newFakeNodeNamed is a fake node of that name, with a pool of its own.
func newFakeNodeNamed(t *testing.T, nodeID string, reflink bool) *fakeNode {
	return newFakeNodePools(t, nodeID, reflink, pool.DefaultName)
}

// newFakeNodePools is a fake node with a pool of each name (10 GiB each).
func newFakeNodePools(t *testing.T, nodeID string, reflink bool, poolNames ...string) *fakeNode {
	t.Helper()
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dev := devicetest.New()
	dev.SetReflink(reflink)
	kubelet := filepath.Join(dir, "kubelet")
	locks := &keylock.Locks{}
	var pools []Pool
	for _, name := range poolNames {
		p, err := pool.Open(pool.Config{Name: name, Dir: filepath.Join(dir, "pool-"+name), Capacity: 10 * size.GiB, Device: dev})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := p.Close(); err != nil {
				t.Error(err)
			}
		})
		n := node.New(p, &directvolume.Shim{Root: filepath.Join(dir, "direct")}, dev)
		inl := &inline.Manager{Pool: p, Node: n, KubeletDir: kubelet, Device: dev, Locks: locks}
		pools = append(pools, Pool{Pool: p, Node: n, Inline: inl})
	}
	d := New(Config{NodeID: nodeID, Pools: pools, Locks: locks, InlineDefaultSize: size.GiB})
	return &fakeNode{t: t, d: d, dev: dev, kubelet: kubelet}
}

// pool is the fake node's pool of that name ("": the default pool).
func (f *fakeNode) pool(name string) *pool.Pool {
	f.t.Helper()
	pl, ok := f.d.poolNamed(name)
	if !ok {
		f.t.Fatalf("no pool %q", name)
	}
	return pl.Pool
}

func (f *fakeNode) dir(name string) string {
	f.t.Helper()
	p := filepath.Join(f.kubelet, name)
	if err := os.MkdirAll(p, 0o750); err != nil {
		f.t.Fatal(err)
	}
	return p
}

func rwop() *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER},
	}
}

func wantCode(t *testing.T, err error, code codes.Code, what string) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("%s: %v, want %s", what, err, code)
	}
}

func (f *fakeNode) createStaged(params map[string]string) (id, staging string) {
	f.t.Helper()
	ctx := context.Background()
	v, err := f.d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-" + filepath.Base(f.t.Name()), Parameters: params,
		CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20}, VolumeCapabilities: []*csi.VolumeCapability{rwop()}})
	if err != nil {
		f.t.Fatal(err)
	}
	id = v.GetVolume().GetVolumeId()
	staging = filepath.Join(f.dir("staging"), id)
	if _, err := f.d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: rwop()}); err != nil {
		f.t.Fatal(err)
	}
	return id, staging
}

// Issue 1: a snapshot of a volume assigned to a microVM never freezes
// anything (the staging path is then a directory on the node's own
// filesystem), and the host cannot mount the volume meanwhile.
func TestSnapshotOfAnAssignedVolume(t *testing.T) {
	ctx := context.Background()
	f := newFakeNodeReflink(t, true)
	id, staging := f.createStaged(map[string]string{names.ParamDirectAssign: "always"})
	target := filepath.Join(f.dir("pods/a"), "mount")
	_, err := f.d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: rwop()})
	if err != nil {
		t.Fatal(err)
	}
	s, err := f.d.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap", SourceVolumeId: id})
	if err != nil {
		t.Fatal(err)
	}
	if !s.GetSnapshot().GetReadyToUse() {
		t.Fatal("snapshot not ready")
	}
	if log := f.dev.FreezeLog(); len(log) != 0 {
		t.Fatalf("froze: %+v", log)
	}
	if f.dev.Calls(devicetest.SyncDevice) != 1 {
		t.Fatal("the device was not flushed for a crash-consistent copy")
	}
	for _, p := range []string{staging, target} {
		if m, _ := f.dev.MountedAt(p); m != nil {
			t.Fatalf("%s mounted on the host while assigned", p)
		}
	}
}

// A snapshot or clone holds the source volume's lock while it is frozen and
// copied: an unstage (or offline growth) waits for the copy, and never
// leaves a frozen filesystem behind.
func TestCopyHoldsTheSourceLock(t *testing.T) {
	for _, kind := range []string{"snapshot", "clone"} {
		t.Run(kind, func(t *testing.T) {
			ctx := context.Background()
			f := newFakeNode(t)
			id, staging := f.createStaged(nil)
			dev := f.dev.MountTable()[0].Source
			inCopy, release := make(chan struct{}), make(chan struct{})
			f.dev.Inject(devicetest.CopyImage, func(string) error {
				close(inCopy)
				<-release
				return nil
			})
			copied := make(chan error, 1)
			go func() {
				var err error
				if kind == "snapshot" {
					_, err = f.d.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap", SourceVolumeId: id})
				} else {
					_, err = f.d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "clone", VolumeCapabilities: []*csi.VolumeCapability{rwop()},
						CapacityRange:       &csi.CapacityRange{RequiredBytes: 64 << 20},
						VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: id}}}})
				}
				copied <- err
			}()
			<-inCopy
			if !f.dev.Frozen(dev) {
				t.Fatal("copying an unfrozen filesystem")
			}
			unstaged := make(chan error, 1)
			go func() {
				_, err := f.d.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
				unstaged <- err
			}()
			select {
			case err := <-unstaged:
				close(release)
				t.Fatalf("unstage ran during the copy (%v)", err)
			case <-time.After(200 * time.Millisecond):
			}
			close(release)
			if err := <-copied; err != nil {
				t.Fatal(err)
			}
			if err := <-unstaged; err != nil {
				t.Fatal(err)
			}
			if f.dev.Frozen(dev) {
				t.Fatal("left frozen")
			}
			if m, _ := f.dev.MountedAt(staging); m != nil {
				t.Fatal("still staged")
			}
		})
	}
}

func TestNodeLifecycleCodes(t *testing.T) {
	ctx := context.Background()
	f := newFakeNode(t)
	id, staging := f.createStaged(nil)
	first, second := filepath.Join(f.dir("pods/a"), "mount"), filepath.Join(f.dir("pods/b"), "mount")
	publish := func(target string) error {
		_, err := f.d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: rwop()})
		return err
	}
	if err := publish(first); err != nil {
		t.Fatal(err)
	}
	wantCode(t, publish(second), codes.FailedPrecondition, "second RWOP publish")
	_, err := f.d.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
	wantCode(t, err, codes.FailedPrecondition, "unstage while published")
	_, err = f.d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
	wantCode(t, err, codes.FailedPrecondition, "delete while staged")
	_, err = f.d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "pv-000000000000000000000000", StagingTargetPath: staging, TargetPath: second, VolumeCapability: rwop()})
	wantCode(t, err, codes.NotFound, "publish of an unknown volume")
	// Each call twice: a repeated call finds it done.
	for range 2 {
		if _, err := f.d.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: first}); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if _, err := f.d.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if _, err := f.d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Fatal(err)
		}
	}
	_, err = f.d.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
	wantCode(t, err, codes.NotFound, "unstage of a deleted volume")
	if left := f.dev.Leftovers(); len(left) != 0 {
		t.Fatalf("left: %v", left)
	}
}

// A volume path that is not a clean absolute path, or lies in the pool, is
// none of the volume's (NOT_FOUND, as the spec has it) and is never looked
// at: the stats of a raw block volume otherwise stat the path given, to find
// kubelet's device node.
func TestVolumePathIsValidatedFirst(t *testing.T) {
	ctx := context.Background()
	f := newFakeNode(t)
	block := &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	v, err := f.d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "raw", CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{block}})
	if err != nil {
		t.Fatal(err)
	}
	id := v.GetVolume().GetVolumeId()
	staging := filepath.Join(f.dir("staging"), id)
	if _, err := f.d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: block}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"relative/path", staging + "/../x", f.pool("").Dir() + "/volumes/" + id + ".img"} {
		_, err := f.d.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: p})
		wantCode(t, err, codes.NotFound, "stats at "+p)
		if !strings.Contains(err.Error(), "has no path") {
			t.Fatalf("stats at %s: %v, want it to say the path is not the volume's", p, err)
		}
	}
	if n := f.dev.Calls(devicetest.DeviceNodeOf); n != 0 {
		t.Fatalf("%d paths that are none of the volume's were looked at", n)
	}
	if _, err := f.d.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: staging}); err != nil {
		t.Fatalf("stats at the staging path: %v", err)
	}
}
