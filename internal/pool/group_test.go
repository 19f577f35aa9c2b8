package pool_test

import (
	"errors"
	"testing"

	"github.com/podvol/podvol/internal/pool"
	"github.com/podvol/podvol/internal/store"
)

// A group caught being made is rolled back whole at start, member images and
// records with it, and one caught being deleted is finished; a ready group
// is kept, and the pool's ledger matches its records afterwards.
func TestRecoverInterruptedGroups(t *testing.T) {
	e := newEnv(t, 10*GiB)
	a, b := e.create("a", 64*MiB), e.create("b", 64*MiB)
	groups := map[string]*store.Group{}
	members := map[string][]*store.Snapshot{}
	for _, name := range []string{"creating", "deleting", "ready"} {
		g, snaps, err := e.p.CreateGroupSnapshot(pool.GroupRequest{Name: name, SourceIDs: []string{a.ID, b.ID}})
		must(t, err)
		groups[name], members[name] = g, snaps
	}
	_, err := e.p.Store().SetGroupState(groups["creating"].ID, store.Creating)
	must(t, err)
	_, err = e.p.Store().SetGroupState(groups["deleting"].ID, store.Deleting)
	must(t, err)

	must(t, e.reopen(""))
	must(t, e.p.Recover(ctx))
	for _, name := range []string{"creating", "deleting"} {
		if _, err := e.p.Store().Group(groups[name].ID); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("group %s after recovery: %v", name, err)
		}
		for _, s := range members[name] {
			gone(t, e.p.SnapshotPath(s.ID))
			if _, err := e.p.Store().Snapshot(s.ID); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("member %s of group %s after recovery: %v", s.ID, name, err)
			}
		}
	}
	if _, snaps, err := e.p.ReadyGroup(groups["ready"].ID); err != nil || len(snaps) != 2 {
		t.Fatalf("ready group after recovery: %v, %v", snaps, err)
	}
	if u := e.p.Store().Usage(); u.Snapshots != 2 || u.SnapshotBytes != 128*MiB {
		t.Fatalf("ledger after recovery %+v, want the ready group's 2 snapshots", u)
	}
}
