package pool_test

import (
	"os"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/podvol/podvol/internal/device/devicetest"
	"github.com/podvol/podvol/internal/errkind"
	"github.com/podvol/podvol/internal/pool"
)

// A snapshot whose handle names no node can be deleted through any node
// (issue 25, review of item 8). The CSI spec wants a delete of a snapshot
// that does not exist reported done, and a pool that may have deleted it
// itself cannot say it is elsewhere: a store kept by a plugin from before
// the pool recorded its snapshots did not keep them, so a snapshot deleted
// then is no longer anywhere, and its VolumeSnapshotContent must go. A pool
// whose record is complete still refuses an id it never held (it is on
// another node, and saying done would leave its image there for ever).
func TestNodelessDeleteConverges(t *testing.T) {
	someID := "snap-0123456789abcdef01234567"
	if !pool.ValidSnapshotID(someID) {
		t.Fatalf("%s is not a snapshot id", someID)
	}

	// A pool whose store an older plugin kept: the file existed before.
	dir, err := filepath.EvalSymlinks(t.TempDir())
	must(t, err)
	old := &env{t: t, dir: filepath.Join(dir, "pool"), dev: devicetest.New()}
	must(t, os.MkdirAll(old.dir, 0o700))
	db, err := bolt.Open(filepath.Join(old.dir, "podvol.db"), 0o600, nil)
	must(t, err)
	must(t, db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucketIfNotExists([]byte("volumes")); return err }))
	must(t, db.Close())
	must(t, old.reopen(""))
	t.Cleanup(func() { must(t, old.p.Close()) })
	if err := old.p.DeleteHeldSnapshot(someID); err != nil {
		t.Fatalf("DeleteHeldSnapshot of a snapshot this pool may have deleted before it kept a record: %v", err)
	}

	// A pool that has recorded every snapshot it ever held.
	fresh := newEnv(t, GiB)
	err = fresh.p.DeleteHeldSnapshot(someID)
	wantErr(t, err, errkind.ErrElsewhere, "DeleteHeldSnapshot of a snapshot a pool with a complete record never held")
	v := fresh.create("v", 64<<20)
	s, err := fresh.p.CreateSnapshot(pool.SnapshotRequest{Name: "s", SourceID: v.ID})
	must(t, err)
	must(t, fresh.p.DeleteHeldSnapshot(s.ID))
	must(t, fresh.p.DeleteHeldSnapshot(s.ID))
	must(t, fresh.reopen(""))
	must(t, fresh.p.DeleteHeldSnapshot(s.ID))
	err = fresh.p.DeleteHeldSnapshot(someID)
	wantErr(t, err, errkind.ErrElsewhere, "DeleteHeldSnapshot of a snapshot never held, after a reopen")

	// The same pool with its store lost: the new store cannot know what
	// the old one deleted.
	must(t, fresh.p.Close())
	fresh.p = nil
	must(t, os.Remove(filepath.Join(fresh.dir, "podvol.db")))
	must(t, fresh.reopen(pool.UnknownAdopt))
	if err := fresh.p.DeleteHeldSnapshot(someID); err != nil {
		t.Fatalf("DeleteHeldSnapshot in a pool whose store was lost, of a snapshot it may have deleted before: %v", err)
	}
}
