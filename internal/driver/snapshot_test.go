package driver

import (
	"context"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/podvol/podvol/internal/snaphandle"
)

// A snapshot's handle names its node, so that an imported
// VolumeSnapshotContent can be routed to it; this node answers for its own
// handles and for handles that name no node, and never for another node's:
// a delete there is refused rather than reported done.
func TestSnapshotHandlesNameTheirNode(t *testing.T) {
	ctx := context.Background()
	f := newFakeNode(t)
	id, _ := f.createStaged(nil)
	s, err := f.d.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap", SourceVolumeId: id})
	if err != nil {
		t.Fatal(err)
	}
	h := s.GetSnapshot().GetSnapshotId()
	poolID, node := snaphandle.Parse(h)
	if node != "node-1" {
		t.Fatalf("snapshot handle %q names node %q, want node-1", h, node)
	}
	for _, handle := range []string{h, poolID} {
		g, err := f.d.GetSnapshot(ctx, &csi.GetSnapshotRequest{SnapshotId: handle})
		if err != nil || g.GetSnapshot().GetSnapshotId() != h {
			t.Fatalf("GetSnapshot(%q): %v, %v", handle, g, err)
		}
		l, err := f.d.ListSnapshots(ctx, &csi.ListSnapshotsRequest{SnapshotId: handle})
		if err != nil || len(l.GetEntries()) != 1 || l.GetEntries()[0].GetSnapshot().GetSnapshotId() != h {
			t.Fatalf("ListSnapshots(%q): %v, %v", handle, l, err)
		}
	}
	restored, err := f.d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "restored", CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{rwop()}, VolumeContentSource: fromSnapshot(h)})
	if err != nil {
		t.Fatal(err)
	}
	if got := restored.GetVolume().GetContentSource().GetSnapshot().GetSnapshotId(); got != h {
		t.Fatalf("restored volume's source: %q, want %q", got, h)
	}

	elsewhere := snaphandle.Format(poolID, "node-2")
	_, err = f.d.GetSnapshot(ctx, &csi.GetSnapshotRequest{SnapshotId: elsewhere})
	wantCode(t, err, codes.NotFound, "GetSnapshot of node-2's handle")
	if l, err := f.d.ListSnapshots(ctx, &csi.ListSnapshotsRequest{SnapshotId: elsewhere}); err != nil || len(l.GetEntries()) != 0 {
		t.Fatalf("ListSnapshots of node-2's handle: %v, %v", l, err)
	}
	_, err = f.d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "from-elsewhere", CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{rwop()}, VolumeContentSource: fromSnapshot(elsewhere)})
	wantCode(t, err, codes.NotFound, "restore from node-2's handle")
	_, err = f.d.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: elsewhere})
	wantCode(t, err, codes.FailedPrecondition, "delete of node-2's handle")
	if !strings.Contains(err.Error(), "node-2") {
		t.Fatalf("the refusal does not say where the snapshot is: %v", err)
	}
	// Same pool id, another node: this node's snapshot was not touched.
	if _, err := f.d.GetSnapshot(ctx, &csi.GetSnapshotRequest{SnapshotId: h}); err != nil {
		t.Fatalf("this node's snapshot after a delete of node-2's handle: %v", err)
	}
	if _, err := f.d.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: h}); err != nil {
		t.Fatal(err)
	}
	_, err = f.d.GetSnapshot(ctx, &csi.GetSnapshotRequest{SnapshotId: h})
	wantCode(t, err, codes.NotFound, "GetSnapshot after delete")
}

func fromSnapshot(id string) *csi.VolumeContentSource {
	return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: id}}}
}

// A handle that names no node (made before handles named nodes, or on a
// node whose name makes the handle too long) reaches whichever node its
// VolumeSnapshotContent is labelled for. Sent to a node that never held it,
// DeleteSnapshot must not report it deleted (issue 25, item 8): the content
// would go and the image stay on its node for ever. The node that held it
// reports it deleted, again and again.
func TestDeleteSnapshotOfAHandleNamingNoNode(t *testing.T) {
	ctx := context.Background()
	f := newFakeNode(t)
	other := newFakeNodeNamed(t, "node-2", false)
	id, _ := f.createStaged(nil)
	s, err := f.d.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap", SourceVolumeId: id})
	if err != nil {
		t.Fatal(err)
	}
	nodeless, _ := snaphandle.Parse(s.GetSnapshot().GetSnapshotId())

	_, err = other.d.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: nodeless})
	wantCode(t, err, codes.FailedPrecondition, "DeleteSnapshot of a handle naming no node, on a node that never held it")
	t.Logf("node-2: %v", err)
	if _, err := f.d.GetSnapshot(ctx, &csi.GetSnapshotRequest{SnapshotId: nodeless}); err != nil {
		t.Fatalf("the snapshot on node-1 after node-2 refused its delete: %v", err)
	}
	for i := range 2 {
		if _, err := f.d.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: nodeless}); err != nil {
			t.Fatalf("DeleteSnapshot %d on the node that held it: %v", i+1, err)
		}
	}
	_, err = f.d.GetSnapshot(ctx, &csi.GetSnapshotRequest{SnapshotId: nodeless})
	wantCode(t, err, codes.NotFound, "GetSnapshot after delete")
	// Still refused on the other node; and an id podvol never makes is
	// no snapshot anywhere (csi-sanity's "reallyfakesnapshotid").
	_, err = other.d.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: nodeless})
	wantCode(t, err, codes.FailedPrecondition, "DeleteSnapshot on node-2 once node-1 deleted it")
	if _, err := other.d.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: "reallyfakesnapshotid"}); err != nil {
		t.Fatalf("DeleteSnapshot of an id podvol never makes: %v", err)
	}
}

// Issue 41: the pool records the namespace of a volume's claim (the
// provisioner's --extra-create-metadata) and a snapshot carries its
// volume's, a group snapshot's members too: the transfer source serves a
// snapshot to another node only for a claim of that namespace.
func TestSnapshotsRecordTheirVolumesNamespace(t *testing.T) {
	ctx := context.Background()
	f := newFakeNode(t)
	params := map[string]string{pvcNamespaceParam: "team-a", pvcNameParam: "data"}
	id, _ := f.createStaged(params)
	if v, err := f.pool("").ReadyVolume(id); err != nil || v.Namespace != "team-a" {
		t.Fatalf("volume %s: %+v, %v; want namespace team-a", id, v, err)
	}
	s, err := f.d.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap", SourceVolumeId: id})
	if err != nil {
		t.Fatal(err)
	}
	g, err := f.d.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "group", SourceVolumeIds: []string{id}})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{s.GetSnapshot().GetSnapshotId(), g.GetGroupSnapshot().GetSnapshots()[0].GetSnapshotId()} {
		sid, _ := snaphandle.Parse(h)
		if snap, err := f.pool("").ReadySnapshot(sid); err != nil || snap.Namespace != "team-a" {
			t.Fatalf("snapshot %s: %+v, %v; want namespace team-a", h, snap, err)
		}
	}
	_, err = f.d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "bad-namespace", Parameters: map[string]string{pvcNamespaceParam: "Team_A"},
		CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20}, VolumeCapabilities: []*csi.VolumeCapability{rwop()}})
	wantCode(t, err, codes.InvalidArgument, "a namespace that is no namespace name")
}
