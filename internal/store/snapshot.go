package store

import "time"

// Snapshot is a point-in-time copy of a volume, kept as its own image. It
// outlives its source volume.
type Snapshot struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	SourceID  string    `json:"sourceId"`
	SizeBytes int64     `json:"sizeBytes"`
	FsType    string    `json:"fsType"`
	State     string    `json:"state"` // Creating, Ready, Deleting
	Created   time.Time `json:"created"`
}

// Snapshot returns the snapshot with id.
func (s *Store) Snapshot(id string) (*Snapshot, error) { return s.snapshots.get(id) }

// SnapshotByName returns the snapshot created under the CSI name.
func (s *Store) SnapshotByName(name string) (*Snapshot, error) { return s.snapshots.byName(name) }

// Snapshots returns every snapshot, ordered by id.
func (s *Store) Snapshots() ([]*Snapshot, error) { return s.snapshots.list() }

// SnapshotPage is VolumePage for snapshots.
func (s *Store) SnapshotPage(start string, limit int, keep func(*Snapshot) bool) ([]*Snapshot, string, error) {
	return s.snapshots.page(start, limit, keep)
}

// CreateSnapshot stores a new snapshot; the name must be free.
func (s *Store) CreateSnapshot(snap *Snapshot) error { return s.snapshots.create(snap) }

// UpdateSnapshot reads, changes and writes back a snapshot atomically.
func (s *Store) UpdateSnapshot(id string, fn func(*Snapshot)) (*Snapshot, error) {
	return s.snapshots.update(id, func(snap *Snapshot) error { fn(snap); return nil })
}

// DeleteSnapshot forgets the snapshot.
func (s *Store) DeleteSnapshot(id string) error { return s.snapshots.delete(id) }
