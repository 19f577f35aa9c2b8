package pool

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/podvol/podvol/internal/errkind"
	"github.com/podvol/podvol/internal/failpoint"
	"github.com/podvol/podvol/internal/store"
)

// GroupRequest is a validated CreateVolumeGroupSnapshot.
type GroupRequest struct {
	Name      string
	SourceIDs []string // distinct
	// Freeze quiesces every volume of the group at once and returns
	// the undo that thaws them all (node.QuiesceGroup).
	Freeze func(volumeIDs []string) (func(), error)
}

// CreateGroupSnapshot cuts a snapshot of each source volume at one instant:
// every member is quiesced at once, each image is copied, and all are
// released. The group and its members are recorded (Creating) in one
// transaction before anything is frozen, so a crash at any later step is
// rolled back whole by Recover. The member snapshots are ordinary
// snapshots: restorable, listed, counted.
func (p *Pool) CreateGroupSnapshot(r GroupRequest) (*store.Group, []*store.Snapshot, error) {
	g, err := p.store.GroupByName(r.Name)
	switch {
	case err == nil:
		if !sameMembers(g, r.SourceIDs) {
			return nil, nil, fmt.Errorf("group snapshot %q exists for volumes %s, not %s: %w", r.Name, strings.Join(groupSources(g), ", "), strings.Join(r.SourceIDs, ", "), errkind.ErrConflict)
		}
		if g.State != store.Ready {
			return nil, nil, fmt.Errorf("group snapshot %q is %s: %w", r.Name, g.State, errkind.ErrInUse)
		}
		snaps, err := p.groupSnapshots(g)
		return g, snaps, err
	case !errors.Is(err, store.ErrNotFound):
		return nil, nil, err
	}
	var srcs []*store.Volume
	var here, missing []string
	for _, id := range r.SourceIDs {
		v, err := p.ReadyVolume(id)
		if errors.Is(err, errkind.ErrNotFound) {
			missing = append(missing, id)
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		srcs = append(srcs, v)
		here = append(here, id)
	}
	switch {
	case len(missing) > 0 && len(here) == 0:
		return nil, nil, fmt.Errorf("volumes %s do not exist on this node: %w", strings.Join(missing, ", "), errkind.ErrNotFound)
	case len(missing) > 0:
		// A pool only knows its own volumes: the others are on other
		// nodes or nowhere. Either way the group cannot be cut here.
		return nil, nil, fmt.Errorf("volumes %s are on this node but %s are not: every volume of a group snapshot must be in one node's pool: %w", strings.Join(here, ", "), strings.Join(missing, ", "), errkind.ErrElsewhere)
	}

	now := time.Now().UTC()
	g = &store.Group{ID: p.newID(kindGroup), Name: r.Name, State: store.Creating, Created: now}
	snaps := make([]*store.Snapshot, len(srcs))
	var total int64
	for i, src := range srcs {
		snaps[i] = &store.Snapshot{
			ID:        p.newID(kindSnapshot),
			Name:      g.ID + "/" + src.ID, // never a CSI name: a CreateSnapshot of it is refused (CreateSnapshot)
			SourceID:  src.ID,
			SizeBytes: src.SizeBytes,
			FsType:    src.FsType,
			State:     store.Creating,
			Created:   now,
			Namespace: src.Namespace,
			GroupID:   g.ID,
		}
		g.Members = append(g.Members, store.GroupMember{SourceID: src.ID, SnapshotID: snaps[i].ID})
		total += src.SizeBytes
	}
	p.mu.Lock()
	err = p.admit(total)
	if err == nil {
		err = p.store.CreateGroup(g, snaps)
	}
	p.mu.Unlock()
	if store.IsExists(err) {
		return nil, nil, fmt.Errorf("group snapshot %q is being created concurrently: %w", r.Name, errkind.ErrInUse)
	}
	if err != nil {
		return nil, nil, err
	}
	failpoint.Hit("group-after-record")
	if err := p.cutGroup(srcs, snaps, r.Freeze); err != nil {
		if rerr := p.removeGroup(g); rerr != nil {
			klog.ErrorS(rerr, "Removing a failed group snapshot", "group", g.ID)
		}
		return nil, nil, fmt.Errorf("group snapshot %q: %w", r.Name, err)
	}
	if g, err = p.store.SetGroupState(g.ID, store.Ready); err != nil {
		return nil, nil, err
	}
	for _, s := range snaps {
		s.State = store.Ready
	}
	return g, snaps, nil
}

// cutGroup copies every source's image while all of them are quiesced.
func (p *Pool) cutGroup(srcs []*store.Volume, snaps []*store.Snapshot, freeze func([]string) (func(), error)) error {
	if freeze != nil {
		ids := make([]string, len(srcs))
		for i, s := range srcs {
			ids[i] = s.ID
		}
		thaw, err := freeze(ids)
		if err != nil {
			return err
		}
		defer thaw()
	}
	failpoint.Hit("group-while-frozen")
	for i, src := range srcs {
		if err := p.dev.CopyImage(p.ImagePath(src.ID), p.SnapshotPath(snaps[i].ID), src.SizeBytes, p.reflink); err != nil {
			return fmt.Errorf("snapshot of volume %s: %w", src.ID, err)
		}
	}
	return nil
}

// ReadyGroup returns a group snapshot that is cut, and its members.
func (p *Pool) ReadyGroup(id string) (*store.Group, []*store.Snapshot, error) {
	notFound := fmt.Errorf("group snapshot %q does not exist on this node: %w", id, errkind.ErrNotFound)
	if !ValidGroupID(id) {
		return nil, nil, notFound
	}
	g, err := p.store.Group(id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && g.State != store.Ready) {
		return nil, nil, notFound
	}
	if err != nil {
		return nil, nil, err
	}
	snaps, err := p.groupSnapshots(g)
	return g, snaps, err
}

// DeleteGroupSnapshot deletes a group snapshot and its member snapshots; one
// that does not exist is deleted.
func (p *Pool) DeleteGroupSnapshot(id string) error {
	if !ValidGroupID(id) {
		return nil
	}
	g, err := p.store.SetGroupState(id, store.Deleting)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	return p.removeGroup(g)
}

// removeGroup removes the member snapshots, then the group record: a crash
// between leaves the group Deleting, for Recover to finish.
func (p *Pool) removeGroup(g *store.Group) error {
	for _, m := range g.Members {
		if err := p.removeSnapshot(m.SnapshotID); err != nil {
			return fmt.Errorf("group snapshot %s: %w", g.ID, err)
		}
	}
	failpoint.Hit("group-delete-after-members")
	return p.store.DeleteGroup(g.ID)
}

// recoverGroups rolls back groups caught being made and finishes those
// caught being deleted.
func (p *Pool) recoverGroups() []error {
	groups, err := p.store.Groups()
	if err != nil {
		return []error{err}
	}
	var errs []error
	for _, g := range groups {
		if g.State == store.Creating || g.State == store.Deleting {
			klog.InfoS("Recovering interrupted group snapshot operation", "group", g.ID, "name", g.Name, "state", g.State)
			if err := p.removeGroup(g); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errs
}

// groupSnapshots returns the member snapshots of g, in its order.
func (p *Pool) groupSnapshots(g *store.Group) ([]*store.Snapshot, error) {
	snaps := make([]*store.Snapshot, 0, len(g.Members))
	for _, m := range g.Members {
		s, err := p.store.Snapshot(m.SnapshotID)
		if err != nil {
			return nil, fmt.Errorf("group snapshot %s: member %s: %w", g.ID, m.SnapshotID, err)
		}
		snaps = append(snaps, s)
	}
	return snaps, nil
}

func groupSources(g *store.Group) []string {
	ids := make([]string, len(g.Members))
	for i, m := range g.Members {
		ids[i] = m.SourceID
	}
	return ids
}

// sameMembers: a group is the same if it has the same set of volumes,
// whatever their order in the request.
func sameMembers(g *store.Group, ids []string) bool {
	a, b := slices.Sorted(slices.Values(groupSources(g))), slices.Sorted(slices.Values(ids))
	return slices.Equal(a, b)
}

// SameSnapshotSet reports whether ids (snapshot ids of this pool) are
// exactly the members of g, in any order.
func SameSnapshotSet(g *store.Group, ids []string) bool {
	have := make([]string, len(g.Members))
	for i, m := range g.Members {
		have[i] = m.SnapshotID
	}
	return slices.Equal(slices.Sorted(slices.Values(have)), slices.Sorted(slices.Values(ids)))
}
