package driver

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/podvol/podvol/internal/device/devicetest"
	"github.com/podvol/podvol/internal/names"
	"github.com/podvol/podvol/internal/snaphandle"
)

// stagedVolume is createStaged with a name of its own, for several volumes
// in one test.
func (f *fakeNode) stagedVolume(name string) (id, dev string) {
	f.t.Helper()
	ctx := context.Background()
	v, err := f.d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name,
		CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20}, VolumeCapabilities: []*csi.VolumeCapability{rwop()}})
	if err != nil {
		f.t.Fatal(err)
	}
	id = v.GetVolume().GetVolumeId()
	staging := filepath.Join(f.dir("staging"), id)
	if _, err := f.d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: rwop()}); err != nil {
		f.t.Fatal(err)
	}
	rec, err := f.pool("").Store().Volume(id)
	if err != nil {
		f.t.Fatal(err)
	}
	return id, rec.Stage.Device
}

func snapshotFiles(t *testing.T, f *fakeNode) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(filepath.Dir(f.pool("").SnapshotPath("snap-000000000000000000000000")), "*.img"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// A group snapshot freezes every member in id order, copies each, thaws
// all; it is idempotent by name and members, its members are ordinary
// snapshots that name their group and restore, and it is deleted whole.
func TestGroupSnapshot(t *testing.T) {
	ctx := context.Background()
	f := newFakeNodeReflink(t, true)
	a, devA := f.stagedVolume("pvc-a")
	b, devB := f.stagedVolume("pvc-b")
	ordered := slices.Sorted(slices.Values([]string{a, b}))

	// The class's deletion policy among the parameters, as Kubernetes' e2e
	// suite writes its classes, is tolerated.
	resp, err := f.d.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "group", SourceVolumeIds: []string{b, a},
		Parameters: map[string]string{"deletionPolicy": "Retain"}})
	if err != nil {
		t.Fatal(err)
	}
	g := resp.GetGroupSnapshot()
	if _, node := snaphandle.Parse(g.GetGroupSnapshotId()); node != "node-1" || !g.GetReadyToUse() || len(g.GetSnapshots()) != 2 {
		t.Fatalf("group snapshot: %v", g)
	}
	for _, s := range g.GetSnapshots() {
		if s.GetGroupSnapshotId() != g.GetGroupSnapshotId() || !s.GetReadyToUse() {
			t.Fatalf("member %v does not name its group %s or is not ready", s, g.GetGroupSnapshotId())
		}
	}
	// Frozen in id order, both before the first thaw; all thawed.
	devOf := map[string]string{a: devA, b: devB}
	log := f.dev.FreezeLog()
	want := []devicetest.FreezeEvent{{Dev: devOf[ordered[0]]}, {Dev: devOf[ordered[1]]}, {Thaw: true}, {Thaw: true}}
	if len(log) != len(want) {
		t.Fatalf("freeze log %+v, want two freezes in id order then two thaws", log)
	}
	for i, e := range log {
		if e.Thaw != want[i].Thaw || (!e.Thaw && e.Dev != want[i].Dev) {
			t.Fatalf("freeze log %+v, want two freezes in id order (%s, %s) then two thaws", log, devOf[ordered[0]], devOf[ordered[1]])
		}
	}
	if f.dev.Frozen(devA) || f.dev.Frozen(devB) {
		t.Fatal("a member is still frozen")
	}

	// Idempotent: the same members in any order are the same group.
	again, err := f.d.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "group", SourceVolumeIds: []string{a, b}})
	if err != nil || again.GetGroupSnapshot().GetGroupSnapshotId() != g.GetGroupSnapshotId() {
		t.Fatalf("repeated create: %v, %v", again, err)
	}
	_, err = f.d.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "group", SourceVolumeIds: []string{a}})
	wantCode(t, err, codes.AlreadyExists, "same name, other members")

	// Get, with and without the members' ids.
	var ids []string
	for _, s := range g.GetSnapshots() {
		ids = append(ids, s.GetSnapshotId())
	}
	got, err := f.d.GetVolumeGroupSnapshot(ctx, &csi.GetVolumeGroupSnapshotRequest{GroupSnapshotId: g.GetGroupSnapshotId(), SnapshotIds: ids})
	if err != nil || len(got.GetGroupSnapshot().GetSnapshots()) != 2 {
		t.Fatalf("get: %v, %v", got, err)
	}
	_, err = f.d.GetVolumeGroupSnapshot(ctx, &csi.GetVolumeGroupSnapshotRequest{GroupSnapshotId: g.GetGroupSnapshotId(), SnapshotIds: ids[:1]})
	wantCode(t, err, codes.InvalidArgument, "get with one member missing")
	gid, _ := snaphandle.Parse(g.GetGroupSnapshotId())
	_, err = f.d.GetVolumeGroupSnapshot(ctx, &csi.GetVolumeGroupSnapshotRequest{GroupSnapshotId: snaphandle.Format(gid, "node-2")})
	wantCode(t, err, codes.NotFound, "get of node-2's handle")

	// A member is an ordinary snapshot: it restores, and is listed.
	restored, err := f.d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "restored", CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{rwop()}, VolumeContentSource: fromSnapshot(ids[0])})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: restored.GetVolume().GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
	l, err := f.d.ListSnapshots(ctx, &csi.ListSnapshotsRequest{SnapshotId: ids[1]})
	if err != nil || len(l.GetEntries()) != 1 || l.GetEntries()[0].GetSnapshot().GetGroupSnapshotId() != g.GetGroupSnapshotId() {
		t.Fatalf("list of a member: %v, %v", l, err)
	}
	// ... but it goes with its group, never alone (the spec's code).
	_, err = f.d.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: ids[0]})
	wantCode(t, err, codes.InvalidArgument, "delete of one member")
	// Its name is not a CSI snapshot's to take.
	_, err = f.d.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: gid + "/" + a, SourceVolumeId: a})
	wantCode(t, err, codes.AlreadyExists, "a snapshot named like a member")

	_, err = f.d.DeleteVolumeGroupSnapshot(ctx, &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: g.GetGroupSnapshotId(), SnapshotIds: ids[:1]})
	wantCode(t, err, codes.InvalidArgument, "delete with one member missing")
	for range 2 {
		if _, err := f.d.DeleteVolumeGroupSnapshot(ctx, &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: g.GetGroupSnapshotId(), SnapshotIds: ids}); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range ids {
		_, err := f.d.GetSnapshot(ctx, &csi.GetSnapshotRequest{SnapshotId: id})
		wantCode(t, err, codes.NotFound, "a member after its group's delete")
	}
	if files := snapshotFiles(t, f); len(files) != 0 {
		t.Fatalf("images left after the group's delete: %v", files)
	}
	_, err = f.d.GetVolumeGroupSnapshot(ctx, &csi.GetVolumeGroupSnapshotRequest{GroupSnapshotId: g.GetGroupSnapshotId()})
	wantCode(t, err, codes.NotFound, "get after delete")
	_, err = f.d.DeleteVolumeGroupSnapshot(ctx, &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: snaphandle.Format(gid, "node-2")})
	wantCode(t, err, codes.FailedPrecondition, "delete of node-2's handle")
}

func TestGroupSnapshotRequests(t *testing.T) {
	ctx := context.Background()
	f := newFakeNodeReflink(t, true)
	a, _ := f.stagedVolume("pvc-a")
	unknown := "pv-0123456789abcdef01234567"
	for _, c := range []struct {
		what string
		req  *csi.CreateVolumeGroupSnapshotRequest
		code codes.Code
		says string
	}{
		{"no name", &csi.CreateVolumeGroupSnapshotRequest{SourceVolumeIds: []string{a}}, codes.InvalidArgument, "name"},
		{"no volumes", &csi.CreateVolumeGroupSnapshotRequest{Name: "g"}, codes.InvalidArgument, "source volume"},
		{"a volume twice", &csi.CreateVolumeGroupSnapshotRequest{Name: "g", SourceVolumeIds: []string{a, a}}, codes.InvalidArgument, "twice"},
		{"a parameter", &csi.CreateVolumeGroupSnapshotRequest{Name: "g", SourceVolumeIds: []string{a}, Parameters: map[string]string{"fsType": "xfs"}}, codes.InvalidArgument, "parameters"},
		{"a deletion policy that is none", &csi.CreateVolumeGroupSnapshotRequest{Name: "g", SourceVolumeIds: []string{a}, Parameters: map[string]string{"deletionPolicy": "Keep"}}, codes.InvalidArgument, "parameters"},
		{"only unknown volumes", &csi.CreateVolumeGroupSnapshotRequest{Name: "g", SourceVolumeIds: []string{unknown}}, codes.NotFound, unknown},
		{"volumes here and elsewhere", &csi.CreateVolumeGroupSnapshotRequest{Name: "g", SourceVolumeIds: []string{a, unknown}}, codes.FailedPrecondition, "node-1"},
	} {
		_, err := f.d.CreateVolumeGroupSnapshot(ctx, c.req)
		wantCode(t, err, c.code, c.what)
		if !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v does not say %q", c.what, err, c.says)
		}
	}
	if files := snapshotFiles(t, f); len(files) != 0 {
		t.Fatalf("refused requests left images: %v", files)
	}
	_, err := f.d.GetVolumeGroupSnapshot(ctx, &csi.GetVolumeGroupSnapshotRequest{})
	wantCode(t, err, codes.InvalidArgument, "get without id")
	_, err = f.d.GetVolumeGroupSnapshot(ctx, &csi.GetVolumeGroupSnapshotRequest{GroupSnapshotId: "nope"})
	wantCode(t, err, codes.NotFound, "get of an unknown id")
	_, err = f.d.DeleteVolumeGroupSnapshot(ctx, &csi.DeleteVolumeGroupSnapshotRequest{})
	wantCode(t, err, codes.InvalidArgument, "delete without id")
	if _, err := f.d.DeleteVolumeGroupSnapshot(ctx, &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: "group-0123456789abcdef01234567"}); err != nil {
		t.Fatalf("delete of an unknown group: %v", err)
	}
}

// One deadline for the whole group's freeze: a member whose freeze hangs
// fails the call when it passes, the members frozen before it are thawed
// then (not when the hung freeze returns: it may never), and the hung one
// as soon as its freeze returns; nothing is left behind.
func TestGroupFreezeTimeout(t *testing.T) {
	ctx := context.Background()
	f := newFakeNodeReflink(t, true)
	f.d.cfg.GroupFreezeTimeout = 200 * time.Millisecond
	a, devA := f.stagedVolume("pvc-a")
	b, devB := f.stagedVolume("pvc-b")
	ordered := slices.Sorted(slices.Values([]string{a, b}))
	first, second := map[string]string{a: devA, b: devB}[ordered[0]], map[string]string{a: devA, b: devB}[ordered[1]]
	release := make(chan struct{})
	f.dev.Inject(devicetest.Freeze, func(dev string) error {
		if dev == second {
			<-release
		}
		return nil
	})
	start := time.Now()
	_, err := f.d.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "group", SourceVolumeIds: []string{a, b}})
	wantCode(t, err, codes.DeadlineExceeded, "create while a member's freeze hangs")
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("the call took %s, with a deadline of 200ms", took)
	}
	if f.dev.Frozen(first) {
		close(release)
		t.Fatalf("the deadline passed, and the member frozen before the hung one (%s) is still frozen: its pod's writers wait as long as the hung freeze", first)
	}
	close(release) // the hung freeze takes effect now, late
	deadline := time.Now().Add(5 * time.Second)
	for f.dev.Frozen(devA) || f.dev.Frozen(devB) || f.dev.OpenHandles() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("a member stays frozen (or a handle open) after the deadline: frozen %v %v, handles %d, log %+v", f.dev.Frozen(devA), f.dev.Frozen(devB), f.dev.OpenHandles(), f.dev.FreezeLog())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if files := snapshotFiles(t, f); len(files) != 0 {
		t.Fatalf("the failed group left images: %v", files)
	}
	l, err := f.d.ListSnapshots(ctx, &csi.ListSnapshotsRequest{})
	if err != nil || len(l.GetEntries()) != 0 {
		t.Fatalf("the failed group left snapshots: %v, %v", l, err)
	}
	// And the call succeeds once freezes go through.
	f.dev.Inject(devicetest.Freeze, nil)
	if _, err := f.d.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "group", SourceVolumeIds: []string{a, b}}); err != nil {
		t.Fatal(err)
	}
}

// A failed copy of one member rolls back the whole group and thaws.
func TestGroupCopyFailureRollsBack(t *testing.T) {
	ctx := context.Background()
	f := newFakeNodeReflink(t, true)
	a, devA := f.stagedVolume("pvc-a")
	b, devB := f.stagedVolume("pvc-b")
	f.dev.FailNext(devicetest.CopyImage, errors.New("injected copy failure"))
	_, err := f.d.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "group", SourceVolumeIds: []string{a, b}})
	if err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("create with a failing copy: %v", err)
	}
	if f.dev.Frozen(devA) || f.dev.Frozen(devB) {
		t.Fatal("a member stays frozen after a failed copy")
	}
	if files := snapshotFiles(t, f); len(files) != 0 {
		t.Fatalf("the failed group left images: %v", files)
	}
	if _, err := os.Stat(f.pool("").ImagePath(a)); err != nil {
		t.Fatal(err)
	}
}

// A direct-assigned member follows the rule of a single snapshot of it:
// copied crash-consistent (its device flushed, nothing on the host frozen)
// on a reflink pool, refused without reflink, and then nothing else of the
// group stays frozen or made.
func TestGroupWithAnAssignedMember(t *testing.T) {
	for _, reflink := range []bool{true, false} {
		t.Run(map[bool]string{true: "reflink", false: "no-reflink"}[reflink], func(t *testing.T) {
			ctx := context.Background()
			f := newFakeNodeReflink(t, reflink)
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
			_, err = f.d.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "group", SourceVolumeIds: []string{host, direct}})
			if !reflink {
				wantCode(t, err, codes.FailedPrecondition, "a group with an assigned member on a pool without reflink")
				if f.dev.Frozen(hostDev) {
					t.Fatal("the host member stays frozen after the refusal")
				}
				if files := snapshotFiles(t, f); len(files) != 0 {
					t.Fatalf("the refused group left images: %v", files)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range f.dev.FreezeLog() {
				if !e.Thaw && e.Dev != hostDev {
					t.Fatalf("froze %s, not only the host member's %s: %+v", e.Dev, hostDev, f.dev.FreezeLog())
				}
			}
			if f.dev.Calls(devicetest.SyncDevice) != 1 {
				t.Fatal("the assigned member's device was not flushed for a crash-consistent copy")
			}
		})
	}
}
