package plugin_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/podvol/podvol/test/plugintest"
)

// Two pools on one node (issue 26, device classes): the default one on the
// test directory's filesystem and "fast" on an XFS image of its own. A
// class's pool parameter places a volume, an inline volume's attribute
// likewise; snapshots, restores, clones and growth stay in their pool; the
// capacity of each class is its pool's; and a restart that leaves a pool
// out is refused rather than forgetting its volumes.
func TestTwoPools(t *testing.T) {
	plugintest.RequireRoot(t)
	dir := plugintest.TempDir(t)
	fastDir := plugintest.XFSPool(t, dir, 4<<30)
	fastArg := "--pool=fast=" + fastDir + ",capacity=3Gi"
	args := []string{"--kubelet-dir", "{dir}/kubelet", fastArg}
	e := start(t, plugintest.Options{Dir: dir, NodeID: node, Capacity: "2Gi", Args: args})
	k := &kubelet{e: e, dir: filepath.Join(dir, "kubelet")}
	// Inline volumes reach no StorageClass, quota or scheduler: they may
	// use the default pool only, unless --inline-pools says otherwise.
	err := k.publish("uid0", "scratch", map[string]string{"size": "64Mi", "pool": "fast"})
	wantCode(t, "an inline volume in pool fast without --inline-pools", err, codes.InvalidArgument)
	args = append(args, "--inline-pools=default,fast")
	e.p.Upgrade(args...)
	fast := map[string]string{"pool": "fast"}
	xfs := mountCap("xfs", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)

	a := e.create("a", 64<<20, rwo, nil).GetVolumeId()
	b := e.create("b", 400<<20, xfs, fast).GetVolumeId()
	if strings.HasPrefix(a, "pv-fast-") || !strings.HasPrefix(b, "pv-fast-") {
		t.Fatalf("volume ids %s (default pool) and %s (fast)", a, b)
	}
	for id, poolDir := range map[string]string{a: e.p.PoolDir, b: fastDir} {
		if _, err := os.Stat(filepath.Join(poolDir, "volumes", id+".img")); err != nil {
			t.Fatalf("volume %s is not in %s: %v", id, poolDir, err)
		}
	}
	_, err = e.p.Controller().CreateVolume(ctx(t), &csi.CreateVolumeRequest{Name: "c", CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{rwo}, Parameters: map[string]string{"pool": "slow"}})
	wantCode(t, "a class of a pool this node lacks", err, codes.ResourceExhausted)

	capacity := func(params map[string]string) int64 {
		r, err := e.p.Controller().GetCapacity(ctx(t), &csi.GetCapacityRequest{Parameters: params})
		e.must("GetCapacity", err)
		return r.GetAvailableCapacity()
	}
	if got, want := capacity(nil), int64(2<<30-64<<20); got != want {
		t.Errorf("capacity of the default class: %d, want %d", got, want)
	}
	if got, want := capacity(fast), int64(3<<30-400<<20); got != want {
		t.Errorf("capacity of the fast class: %d, want %d", got, want)
	}
	if got := capacity(map[string]string{"pool": "slow"}); got != 0 {
		t.Errorf("capacity of a class whose pool this node lacks: %d, want 0", got)
	}

	e.up(a, rwo)
	e.up(b, xfs)
	writeFile(t, filepath.Join(e.target(a), "f"), "in default")
	writeFile(t, filepath.Join(e.target(b), "f"), "in fast")

	// A snapshot, a restore and a clone of b stay in fast (reflinks on
	// its XFS); a restore into the default pool is refused.
	s := e.snapshot("s", b).GetSnapshotId()
	if !strings.HasPrefix(s, "snap-fast-") {
		t.Fatalf("snapshot of a fast volume: %s", s)
	}
	if _, err := e.createFrom("r-default", 400<<20, xfs, fromSnapshot(s)); err == nil || !strings.Contains(err.Error(), "stays in its source's pool") {
		t.Fatalf("a restore of a fast snapshot into the default pool: %v, want a refusal", err)
	}
	restore := func(name string, src *csi.VolumeContentSource) string {
		r, err := e.p.Controller().CreateVolume(ctx(t), &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: 400 << 20},
			VolumeCapabilities: []*csi.VolumeCapability{xfs}, VolumeContentSource: src, Parameters: fast})
		e.must("CreateVolume "+name, err)
		id := r.GetVolume().GetVolumeId()
		if !strings.HasPrefix(id, "pv-fast-") {
			t.Fatalf("%s of a fast source: %s", name, id)
		}
		e.up(id, xfs)
		if got := readFile(t, filepath.Join(e.target(id), "f")); got != "in fast" {
			t.Fatalf("%s reads %q", name, got)
		}
		return id
	}
	restored, cloned := restore("r", fromSnapshot(s)), restore("c", fromVolume(b))

	// Growth within the fast pool (XFS grows online).
	got, err := e.expand(b, e.target(b), 800<<20)
	e.must("NodeExpandVolume of a fast volume", err)
	if got < 800<<20 {
		t.Fatalf("grew to %d", got)
	}

	// An inline volume names its pool in its attributes.
	e.must("publish inline", k.publish("uid1", "scratch", map[string]string{"size": "64Mi", "pool": "fast"}))
	if err := k.publish("uid2", "scratch", map[string]string{"pool": "slow"}); err == nil {
		t.Fatal("an inline volume of a pool this node lacks was published")
	}
	inl, err := os.ReadDir(filepath.Join(fastDir, "volumes"))
	if err != nil || len(inl) != 4 {
		t.Fatalf("fast pool images after the inline volume: %v %v, want b, r, c and the inline one", inl, err)
	}

	// A restart with the same pools finds every volume; one without
	// fast is refused, naming it and the way out.
	e.p.Restart()
	if got := readFile(t, filepath.Join(e.target(b), "f")); got != "in fast" {
		t.Fatalf("after a restart b reads %q", got)
	}
	e.p.Stop()
	out, err := exec.Command(plugintest.Binary(t), "--endpoint", "unix://"+filepath.Join(dir, "refused.sock"), "--node-id", node,
		"--pool-dir", e.p.PoolDir, "--capacity", "2Gi").CombinedOutput()
	if err == nil || !strings.Contains(string(out), `fast\" was served before`) || !strings.Contains(string(out), "--forget-pool fast") {
		t.Fatalf("a start without the fast pool: %v\n%s", err, out)
	}
	e.p.Upgrade(args...)

	e.must("unpublish inline", k.unpublish("uid1", "scratch"))
	e.must("delete the snapshot", func() error {
		_, err := e.p.Controller().DeleteSnapshot(ctx(t), &csi.DeleteSnapshotRequest{SnapshotId: s})
		return err
	}())
	for _, id := range []string{a, b, restored, cloned} {
		e.down(id)
	}
	for _, d := range []string{e.p.PoolDir, fastDir} {
		if left, _ := os.ReadDir(filepath.Join(d, "volumes")); len(left) > 0 {
			t.Errorf("images left in %s: %v", d, left)
		}
	}
	e.assertClean()

	// A pool that is gone for good is forgotten only on the admin's word.
	e.p.Upgrade("--forget-pool", "fast")
	e.p.Upgrade()
}
