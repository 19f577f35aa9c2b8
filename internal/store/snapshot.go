package store

import (
	"encoding/binary"
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
	// GroupID is the group snapshot this snapshot was cut in, if any:
	// it is deleted with its group, not alone.
	GroupID string `json:"groupId,omitempty"`
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

// DeleteSnapshot forgets the snapshot, and remembers for DeletedRetention
// that it was deleted here (DeletedSnapshot).
func (s *Store) DeleteSnapshot(id string) error { return s.snapshots.delete(id) }

// DeletedRetention is how long a snapshot's deletion is remembered: much
// longer than a CSI sidecar retries a call whose answer it missed (minutes),
// and short enough that the memory stays small (a record of some 60 bytes
// per snapshot deleted in that time).
const DeletedRetention = 7 * 24 * time.Hour

// DeletedSnapshot tells whether the snapshot was deleted from this store
// within DeletedRetention. A snapshot id is made by one pool and never
// again, so a handle that names no node can be told apart here: a snapshot
// this pool holds, one it deleted (a repeated delete is done), or one it
// never held (it is on another node).
func (s *Store) DeletedSnapshot(id string) (deleted bool, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		deleted = tx.Bucket(bucketDeletedSnapshots).Get([]byte(id)) != nil
		return nil
	})
	return deleted, err
}

// rememberDeleted records the deletion of snapshot id at now and forgets
// the deletions older than DeletedRetention, oldest first: each call trims
// what has aged since the last, so the memory never grows past the
// retention's worth.
func rememberDeleted(tx *bolt.Tx, id string, now time.Time) error {
	byID, byTime := tx.Bucket(bucketDeletedSnapshots), tx.Bucket(bucketDeletedSnapshotTimes)
	key := func(t time.Time, id string) []byte {
		return append(binary.BigEndian.AppendUint64(nil, uint64(t.UnixNano())), id...)
	}
	cutoff := key(now.Add(-DeletedRetention), "")
	c := byTime.Cursor()
	for k, _ := c.First(); k != nil && string(k) < string(cutoff); k, _ = c.First() {
		if len(k) > 8 {
			if err := byID.Delete(k[8:]); err != nil {
				return err
			}
		}
		if err := c.Delete(); err != nil {
			return err
		}
	}
	if old := byID.Get([]byte(id)); len(old) == 8 {
		if err := byTime.Delete(append(old[:8:8], id...)); err != nil {
			return err
		}
	}
	k := key(now, id)
	if err := byTime.Put(k, nil); err != nil {
		return err
	}
	return byID.Put([]byte(id), k[:8])
}
