package driver

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/podvol/podvol/internal/errkind"
	"github.com/podvol/podvol/internal/names"
	"github.com/podvol/podvol/internal/store"
)

// Every copy of a raw block volume in use obeys one rule, whoever asks for
// it: a snapshot, a clone here, or the snapshot a clone or a migration on
// another node pulls (CutForTransfer, CutForMove). Nothing holds its
// writes, so on a pool without reflink each is refused (FAILED_PRECONDITION
// at the CSI edge, errkind.ErrInUse to a transfer: the other node waits
// until no pod uses the volume) and leaves nothing behind; on a reflink
// pool each is cut, one atomic step. Unstaged, it is copied anywhere.
func TestCopiesOfABlockVolumeInUse(t *testing.T) {
	block := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	for _, reflink := range []bool{true, false} {
		t.Run(map[bool]string{true: "reflink", false: "no-reflink"}[reflink], func(t *testing.T) {
			ctx := context.Background()
			f := newFakeNodeReflink(t, reflink)
			v, err := f.d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "blk", CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20},
				VolumeCapabilities: []*csi.VolumeCapability{block}})
			if err != nil {
				t.Fatal(err)
			}
			id := v.GetVolume().GetVolumeId()
			staging := filepath.Join(f.dir("staging"), id)
			if _, err := f.d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: block}); err != nil {
				t.Fatal(err)
			}
			says := []string{id, "raw block volume in use", "no reflink", "stop the pod", "XFS or btrfs"}
			refused := func(what string, err error) {
				t.Helper()
				if reflink {
					if err != nil {
						t.Fatalf("%s on a reflink pool: %v", what, err)
					}
					return
				}
				if err == nil {
					t.Fatalf("%s on a pool without reflink was made", what)
				}
				for _, s := range says {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("%s: the refusal %q does not say %q", what, err, s)
					}
				}
			}
			_, err = f.d.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap", SourceVolumeId: id})
			if !reflink {
				wantCode(t, err, codes.FailedPrecondition, "a snapshot of a raw block volume in use")
			}
			refused("a snapshot", err)
			_, err = f.d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "clone", CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20},
				VolumeCapabilities: []*csi.VolumeCapability{block}, VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: id}}}})
			if !reflink {
				wantCode(t, err, codes.FailedPrecondition, "a clone of a raw block volume in use")
			}
			refused("a clone", err)
			clone := store.Claim{Namespace: "team-a", Name: "clone-elsewhere", UID: "0b1c2d3e-0000-4000-8000-000000000101"}
			_, _, err = f.d.CutForTransfer(id, clone)
			if !reflink && !errors.Is(err, errkind.ErrInUse) {
				t.Fatalf("the cut for a clone on another node: %v, want in use (the other node waits)", err)
			}
			refused("the cut for a clone on another node", err)
			move := store.Claim{Namespace: "team-a", Name: "moved", UID: "0b1c2d3e-0000-4000-8000-000000000102"}
			_, first, moving, err := f.d.CutForMove(id, move)
			if !reflink && (!errors.Is(err, errkind.ErrInUse) || moving != nil || first != nil) {
				t.Fatalf("the cut for a migration's pre-copy: %+v, moving %+v, %v; want in use, nothing cut (the data moves once no pod uses it)", first, moving, err)
			}
			refused("the cut for a migration's pre-copy", err)
			if reflink {
				return
			}
			if snaps, err := f.pool("").Store().Snapshots(); err != nil || len(snaps) != 0 {
				t.Fatalf("the refusals left snapshots %+v (%v)", snaps, err)
			}
			if files := snapshotFiles(t, f); len(files) != 0 {
				t.Fatalf("the refusals left images %v", files)
			}

			// Unstaged, nothing writes it: every copy is made.
			if _, err := f.d.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
				t.Fatal(err)
			}
			if _, err := f.d.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap", SourceVolumeId: id}); err != nil {
				t.Fatal(err)
			}
			if _, _, err := f.d.CutForTransfer(id, clone); err != nil {
				t.Fatal(err)
			}
			if _, _, moving, err := f.d.CutForMove(id, move); err != nil || moving == nil {
				t.Fatalf("the migration of the unstaged volume: moving %+v, %v", moving, err)
			}
		})
	}
}

// A group with two members whose writes nothing holds, here a volume
// assigned to a microVM and a raw block volume, both in use, is no instant
// even on a reflink pool (each is copied at its own): refused, naming them,
// before anything is frozen or cut.
func TestGroupOfAnAssignedAndABlockVolume(t *testing.T) {
	ctx := context.Background()
	f := newFakeNodeReflink(t, true)
	host, hostDev := f.stagedVolume("pvc-host")
	v, err := f.d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-direct", Parameters: map[string]string{names.ParamDirectAssign: "always"},
		CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20}, VolumeCapabilities: []*csi.VolumeCapability{rwop()}})
	if err != nil {
		t.Fatal(err)
	}
	direct := v.GetVolume().GetVolumeId()
	staging := filepath.Join(f.dir("staging"), direct)
	if _, err := f.d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: direct, StagingTargetPath: staging, VolumeCapability: rwop()}); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(f.dir("pods/d"), "mount")
	if _, err := f.d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: direct, StagingTargetPath: staging, TargetPath: target, VolumeCapability: rwop()}); err != nil {
		t.Fatal(err)
	}
	block := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	b, err := f.d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-block", CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{block}})
	if err != nil {
		t.Fatal(err)
	}
	blk := b.GetVolume().GetVolumeId()
	if _, err := f.d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: blk, StagingTargetPath: filepath.Join(f.dir("staging"), blk), VolumeCapability: block}); err != nil {
		t.Fatal(err)
	}
	_, err = f.d.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "group", SourceVolumeIds: []string{host, direct, blk}})
	wantCode(t, err, codes.FailedPrecondition, "a group of an assigned and a raw block volume in use")
	for _, s := range []string{direct, blk, "microVM", "raw block", "one instant", "stop the pods"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("the refusal %q does not say %q", err, s)
		}
	}
	if log := f.dev.FreezeLog(); len(log) != 0 || f.dev.Frozen(hostDev) {
		t.Fatalf("the refused group froze %+v", log)
	}
	if files := snapshotFiles(t, f); len(files) != 0 {
		t.Fatalf("the refused group left images: %v", files)
	}
	// Each with the mounted one is one instant.
	for _, other := range []string{direct, blk} {
		if _, err := f.d.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "group-" + other, SourceVolumeIds: []string{host, other}}); err != nil {
			t.Fatal(err)
		}
	}
}
