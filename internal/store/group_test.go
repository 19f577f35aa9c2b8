package store

import (
	"errors"
	"path/filepath"
	"testing"
)

// A group and its members are written in one transaction: a member whose
// name is taken leaves neither the group nor any member, nor a change in the
// ledger; a state change reaches the group and every member together.
func TestGroupIsAllOrNothing(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	if err := s.CreateSnapshot(&Snapshot{ID: "snap-x", Name: "taken", SizeBytes: 5, State: Ready}); err != nil {
		t.Fatal(err)
	}
	before := s.Usage()
	g := &Group{ID: "group-1", Name: "g", State: Creating, Members: []GroupMember{{SourceID: "pv-1", SnapshotID: "snap-1"}, {SourceID: "pv-2", SnapshotID: "snap-2"}}}
	snaps := []*Snapshot{{ID: "snap-1", Name: "m1", SizeBytes: 10, GroupID: "group-1"}, {ID: "snap-2", Name: "taken", SizeBytes: 20, GroupID: "group-1"}}
	if err := s.CreateGroup(g, snaps); !IsExists(err) {
		t.Fatalf("a group with a taken member name: %v", err)
	}
	if _, err := s.Group("group-1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("group written although a member failed: %v", err)
	}
	if _, err := s.Snapshot("snap-1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("member written although another failed: %v", err)
	}
	if s.Usage() != before {
		t.Fatalf("ledger %+v after a failed group, want %+v", s.Usage(), before)
	}

	snaps[1].Name = "m2"
	if err := s.CreateGroup(g, snaps); err != nil {
		t.Fatal(err)
	}
	if u := s.Usage(); u.Snapshots != before.Snapshots+2 || u.SnapshotBytes != before.SnapshotBytes+30 {
		t.Fatalf("ledger %+v, want two more snapshots of 30 bytes in all", u)
	}
	if _, err := s.SetGroupState("group-1", Ready); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"snap-1", "snap-2"} {
		if m, err := s.Snapshot(id); err != nil || m.State != Ready {
			t.Fatalf("member %s: %+v, %v", id, m, err)
		}
	}
	if got, err := s.GroupByName("g"); err != nil || got.State != Ready {
		t.Fatalf("group: %+v, %v", got, err)
	}
	if was, counted, err := s.Recount(); err != nil || was != counted {
		t.Fatalf("recount: ledger %+v, records %+v, %v", was, counted, err)
	}
}
