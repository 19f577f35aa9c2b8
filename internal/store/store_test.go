package store

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

func TestStorePersistsAndIndexesNames(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	v := &Volume{ID: "pv-1", Name: "a", SizeBytes: 10, State: Creating}
	if err := s.Create(v); err != nil {
		t.Fatal(err)
	}
	if err := s.Create(&Volume{ID: "pv-2", Name: "a"}); !IsExists(err) {
		t.Fatalf("second volume of one name: %v", err)
	}
	if err := s.CreateSnapshot(&Snapshot{ID: "snap-1", Name: "a", SourceID: "pv-1"}); err != nil {
		t.Fatalf("a snapshot may share a volume's name: %v", err)
	}
	if err := s.CreateSnapshot(&Snapshot{ID: "snap-2", Name: "a"}); !IsExists(err) {
		t.Fatalf("second snapshot of one name: %v", err)
	}
	if _, err := s.Update("pv-1", func(v *Volume) error { v.State = Ready; v.Stage = &Stage{Path: "/s", State: Staged}; return nil }); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// A second opener is refused while the first holds the store.
	s, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Open(path); err == nil || !strings.Contains(err.Error(), "another podvol-plugin") {
		t.Fatalf("second opener: %v", err)
	}
	got, err := s.VolumeByName("a")
	if err != nil || got.State != Ready || got.Stage.Path != "/s" {
		t.Fatalf("after reopen: %+v, %v", got, err)
	}
	if err := s.Delete("pv-1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete("pv-1"); err != nil {
		t.Fatalf("second delete: %v", err)
	}
	if _, err := s.VolumeByName("a"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("name index kept a deleted volume: %v", err)
	}
	if vols, _ := s.Volumes(); len(vols) != 0 {
		t.Fatalf("volumes left: %v", vols)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// A page starts at its cursor, whether or not a record has that id, and
// names the first record of the next page.
func TestPagesStartAtTheirCursor(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	}()
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		state := Ready
		if id == "b" {
			state = Creating
		}
		if err := s.Create(&Volume{ID: id, Name: id, SizeBytes: 1, State: state}); err != nil {
			t.Fatal(err)
		}
	}
	ready := func(v *Volume) bool { return v.State == Ready }
	for _, c := range []struct {
		start string
		limit int
		want  string
		next  string
	}{
		{"", 2, "a c", "d"},
		{"bb", 2, "c d", "e"},
		{"d", 2, "d e", ""},
		{"", 0, "a c d e", ""},
		{"f", 2, "", ""},
	} {
		vols, next, err := s.VolumePage(c.start, c.limit, ready)
		var ids []string
		for _, v := range vols {
			ids = append(ids, v.ID)
		}
		if err != nil || strings.Join(ids, " ") != c.want || next != c.next {
			t.Errorf("page from %q, at most %d: %v next %q, %v; want %s next %q", c.start, c.limit, ids, next, err, c.want, c.next)
		}
	}
	if u := s.Usage(); u.Volumes != 5 || u.VolumeBytes != 5 {
		t.Fatalf("usage %+v", u)
	}
}

// A snapshot deleted here is remembered as such for good, across a reopen
// and however much later: a handle that names no node may be sent here to
// be deleted again long after (a retained VolumeSnapshotContent deleted at
// last, an import of an old handle), and only this record tells "deleted
// here" (done) from "never here" (issue 25, review of item 8).
func TestDeletedSnapshotsAreRemembered(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSnapshot(&Snapshot{ID: "snap-1", Name: "a"}); err != nil {
		t.Fatal(err)
	}
	if d, err := s.DeletedSnapshot("snap-1"); err != nil || d {
		t.Fatalf("a snapshot held: deleted %v, %v", d, err)
	}
	if err := s.DeleteSnapshot("snap-1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = Open(path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	if d, err := s.DeletedSnapshot("snap-1"); err != nil || !d {
		t.Fatalf("a snapshot just deleted: deleted %v, %v", d, err)
	}
	if d, _ := s.DeletedSnapshot("snap-2"); d {
		t.Fatal("a snapshot never held is remembered as deleted")
	}
	// Deletions a week and more later forget nothing.
	now := time.Now()
	remember := func(id string, at time.Time) {
		t.Helper()
		if err := s.db.Update(func(tx *bolt.Tx) error { return rememberDeleted(tx, id, at) }); err != nil {
			t.Fatal(err)
		}
	}
	remember("snap-old", now.Add(3*time.Hour))
	remember("snap-new", now.Add(8*24*time.Hour))
	for id, want := range map[string]bool{"snap-1": true, "snap-old": true, "snap-new": true, "snap-2": false} {
		if d, _ := s.DeletedSnapshot(id); d != want {
			t.Fatalf("%s remembered as deleted: %v, want %v", id, d, want)
		}
	}
}
