package store

import (
	"encoding/binary"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Snapshot is a point-in-time copy of a volume, kept as its own image. It
// outlives its source volume.
type Snapshot struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	SourceID  string `json:"sourceId"`
	SizeBytes int64  `json:"sizeBytes"`
	// HeldBytes, if set, is what the snapshot takes of its pool's
	// capacity: the blocks its image held when it was cut. A snapshot's
	// image never changes, so that is all it can ever pin; its source's
	// later writes go to blocks its source's own size pays for. Set for
	// the snapshots cut for a transfer (For); a VolumeSnapshot's counts
	// its full size (Held), as `kubectl podvol status` adds it up from the
	// API's restore sizes.
	HeldBytes *int64    `json:"heldBytes,omitempty"`
	FsType    string    `json:"fsType"`
	State     string    `json:"state"` // Creating, Ready, Deleting
	Created   time.Time `json:"created"`
	// GroupID is the group snapshot this snapshot was cut in, if any:
	// it is deleted with its group, not alone.
	GroupID string `json:"groupId,omitempty"`
	// Namespace is the namespace of the volume the snapshot was cut from
	// (its Volume.Namespace, "" when not known): the data is that
	// namespace's, and only its claims may pull it from another node
	// (mobility.ClaimAuthorizer).
	Namespace string `json:"namespace,omitempty"`
	// For is the claim on another node that this snapshot was cut for, to
	// be pulled from (a clone that moves): it is not a VolumeSnapshot's,
	// and goes once the claim is bound or gone.
	For *Claim `json:"for,omitempty"`
}

// Held is what the snapshot takes of its pool's capacity (HeldBytes, or
// its full size for a record without it).
func (s *Snapshot) Held() int64 {
	if s.HeldBytes != nil {
		return *s.HeldBytes
	}
	return s.SizeBytes
}

// Claim names a PersistentVolumeClaim, as of its UID.
type Claim struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
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

// DeleteSnapshot forgets the snapshot, and remembers that it was deleted
// here (DeletedSnapshot).
func (s *Store) DeleteSnapshot(id string) error { return s.snapshots.delete(id) }

// DeletedSnapshot tells whether the snapshot was deleted from this store. A
// snapshot id is made by one pool and never again, so a handle that names
// no node can be told apart here: a snapshot this pool holds, one it
// deleted (a repeated delete is done, however late), or one it never held
// since DeletionsRecordedSince. The record is for good: a handle may be
// deleted again long after (a retained VolumeSnapshotContent deleted at
// last, an old handle imported), and some 40 bytes per snapshot ever
// deleted on the node is little.
func (s *Store) DeletedSnapshot(id string) (deleted bool, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		deleted = tx.Bucket(bucketDeletedSnapshots).Get([]byte(id)) != nil
		return nil
	})
	return deleted, err
}

// DeletionsRecordedSince tells since when this store has recorded every
// snapshot it deleted: always (from its making) or only since the time
// given, when a plugin from before the record was kept (or trimmed it
// after a week) made the store. A snapshot deleted before that may be
// missing from DeletedSnapshot.
func (s *Store) DeletionsRecordedSince() (since time.Time, always bool) {
	return s.deletionsSince, s.deletionsSince.IsZero()
}

// MissedDeletionsBefore records that snapshots may have been deleted from
// this pool before t without this store knowing (it replaces a lost one):
// DeletionsRecordedSince is then t, unless it was later already.
func (s *Store) MissedDeletionsBefore(t time.Time) error {
	if !s.deletionsSince.IsZero() && !s.deletionsSince.Before(t) {
		return nil
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(keyDeletionsSince, binary.BigEndian.AppendUint64(nil, uint64(t.UnixNano())))
	})
	if err == nil {
		s.deletionsSince = t
	}
	return err
}

// rememberDeleted records the deletion of snapshot id at now.
func rememberDeleted(tx *bolt.Tx, id string, now time.Time) error {
	return tx.Bucket(bucketDeletedSnapshots).Put([]byte(id), binary.BigEndian.AppendUint64(nil, uint64(now.UnixNano())))
}

// deletionsSince reads, or on the first open records, since when the store
// records its snapshot deletions (DeletionsRecordedSince): the zero time
// for a store made here, now for one a plugin from before made. Stores
// made before this record trimmed their deletions older than a week
// (bucket deleted-snapshot-times indexed them by time): that index goes.
func deletionsSince(tx *bolt.Tx, made bool, now time.Time) (time.Time, error) {
	meta, err := tx.CreateBucketIfNotExists(bucketMeta)
	if err != nil {
		return time.Time{}, err
	}
	v := meta.Get(keyDeletionsSince)
	if len(v) != 8 {
		var n int64 // 0: since the store was made
		if !made {
			n = now.UnixNano()
		}
		if tx.Bucket(bucketDeletedSnapshotTimes) != nil {
			if err := tx.DeleteBucket(bucketDeletedSnapshotTimes); err != nil {
				return time.Time{}, err
			}
		}
		v = binary.BigEndian.AppendUint64(nil, uint64(n))
		if err := meta.Put(keyDeletionsSince, v); err != nil {
			return time.Time{}, err
		}
	}
	// Written above from a positive UnixNano: it fits an int64.
	if n := int64(binary.BigEndian.Uint64(v)); n != 0 { //nolint:gosec // G115: see above
		return time.Unix(0, n), nil
	}
	return time.Time{}, nil
}
