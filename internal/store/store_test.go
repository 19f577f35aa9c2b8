package store

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
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
