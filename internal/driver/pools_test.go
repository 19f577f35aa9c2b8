package driver

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/podvol/podvol/internal/names"
	"github.com/podvol/podvol/internal/size"
)

// A node with two pools: a class's pool parameter chooses one, ids say
// which, every call finds its volume's pool from the id, copies stay in
// their source's pool, and a pool the node lacks is refused with the
// pools it has.
func TestSeveralPools(t *testing.T) {
	ctx := context.Background()
	f := newFakeNodePools(t, "node-1", true, "default", "fast")
	create := func(name, poolName string, src *csi.VolumeContentSource) (*csi.CreateVolumeResponse, error) {
		var params map[string]string
		if poolName != "" {
			params = map[string]string{names.ParamPool: poolName}
		}
		return f.d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, Parameters: params, VolumeContentSource: src,
			CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20}, VolumeCapabilities: []*csi.VolumeCapability{rwop()}})
	}
	def, err := create("a", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	fast, err := create("b", "fast", nil)
	if err != nil {
		t.Fatal(err)
	}
	defID, fastID := def.GetVolume().GetVolumeId(), fast.GetVolume().GetVolumeId()
	if !strings.HasPrefix(defID, "pv-") || strings.HasPrefix(defID, "pv-fast-") || !strings.HasPrefix(fastID, "pv-fast-") {
		t.Fatalf("ids %s (default) and %s (fast)", defID, fastID)
	}
	if _, err := f.pool("fast").ReadyVolume(fastID); err != nil {
		t.Fatalf("the fast pool does not hold %s: %v", fastID, err)
	}
	if _, err := f.pool("").ReadyVolume(fastID); err == nil {
		t.Fatalf("the default pool holds %s too", fastID)
	}

	_, err = create("c", "slow", nil)
	wantCode(t, err, codes.ResourceExhausted, "a class whose pool the node lacks")
	if !strings.Contains(err.Error(), `no pool "slow" (it has default, fast)`) {
		t.Errorf("the refusal does not name the pools: %v", err)
	}
	_, err = create("b", "", nil)
	wantCode(t, err, codes.AlreadyExists, "a name of the fast pool asked for in the default one")
	if again, err := create("b", "fast", nil); err != nil || again.GetVolume().GetVolumeId() != fastID {
		t.Fatalf("create b again in fast: %v %v", again, err)
	}

	// Capacity per class: the fast pool's after b, nothing for a pool
	// the node lacks.
	capOf := func(poolName string) int64 {
		r, err := f.d.GetCapacity(ctx, &csi.GetCapacityRequest{Parameters: map[string]string{names.ParamPool: poolName}})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetAvailableCapacity()
	}
	if got, want := capOf("fast"), 10*size.GiB-64<<20; got != want {
		t.Errorf("capacity of fast: %d, want %d", got, want)
	}
	if got := capOf("slow"); got != 0 {
		t.Errorf("capacity of a pool the node lacks: %d, want 0", got)
	}

	// Snapshots, restores and clones stay in their source's pool.
	snap, err := f.d.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "s", SourceVolumeId: fastID})
	if err != nil {
		t.Fatal(err)
	}
	snapID := snap.GetSnapshot().GetSnapshotId()
	if !strings.HasPrefix(snapID, "snap-fast-") {
		t.Fatalf("snapshot of a fast volume: %s", snapID)
	}
	fromSnap := &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snapID}}}
	_, err = create("r1", "", fromSnap)
	wantCode(t, err, codes.InvalidArgument, "a restore of a fast snapshot into the default pool")
	if !strings.Contains(err.Error(), `stays in its source's pool`) {
		t.Errorf("the refusal does not say why: %v", err)
	}
	r, err := create("r2", "fast", fromSnap)
	if err != nil || !strings.HasPrefix(r.GetVolume().GetVolumeId(), "pv-fast-") {
		t.Fatalf("a restore into fast: %v %v", r, err)
	}
	clone := &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: defID}}}
	_, err = create("c1", "fast", clone)
	wantCode(t, err, codes.InvalidArgument, "a clone of a default volume into fast")
	_, err = f.d.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "g", SourceVolumeIds: []string{defID, fastID}})
	wantCode(t, err, codes.InvalidArgument, "a group of two pools' volumes")

	// Listings page through both pools, each volume once.
	var listed []string
	token := ""
	for {
		page, err := f.d.ListVolumes(ctx, &csi.ListVolumesRequest{MaxEntries: 1, StartingToken: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range page.GetEntries() {
			listed = append(listed, e.GetVolume().GetVolumeId())
		}
		if token = page.GetNextToken(); token == "" {
			break
		}
		if len(listed) > 10 {
			t.Fatalf("listing does not end: %v", listed)
		}
	}
	slices.Sort(listed)
	want := []string{defID, fastID, r.GetVolume().GetVolumeId()}
	slices.Sort(want)
	if !slices.Equal(listed, want) {
		t.Errorf("listed %v, want %v", listed, want)
	}
	snaps, err := f.d.ListSnapshots(ctx, &csi.ListSnapshotsRequest{})
	if err != nil || len(snaps.GetEntries()) != 1 || snaps.GetEntries()[0].GetSnapshot().GetSnapshotId() != snapID {
		t.Errorf("ListSnapshots: %v %v", snaps, err)
	}
	// Filtered by source: its pool alone is read.
	for src, want := range map[string]int{fastID: 1, defID: 0, "pv-slow-0123456789abcdef01234567": 0} {
		snaps, err := f.d.ListSnapshots(ctx, &csi.ListSnapshotsRequest{SourceVolumeId: src})
		if err != nil || len(snaps.GetEntries()) != want {
			t.Errorf("ListSnapshots of source %s: %v %v, want %d", src, snaps, err, want)
		}
	}

	// An id of a pool this node does not serve: nothing here to find,
	// and not reported deleted (its image may be in that pool).
	gone := "pv-slow-0123456789abcdef01234567"
	_, err = f.d.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: gone})
	wantCode(t, err, codes.NotFound, "get of a volume of a pool the node lacks")
	_, err = f.d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: gone})
	wantCode(t, err, codes.FailedPrecondition, "delete of a volume of a pool the node lacks")
	_, err = f.d.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: "snap-slow-0123456789abcdef01234567@node-1"})
	wantCode(t, err, codes.FailedPrecondition, "delete of a snapshot of a pool the node lacks")

	for _, id := range []string{r.GetVolume().GetVolumeId(), fastID, defID} {
		if id == fastID {
			if _, err := f.d.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: snapID}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := f.d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Fatalf("delete %s: %v", id, err)
		}
	}
	for _, name := range []string{"", "fast"} {
		if total, allocated := f.pool(name).Capacity(); allocated != 0 {
			t.Errorf("pool %q: %d of %d bytes allocated after every delete", name, allocated, total)
		}
	}
}
