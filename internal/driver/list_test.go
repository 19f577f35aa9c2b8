package driver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/podvol/podvol/internal/names"
	"github.com/podvol/podvol/internal/store"
)

func randomHex() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b) // never fails
	return hex.EncodeToString(b)
}

// addVolumes writes n volumes in state straight into the store, as a pool
// that has been serving a while holds them: creating them through the pool
// would only add image files that the listing and accounting never read.
func (f *fakeNode) addVolumes(n int, state string) []string {
	f.t.Helper()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = "pv-" + randomHex()
		err := f.pool("").Store().Create(&store.Volume{ID: ids[i], Name: "bulk-" + ids[i], SizeBytes: 1 << 20, FsType: "ext4",
			Parameters: map[string]string{names.ParamFsType: "ext4"}, State: state, Created: time.Now().UTC()})
		if err != nil {
			f.t.Fatal(err)
		}
	}
	return ids
}

func (f *fakeNode) addSnapshots(n int, source string) {
	f.t.Helper()
	for range n {
		id := "snap-" + randomHex()
		if err := f.pool("").Store().CreateSnapshot(&store.Snapshot{ID: id, Name: "bulk-" + id, SourceID: source, SizeBytes: 1 << 20,
			FsType: "ext4", State: store.Ready, Created: time.Now().UTC()}); err != nil {
			f.t.Fatal(err)
		}
	}
}

// Issue 13: GetCapacity and a ListVolumes or ListSnapshots page cost the same
// with 1,000 volumes and snapshots as with 10, counted in allocations (which
// follow the records decoded, and unlike time do not vary from run to run).
// Before the fix each of them decoded every record in the store: this test
// then failed with ~100× the allocations at 1,000.
func TestCallsCostTheSameAtAnyVolumeCount(t *testing.T) {
	ctx := context.Background()
	capReq := &csi.GetCapacityRequest{VolumeCapabilities: []*csi.VolumeCapability{rwop()},
		AccessibleTopology: &csi.Topology{Segments: map[string]string{names.TopologyKey: "node-1"}}}
	cost := func(n int) (capacity, volPage, snapPage float64) {
		f := newFakeNode(t)
		f.addVolumes(n, store.Ready)
		f.addSnapshots(n, "pv-"+randomHex())
		capacity = testing.AllocsPerRun(20, func() {
			if _, err := f.d.GetCapacity(ctx, capReq); err != nil {
				t.Fatal(err)
			}
		})
		// Each call continues where the last stopped: pages from all
		// over the id range.
		token := ""
		volPage = testing.AllocsPerRun(20, func() {
			r, err := f.d.ListVolumes(ctx, &csi.ListVolumesRequest{MaxEntries: 10, StartingToken: token})
			if err != nil || len(r.GetEntries()) != 10 {
				t.Fatalf("ListVolumes at %q: %d entries, %v", token, len(r.GetEntries()), err)
			}
			token = r.GetNextToken()
		})
		token = ""
		snapPage = testing.AllocsPerRun(20, func() {
			r, err := f.d.ListSnapshots(ctx, &csi.ListSnapshotsRequest{MaxEntries: 10, StartingToken: token})
			if err != nil || len(r.GetEntries()) != 10 {
				t.Fatalf("ListSnapshots at %q: %d entries, %v", token, len(r.GetEntries()), err)
			}
			token = r.GetNextToken()
		})
		return capacity, volPage, snapPage
	}
	c10, v10, s10 := cost(10)
	c1000, v1000, s1000 := cost(1000)
	for _, c := range []struct {
		what     string
		at10, at float64
	}{
		{"GetCapacity", c10, c1000},
		{"a ListVolumes page of 10", v10, v1000},
		{"a ListSnapshots page of 10", s10, s1000},
	} {
		t.Logf("%s: %.0f allocations with 10 volumes and snapshots, %.0f with 1,000", c.what, c.at10, c.at)
		if c.at > 2*c.at10 {
			t.Errorf("%s allocates %.0f times with 1,000 volumes and snapshots, %.0f with 10: its cost follows the store, not the call", c.what, c.at, c.at10)
		}
	}
}

// The starting token is a cursor (CSI: "an invalid token is ABORTED"; a
// listing stays right while volumes come and go): every volume that exists
// through a whole listing is listed exactly once, whatever is created or
// deleted between its pages, including the volume the token names.
func TestListingPagesAreCursors(t *testing.T) {
	ctx := context.Background()
	f := newFakeNode(t)
	s := f.pool("").Store()
	all := map[string]bool{}
	for _, id := range f.addVolumes(40, store.Ready) {
		all[id] = true
	}
	// Volumes being created or deleted are not listed.
	f.addVolumes(5, store.Creating)
	f.addVolumes(5, store.Deleting)

	stayed := map[string]bool{}
	for id := range all {
		stayed[id] = true
	}
	listed := map[string]int{}
	token, pages := "", 0
	for {
		r, err := f.d.ListVolumes(ctx, &csi.ListVolumesRequest{MaxEntries: 7, StartingToken: token})
		if err != nil {
			t.Fatalf("page %d at %q: %v", pages, token, err)
		}
		if pages++; pages > 50 {
			t.Fatal("the listing does not end")
		}
		if len(r.GetEntries()) > 7 {
			t.Fatalf("page of %d entries, max_entries 7", len(r.GetEntries()))
		}
		for _, e := range r.GetEntries() {
			id := e.GetVolume().GetVolumeId()
			if !all[id] {
				t.Fatalf("listed %s, which is not a ready volume", id)
			}
			listed[id]++
		}
		if token = r.GetNextToken(); token == "" {
			break
		}
		// Between pages: the volume the token names goes, and so do
		// one already listed and one not yet; new ones come, anywhere
		// in the id order.
		must(t, s.Delete(token))
		delete(stayed, token)
		for id := range stayed {
			if listed[id] > 0 {
				must(t, s.Delete(id))
				delete(stayed, id)
				break
			}
		}
		for id := range stayed {
			if listed[id] == 0 && id > token {
				must(t, s.Delete(id))
				delete(stayed, id)
				break
			}
		}
		for _, id := range f.addVolumes(3, store.Ready) {
			all[id] = true
		}
	}
	for id, n := range listed {
		if n != 1 {
			t.Errorf("%s listed %d times", id, n)
		}
	}
	for id := range stayed {
		if listed[id] != 1 {
			t.Errorf("%s existed through the whole listing and was not listed", id)
		}
	}
	if pages < 5 {
		t.Fatalf("only %d pages: the test did not page", pages)
	}

	// The same cursor serves ControllerListVolumeHealth and ListSnapshots.
	src := f.addVolumes(1, store.Ready)[0]
	f.addSnapshots(12, src)
	f.addSnapshots(3, "pv-"+randomHex())
	got := 0
	for token := ""; ; {
		r, err := f.d.ListSnapshots(ctx, &csi.ListSnapshotsRequest{SourceVolumeId: src, MaxEntries: 5, StartingToken: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range r.GetEntries() {
			if e.GetSnapshot().GetSourceVolumeId() != src {
				t.Fatalf("listed %v for source %s", e.GetSnapshot(), src)
			}
			got++
		}
		if token = r.GetNextToken(); token == "" {
			break
		}
	}
	if got != 12 {
		t.Fatalf("listed %d snapshots of %s, want 12", got, src)
	}
	h, err := f.d.ControllerListVolumeHealth(ctx, &csi.ControllerListVolumeHealthRequest{MaxEntries: 2})
	if err != nil || len(h.GetEntries()) != 2 || h.GetNextToken() == "" {
		t.Fatalf("ControllerListVolumeHealth: %v, %v", h, err)
	}

	// Tokens this plugin cannot have issued are ABORTED; a well-formed
	// one whose volume has gone is an ordinary place to continue from.
	for _, tok := range []string{"garbage", "10", "snap-" + randomHex(), "pv-" + randomHex()[1:]} {
		_, err := f.d.ListVolumes(ctx, &csi.ListVolumesRequest{StartingToken: tok})
		wantCode(t, err, codes.Aborted, fmt.Sprintf("ListVolumes from %q", tok))
	}
	for _, tok := range []string{"garbage", "pv-" + randomHex()} {
		_, err := f.d.ListSnapshots(ctx, &csi.ListSnapshotsRequest{StartingToken: tok})
		wantCode(t, err, codes.Aborted, fmt.Sprintf("ListSnapshots from %q", tok))
	}
	_, err = f.d.ListVolumes(ctx, &csi.ListVolumesRequest{MaxEntries: -1})
	wantCode(t, err, codes.InvalidArgument, "ListVolumes with max_entries -1")
	if _, err := f.d.ListVolumes(ctx, &csi.ListVolumesRequest{StartingToken: "pv-" + randomHex()}); err != nil {
		t.Fatalf("ListVolumes from the id of a volume that has gone: %v", err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
