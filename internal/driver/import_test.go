package driver

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/podvol/podvol/internal/errkind"
	"github.com/podvol/podvol/internal/pool"
	"github.com/podvol/podvol/internal/snaphandle"
	"github.com/podvol/podvol/internal/store"
)

// importer records what it was asked; the volume becomes ready when told.
// nodes: where each volume of another node is, by id.
type importer struct {
	ensured []*store.Volume
	failed  map[string]error
	nodes   map[string]string
}

func (im *importer) VolumeNode(_ context.Context, _ *store.Import, id string) (string, error) {
	if n, ok := im.nodes[id]; ok {
		return n, nil
	}
	return "", fmt.Errorf("no claim clones volume %s: %w", id, errkind.ErrNotFound)
}

func (im *importer) Ensure(_ *pool.Pool, v *store.Volume) string {
	im.ensured = append(im.ensured, v)
	return fmt.Sprintf("copying %s %s from node %s: starting", v.Source.Kind, v.Source.ID, v.Source.Node)
}

func (im *importer) Failed(name string) error {
	err := im.failed[name]
	delete(im.failed, name)
	return err
}

// With an Importer, a restore of another node's snapshot is recorded
// importing for the claim the provisioner names and answered ABORTED with
// the progress, as often as it is asked, until the volume is ready; a pull
// given up is the next answer's error; a request that does not name its
// claim is refused before anything is recorded.
func TestRestoreOfAnotherNodesSnapshot(t *testing.T) {
	ctx := context.Background()
	f := newFakeNode(t)
	im := &importer{failed: map[string]error{}}
	f.d.cfg.Importer = im
	const uid = "0b1c2d3e-0000-4000-8000-000000000001"
	handle := snaphandle.Format("snap-0123456789abcdef01234567", "node-2")
	req := func(name string, params map[string]string) *csi.CreateVolumeRequest {
		return &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20},
			VolumeCapabilities: []*csi.VolumeCapability{rwop()}, VolumeContentSource: fromSnapshot(handle), Parameters: params}
	}
	params := map[string]string{pvcNamespaceParam: "team-a", pvcNameParam: "restored"}

	for i := 0; i < 2; i++ {
		_, err := f.d.CreateVolume(ctx, req("pvc-"+uid, params))
		wantCode(t, err, codes.Aborted, "restore of node-2's snapshot")
		if !strings.Contains(err.Error(), "copying snapshot snap-0123456789abcdef01234567 from node node-2") {
			t.Fatalf("ABORTED without the progress: %v", err)
		}
	}
	if len(im.ensured) != 2 || im.ensured[0].ID != im.ensured[1].ID {
		t.Fatalf("ensured %v: want the same volume twice", im.ensured)
	}
	v := im.ensured[0]
	want := store.Import{ClaimNamespace: "team-a", ClaimName: "restored", ClaimUID: uid}
	if v.State != store.Importing || *v.Import != want || v.Source.Node != "node-2" {
		t.Fatalf("recorded %+v (import %+v)", v, v.Import)
	}
	// Not listed while it is being pulled.
	l, err := f.d.ListVolumes(ctx, &csi.ListVolumesRequest{})
	if err != nil || len(l.GetEntries()) != 0 {
		t.Fatalf("ListVolumes while importing: %v, %v", l, err)
	}

	// Ready: the next retry returns it, its source naming node-2.
	p := f.pool("")
	if err := p.RecordImport(v.ID, "id", "", 32<<20, 32<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := p.FinishImport(ctx, v.ID); err != nil {
		t.Fatal(err)
	}
	got, err := f.d.CreateVolume(ctx, req("pvc-"+uid, params))
	if err != nil {
		t.Fatal(err)
	}
	if got.GetVolume().GetVolumeId() != v.ID || got.GetVolume().GetContentSource().GetSnapshot().GetSnapshotId() != handle {
		t.Fatalf("ready volume %v", got.GetVolume())
	}

	// A pull given up is the next answer.
	im.failed["pvc-"+uid[:35]+"2"] = fmt.Errorf("claim team-a/other is to be provisioned on node-3: %w", errkind.ErrDenied)
	_, err = f.d.CreateVolume(ctx, req("pvc-"+uid[:35]+"2", map[string]string{pvcNamespaceParam: "team-a", pvcNameParam: "other"}))
	wantCode(t, err, codes.PermissionDenied, "a pull given up")

	// A handle whose id or node podvol never made: refused before it is
	// recorded, looked up or put in a URL.
	for _, h := range []string{"../../etc@node-2", "snap-0123456789abcdef01234567@Node_2", "pv-0123456789abcdef01234567@node-2"} {
		r := req("pvc-"+uid[:35]+"4", params)
		r.VolumeContentSource = fromSnapshot(h)
		_, err := f.d.CreateVolume(ctx, r)
		wantCode(t, err, codes.InvalidArgument, "restore from handle "+h)
	}

	// No claim to name: refused, nothing recorded.
	for _, c := range []struct {
		name   string
		params map[string]string
	}{{"pvc-" + uid[:35] + "3", nil}, {"not-a-uid", params}} {
		_, err := f.d.CreateVolume(ctx, req(c.name, c.params))
		wantCode(t, err, codes.FailedPrecondition, "restore without its claim: "+c.name)
		if _, err := p.Store().VolumeByName(c.name); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s was recorded: %v", c.name, err)
		}
	}
}

// With an Importer, a clone of a volume this node does not hold is of the
// node the API server says holds it: recorded importing from there, for the
// claim the provisioner names, and answered ABORTED; a volume no claim
// clones is NOT_FOUND, and a clone of this node's own volume stays a local
// copy.
func TestCloneOfAnotherNodesVolume(t *testing.T) {
	ctx := context.Background()
	f := newFakeNode(t)
	const remote = "pv-0123456789abcdef01234567"
	im := &importer{failed: map[string]error{}, nodes: map[string]string{remote: "node-2"}}
	f.d.cfg.Importer = im
	const uid = "0b1c2d3e-0000-4000-8000-000000000002"
	params := map[string]string{pvcNamespaceParam: "team-a", pvcNameParam: "clone"}
	req := func(name, src string) *csi.CreateVolumeRequest {
		return &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20},
			VolumeCapabilities: []*csi.VolumeCapability{rwop()}, Parameters: params,
			VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: src}}}}
	}
	_, err := f.d.CreateVolume(ctx, req("pvc-"+uid, remote))
	wantCode(t, err, codes.Aborted, "clone of node-2's volume")
	if !strings.Contains(err.Error(), "copying volume "+remote+" from node node-2") {
		t.Fatalf("ABORTED without the progress: %v", err)
	}
	if len(im.ensured) != 1 {
		t.Fatalf("ensured %v, want one pull", im.ensured)
	}
	v := im.ensured[0]
	want := store.Import{ClaimNamespace: "team-a", ClaimName: "clone", ClaimUID: uid}
	if v.State != store.Importing || *v.Import != want || *v.Source != (store.Source{Kind: store.FromVolume, ID: remote, Node: "node-2"}) {
		t.Fatalf("recorded %+v (source %+v, import %+v)", v, v.Source, v.Import)
	}

	_, err = f.d.CreateVolume(ctx, req("pvc-"+uid[:35]+"3", "pv-0123456789abcdef0123456f"))
	wantCode(t, err, codes.NotFound, "clone of a volume no claim clones")
	// An id podvol never made (a static PV may carry any handle) is
	// refused before it is looked up, recorded or put in a URL.
	im.nodes["vol-../../etc"] = "node-2"
	_, err = f.d.CreateVolume(ctx, req("pvc-"+uid[:35]+"5", "vol-../../etc"))
	wantCode(t, err, codes.InvalidArgument, "clone of a volume id podvol never made")

	// This node's own volume: a local copy, no pull.
	src, err := f.d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "source", CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{rwop()}})
	if err != nil {
		t.Fatal(err)
	}
	clone, err := f.d.CreateVolume(ctx, req("pvc-"+uid[:35]+"4", src.GetVolume().GetVolumeId()))
	if err != nil {
		t.Fatalf("clone of this node's volume: %v", err)
	}
	if clone.GetVolume().GetContentSource().GetVolume().GetVolumeId() != src.GetVolume().GetVolumeId() || len(im.ensured) != 1 {
		t.Fatalf("clone of this node's volume %v; pulls %d", clone.GetVolume(), len(im.ensured))
	}
}

// The snapshot a clone on another node pulls is cut once per claim, is
// not listed to the CO, and only of a volume this node holds.
func TestCutForTransfer(t *testing.T) {
	ctx := context.Background()
	f := newFakeNode(t)
	v, err := f.d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "source", CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{rwop()}})
	if err != nil {
		t.Fatal(err)
	}
	claim := store.Claim{Namespace: "team-a", Name: "clone", UID: "0b1c2d3e-0000-4000-8000-000000000009"}
	_, s1, err := f.d.CutForTransfer(v.GetVolume().GetVolumeId(), claim)
	if err != nil {
		t.Fatal(err)
	}
	_, s2, err := f.d.CutForTransfer(v.GetVolume().GetVolumeId(), claim)
	if err != nil || s2.ID != s1.ID || s1.For == nil || *s1.For != claim {
		t.Fatalf("cut again: %+v, %v; want %s for %+v", s2, err, s1.ID, claim)
	}
	l, err := f.d.ListSnapshots(ctx, &csi.ListSnapshotsRequest{})
	if err != nil || len(l.GetEntries()) != 0 {
		t.Fatalf("ListSnapshots lists %v (%v): want none", l.GetEntries(), err)
	}
	l, err = f.d.ListSnapshots(ctx, &csi.ListSnapshotsRequest{SnapshotId: f.d.snapshotHandle(s1.ID)})
	if err != nil || len(l.GetEntries()) != 0 {
		t.Fatalf("ListSnapshots by id lists %v (%v): want none", l.GetEntries(), err)
	}
	other := store.Claim{Namespace: "team-a", Name: "other", UID: "0b1c2d3e-0000-4000-8000-00000000000a"}
	if _, _, err := f.d.CutForTransfer("pv-0123456789abcdef0123456f", other); !errors.Is(err, errkind.ErrNotFound) {
		t.Fatalf("cut of a volume this node does not hold: %v, want not found", err)
	}
}

// A migration's pull reads the pre-copy's snapshot while the volume is
// staged and the volume itself once it is not, marking it moving; a moving
// volume is not staged here again (a write would not follow it) until the
// mark is cleared; a new copy's claim takes the mark over.
func TestCutForMove(t *testing.T) {
	ctx := context.Background()
	f := newFakeNodeReflink(t, true)
	id, staging := f.createStaged(nil)
	claim := store.Claim{Namespace: "team-a", Name: "data-moving", UID: "0b1c2d3e-0000-4000-8000-00000000000b"}
	p, first, moving, err := f.d.CutForMove(id, claim)
	if err != nil || moving != nil || first == nil || first.Name != pool.TransferSnapshotName(claim.UID) {
		t.Fatalf("cut of a staged volume: %+v, moving %v, %v: want the pre-copy's snapshot", first, moving, err)
	}
	if _, err := f.d.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	_, again, moving, err := f.d.CutForMove(id, claim)
	if err != nil || moving == nil || moving.Moving == nil || moving.Moving.Claim != claim || again == nil || again.ID != first.ID {
		t.Fatalf("cut of an unstaged volume: %+v, %+v, %v: want the volume marked moving and the first snapshot", again, moving, err)
	}
	_, err = f.d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: rwop()})
	wantCode(t, err, codes.FailedPrecondition, "stage of a moving volume")
	if !strings.Contains(err.Error(), "being moved to another node") {
		t.Errorf("the refusal does not say why: %v", err)
	}
	// A copy made again (a migration cancelled and started again) takes
	// the mark over: the volume has not changed since.
	other := store.Claim{Namespace: "team-a", Name: "data-moving", UID: "0b1c2d3e-0000-4000-8000-00000000000c"}
	if _, none, moving, err := f.d.CutForMove(id, other); err != nil || none != nil || moving == nil || moving.Moving.Claim != other {
		t.Fatalf("the copy made again of a moving volume: %+v, %+v, %v: want the volume, marked moving for the new copy", none, moving, err)
	}
	_, err = f.d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: rwop()})
	wantCode(t, err, codes.FailedPrecondition, "stage of a volume moving for the new copy")
	// A sweep that judged the first copy's mark over, but read the
	// volume before the new copy took it, clears nothing: the new copy's
	// mark stays, and the volume still cannot be staged.
	if err := p.ClearMoving(id, "0b1c2d3e-0000-4000-8000-00000000000b"); err != nil {
		t.Fatal(err)
	}
	_, err = f.d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: rwop()})
	wantCode(t, err, codes.FailedPrecondition, "stage of a volume moving for the new copy, after a stale clear of the old copy's mark")
	if err := p.ClearMoving(id, other.UID); err != nil {
		t.Fatal(err)
	}
	if _, err := f.d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: rwop()}); err != nil {
		t.Fatalf("stage once the mark is cleared: %v", err)
	}
}

// The sweep deletes a volume pulled for a claim that is gone only if its
// check, asked again under the volume's locks with the volume read again,
// says so.
func TestDeleteUnclaimed(t *testing.T) {
	ctx := context.Background()
	f := newFakeNode(t)
	v, err := f.d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pulled", CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{rwop()}})
	if err != nil {
		t.Fatal(err)
	}
	id := v.GetVolume().GetVolumeId()
	name, _ := pool.PoolOf(id)
	p := f.d.pools[name].Pool
	claim := store.Claim{Namespace: "team-a", Name: "pulled", UID: "0b1c2d3e-0000-4000-8000-00000000000d"}
	if _, err := p.Store().Update(id, func(v *store.Volume) error { v.PulledFor = &claim; return nil }); err != nil {
		t.Fatal(err)
	}
	wanted := errors.New("a PV names it now")
	var asked *store.Volume
	err = f.d.DeleteUnclaimed(ctx, id, func(v *store.Volume) error { asked = v; return wanted })
	if !errors.Is(err, wanted) || asked == nil || asked.PulledFor == nil || *asked.PulledFor != claim {
		t.Fatalf("delete refused by its check: %v, asked about %+v", err, asked)
	}
	if _, err := p.ReadyVolume(id); err != nil {
		t.Fatalf("the volume its check kept: %v", err)
	}
	if err := f.d.DeleteUnclaimed(ctx, id, func(*store.Volume) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Store().Volume(id); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the volume after its check allowed the delete: %v", err)
	}
	if err := f.d.DeleteUnclaimed(ctx, "pv-0123456789abcdef0123456f", func(*store.Volume) error { return nil }); !errors.Is(err, errkind.ErrNotFound) {
		t.Fatalf("a volume this node does not hold: %v, want not found", err)
	}
}

// On a pool without reflink a snapshot is a copy, made with the volume's
// filesystem frozen: a migration's first copy would stop the pod's writes
// for the whole copy. None is cut: the data is copied once the pod is gone.
func TestCutForMoveOnACopyPool(t *testing.T) {
	ctx := context.Background()
	f := newFakeNode(t)
	id, staging := f.createStaged(nil)
	claim := store.Claim{Namespace: "team-a", Name: "data-moving", UID: "0b1c2d3e-0000-4000-8000-00000000000d"}
	if _, first, moving, err := f.d.CutForMove(id, claim); !errors.Is(err, errkind.ErrInUse) || first != nil || moving != nil || !strings.Contains(err.Error(), "no reflink") {
		t.Fatalf("cut of a staged volume on a copy pool: %+v, %+v, %v; want none, in use, saying why", first, moving, err)
	}
	if log := f.dev.FreezeLog(); len(log) != 0 {
		t.Errorf("the volume was frozen: %v", log)
	}
	if _, err := f.d.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	if _, first, moving, err := f.d.CutForMove(id, claim); err != nil || first != nil || moving == nil {
		t.Fatalf("cut of the unstaged volume: %+v, %+v, %v; want the volume whole, marked moving", first, moving, err)
	}
}
