package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	bolt "go.etcd.io/bbolt"
)

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
func (s *Store) Snapshot(id string) (*Snapshot, error) {
	var snap *Snapshot
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		snap, err = getSnapshot(tx, id)
		return err
	})
	return snap, err
}

// SnapshotByName returns the snapshot created under the CSI name.
func (s *Store) SnapshotByName(name string) (*Snapshot, error) {
	var snap *Snapshot
	err := s.db.View(func(tx *bolt.Tx) error {
		id := tx.Bucket(bucketSnapshotNames).Get([]byte(name))
		if id == nil {
			return ErrNotFound
		}
		var err error
		snap, err = getSnapshot(tx, string(id))
		return err
	})
	return snap, err
}

// Snapshots returns every snapshot, ordered by id.
func (s *Store) Snapshots() ([]*Snapshot, error) {
	var out []*Snapshot
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSnapshots).ForEach(func(k, val []byte) error {
			snap := &Snapshot{}
			if err := json.Unmarshal(val, snap); err != nil {
				return fmt.Errorf("decode snapshot %s: %w", k, err)
			}
			out = append(out, snap)
			return nil
		})
	})
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, err
}

// CreateSnapshot stores a new snapshot; the name must be free.
func (s *Store) CreateSnapshot(snap *Snapshot) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketSnapshotNames).Get([]byte(snap.Name)) != nil {
			return fmt.Errorf("snapshot name %q: %w", snap.Name, errExists)
		}
		if err := tx.Bucket(bucketSnapshotNames).Put([]byte(snap.Name), []byte(snap.ID)); err != nil {
			return err
		}
		return putSnapshot(tx, snap)
	})
}

// UpdateSnapshot reads, changes and writes back a snapshot atomically.
func (s *Store) UpdateSnapshot(id string, fn func(*Snapshot)) (*Snapshot, error) {
	var snap *Snapshot
	err := s.db.Update(func(tx *bolt.Tx) error {
		var err error
		if snap, err = getSnapshot(tx, id); err != nil {
			return err
		}
		fn(snap)
		return putSnapshot(tx, snap)
	})
	return snap, err
}

// DeleteSnapshot forgets the snapshot.
func (s *Store) DeleteSnapshot(id string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		snap, err := getSnapshot(tx, id)
		if errors.Is(err, ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := tx.Bucket(bucketSnapshotNames).Delete([]byte(snap.Name)); err != nil {
			return err
		}
		return tx.Bucket(bucketSnapshots).Delete([]byte(id))
	})
}

func getSnapshot(tx *bolt.Tx, id string) (*Snapshot, error) {
	b := tx.Bucket(bucketSnapshots).Get([]byte(id))
	if b == nil {
		return nil, ErrNotFound
	}
	snap := &Snapshot{}
	if err := json.Unmarshal(b, snap); err != nil {
		return nil, fmt.Errorf("decode snapshot %s: %w", id, err)
	}
	return snap, nil
}

func putSnapshot(tx *bolt.Tx, snap *Snapshot) error {
	b, err := json.Marshal(snap)
	if err != nil {
		return err
	}
	return tx.Bucket(bucketSnapshots).Put([]byte(snap.ID), b)
}
