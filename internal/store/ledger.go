package store

import (
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"

	bolt "go.etcd.io/bbolt"
)

// Usage is what the records in the store add up to: the pool's capacity
// accounting and the counts its metrics report. Every record counts,
// whatever its state: one being created or deleted still holds its space.
type Usage struct {
	Volumes       int // inline ones included
	InlineVolumes int
	VolumeBytes   int64
	Snapshots     int
	SnapshotBytes int64
}

func (u Usage) plus(o Usage) Usage {
	return Usage{
		Volumes:       u.Volumes + o.Volumes,
		InlineVolumes: u.InlineVolumes + o.InlineVolumes,
		VolumeBytes:   u.VolumeBytes + o.VolumeBytes,
		Snapshots:     u.Snapshots + o.Snapshots,
		SnapshotBytes: u.SnapshotBytes + o.SnapshotBytes,
	}
}

func (u Usage) minus(o Usage) Usage {
	return u.plus(Usage{-o.Volumes, -o.InlineVolumes, -o.VolumeBytes, -o.Snapshots, -o.SnapshotBytes})
}

func volumeUsage(v *Volume) Usage {
	u := Usage{Volumes: 1, VolumeBytes: v.SizeBytes}
	if v.Inline != nil {
		u.InlineVolumes = 1
	}
	return u
}

func snapshotUsage(s *Snapshot) Usage { return Usage{Snapshots: 1, SnapshotBytes: s.Held()} }

// ledger is the running total of Usage, so that capacity questions (asked
// by every GetCapacity, and by every admission under the pool's lock) cost
// the same with ten thousand records as with ten. It is counted from the
// records when the store opens, and from then on every write adds what it
// changed once its transaction has committed; a write that fails or rolls
// back changes nothing, in the store as in the ledger.
type ledger struct {
	// mu serialises each write with its addition to the ledger, and
	// both with recounts, so that a recount never misses or repeats a
	// write. It costs no concurrency: bbolt serialises writes anyway.
	mu sync.Mutex
	// cur is read without mu: readers never wait for a write's fsync.
	cur atomic.Pointer[Usage]
}

func (l *ledger) load() Usage { return *l.cur.Load() }

// Usage is what the store's records add up to now.
func (s *Store) Usage() Usage { return s.ledger.load() }

// write runs fn in a write transaction of db; once the transaction has
// committed, the ledger takes in the change fn reports.
func (l *ledger) write(db *bolt.DB, fn func(tx *bolt.Tx, change *Usage) error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var change Usage
	if err := db.Update(func(tx *bolt.Tx) error { return fn(tx, &change) }); err != nil {
		return err
	}
	u := l.load().plus(change)
	l.cur.Store(&u)
	return nil
}

// Recount adds up every record again, makes that the ledger, and returns
// what the ledger held before. The two differ only if a write changed the
// records without telling the ledger: a bug, which the caller reports.
func (s *Store) Recount() (was, counted Usage, err error) {
	s.ledger.mu.Lock()
	defer s.ledger.mu.Unlock()
	if counted, err = s.count(); err != nil {
		return Usage{}, Usage{}, err
	}
	if p := s.ledger.cur.Load(); p != nil {
		was = *p
	}
	s.ledger.cur.Store(&counted)
	return was, counted, nil
}

// count adds up every record, in one read transaction.
func (s *Store) count() (u Usage, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketVolumes).ForEach(func(k, b []byte) error {
			var v Volume
			if err := json.Unmarshal(b, &v); err != nil {
				return fmt.Errorf("decode volume %s: %w", k, err)
			}
			u = u.plus(volumeUsage(&v))
			return nil
		}); err != nil {
			return err
		}
		return tx.Bucket(bucketSnapshots).ForEach(func(k, b []byte) error {
			var snap Snapshot
			if err := json.Unmarshal(b, &snap); err != nil {
				return fmt.Errorf("decode snapshot %s: %w", k, err)
			}
			u = u.plus(snapshotUsage(&snap))
			return nil
		})
	})
	if err != nil {
		return Usage{}, fmt.Errorf("count the metadata store's records: %w", err)
	}
	return u, nil
}
