package pool

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/podvol/podvol/internal/errkind"
	"github.com/podvol/podvol/internal/failpoint"
	"github.com/podvol/podvol/internal/store"
)

// SnapshotPath returns the image of a snapshot. id must be ValidSnapshotID.
func (p *Pool) SnapshotPath(id string) string { return filepath.Join(p.snapDir, id+".img") }

// SnapshotRequest is a validated CreateSnapshot.
type SnapshotRequest struct {
	Name     string
	SourceID string
	// Quiesce, as for CreateRequest.
	Quiesce func(volumeID string) (func(), error)
	// For: the snapshot is cut for this claim on another node to pull (a
	// clone that moves; see TransferSnapshotName).
	For *store.Claim
}

// TransferSnapshotName is the name of the snapshot a volume's node cuts for
// a clone on another node: one per claim, so that a pull that resumes
// reads the same image.
func TransferSnapshotName(claimUID string) string { return "transfer-" + claimUID }

// TransferSnapshots lists the snapshots cut for claims on other nodes.
func (p *Pool) TransferSnapshots() ([]*store.Snapshot, error) {
	snaps, err := p.store.Snapshots()
	if err != nil {
		return nil, err
	}
	var out []*store.Snapshot
	for _, s := range snaps {
		if s.For != nil {
			out = append(out, s)
		}
	}
	return out, nil
}

// CreateSnapshot copies a volume's image as it is now. The snapshot is
// independent of the volume: either can be deleted first.
func (p *Pool) CreateSnapshot(r SnapshotRequest) (*store.Snapshot, error) {
	snap, err := p.store.SnapshotByName(r.Name)
	switch {
	case err == nil:
		if snap.GroupID != "" {
			return nil, fmt.Errorf("snapshot name %q is taken by a member of group snapshot %s: %w", r.Name, snap.GroupID, errkind.ErrConflict)
		}
		if snap.SourceID != r.SourceID {
			return nil, fmt.Errorf("snapshot %q exists for volume %s, not %s: %w", r.Name, snap.SourceID, r.SourceID, errkind.ErrConflict)
		}
		if snap.State == store.Ready {
			return snap, nil
		}
		return nil, fmt.Errorf("snapshot %q is %s: %w", r.Name, snap.State, errkind.ErrInUse)
	case !errors.Is(err, store.ErrNotFound):
		return nil, err
	}
	src, err := p.ReadyVolume(r.SourceID)
	if err != nil {
		return nil, err
	}
	snap = &store.Snapshot{
		ID:        p.newID(kindSnapshot),
		Name:      r.Name,
		SourceID:  src.ID,
		SizeBytes: src.SizeBytes,
		FsType:    src.FsType,
		State:     store.Creating,
		Created:   time.Now().UTC(),
		Namespace: src.Namespace,
		For:       r.For,
	}
	if r.For != nil {
		// What the source holds now is what the snapshot will hold,
		// unless it is written before the cut (a raw block volume is not
		// frozen): settleHeld admits that difference after.
		held, err := heldBytes(p.ImagePath(src.ID), src.SizeBytes)
		if err != nil {
			return nil, fmt.Errorf("snapshot of volume %s: %w", src.ID, err)
		}
		snap.HeldBytes = &held
	}
	p.mu.Lock()
	err = p.admit(snap.Held())
	if err == nil {
		err = p.store.CreateSnapshot(snap)
	}
	p.mu.Unlock()
	if store.IsExists(err) {
		return nil, fmt.Errorf("snapshot %q is being created concurrently: %w", r.Name, errkind.ErrInUse)
	}
	if err != nil {
		return nil, err
	}
	failpoint.Hit("snapshot-after-record")
	if err := p.copyVolume(src, p.SnapshotPath(snap.ID), src.SizeBytes, r.Quiesce); err != nil {
		if rerr := p.removeSnapshot(snap.ID); rerr != nil {
			klog.ErrorS(rerr, "Removing a failed snapshot", "snapshot", snap.ID)
		}
		return nil, fmt.Errorf("snapshot of volume %s: %w", src.ID, err)
	}
	if snap.HeldBytes == nil {
		return p.store.UpdateSnapshot(snap.ID, func(s *store.Snapshot) { s.State = store.Ready })
	}
	var done *store.Snapshot
	ready, err := p.settleHeld(snap, func() (err error) {
		done, err = p.store.UpdateSnapshot(snap.ID, func(s *store.Snapshot) { s.HeldBytes, s.State = snap.HeldBytes, store.Ready })
		return err
	})
	if !ready {
		if rerr := p.removeSnapshot(snap.ID); rerr != nil {
			klog.ErrorS(rerr, "Removing a snapshot that does not fit", "snapshot", snap.ID)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("snapshot of volume %s: %w", src.ID, err)
	}
	return done, nil
}

// heldBytes is what an image holds of its pool's filesystem (its allocated
// blocks), at most size: the capacity a snapshot cut from it takes.
func heldBytes(path string, size int64) (int64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("blocks of image %s: %w", filepath.Base(path), err)
	}
	return min(st.Blocks*512, size), nil
}

// settleHeld makes the cut snapshot's record say what its image holds, and
// commits it with commit, under the pool's lock: a source written between
// the measure and the cut gave the snapshot more blocks than were admitted,
// and that difference must fit too. ready is false when it does not (err
// wraps ErrNoSpace), or the image cannot be measured: the snapshot must
// then be removed.
func (p *Pool) settleHeld(s *store.Snapshot, commit func() error) (ready bool, err error) {
	held, err := heldBytes(p.SnapshotPath(s.ID), s.SizeBytes)
	if err != nil {
		return false, err
	}
	more := held - s.Held()
	s.HeldBytes = &held
	p.mu.Lock()
	defer p.mu.Unlock()
	if more > 0 {
		if err := p.admit(more); err != nil {
			return false, fmt.Errorf("written while being cut, the snapshot holds %d bytes more than admitted: %w", more, err)
		}
	}
	return true, commit()
}

// copyVolume copies a volume's image to dst, quiescing the volume around the
// copy.
func (p *Pool) copyVolume(src *store.Volume, dst string, size int64, quiesce func(string) (func(), error)) error {
	if quiesce != nil {
		undo, err := quiesce(src.ID)
		if err != nil {
			return err
		}
		defer undo()
	}
	failpoint.Hit("copy-while-quiesced")
	return p.dev.CopyImage(p.ImagePath(src.ID), dst, size, p.reflink)
}

// ReadySnapshot returns a snapshot that can be restored or listed.
func (p *Pool) ReadySnapshot(id string) (*store.Snapshot, error) {
	if !ValidSnapshotID(id) {
		return nil, fmt.Errorf("snapshot %q does not exist on this node: %w", id, errkind.ErrNotFound)
	}
	s, err := p.store.Snapshot(id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && s.State != store.Ready) {
		return nil, fmt.Errorf("snapshot %q does not exist on this node: %w", id, errkind.ErrNotFound)
	}
	return s, err
}

// checkSource verifies that a new volume can be made from its source: the
// source exists, is not larger than the new volume, and holds the filesystem
// the new volume is meant to have.
func (p *Pool) checkSource(r *CreateRequest) error {
	if r.Source == nil {
		return nil
	}
	var size int64
	var fs string
	switch r.Source.Kind {
	case store.FromSnapshot:
		s, err := p.ReadySnapshot(r.Source.ID)
		if err != nil {
			return err
		}
		size, fs = s.SizeBytes, s.FsType
	case store.FromVolume:
		v, err := p.ReadyVolume(r.Source.ID)
		if err != nil {
			return err
		}
		size, fs = v.SizeBytes, v.FsType
	default:
		return fmt.Errorf("source kind %q: %w", r.Source.Kind, errkind.ErrInvalid)
	}
	if r.SizeBytes < size {
		return fmt.Errorf("the %s %s is %d bytes, more than the %d asked for: %w", r.Source.Kind, r.Source.ID, size, r.SizeBytes, errkind.ErrOutOfRange)
	}
	if fs != r.FsType {
		return fmt.Errorf("the %s %s holds %s, the new volume asks for %s: %w", r.Source.Kind, r.Source.ID, fs, r.FsType, errkind.ErrInvalid)
	}
	return nil
}

// copyFromSource makes a new volume's image from its source. A new volume
// larger than its source gets its filesystem grown when it is first staged.
func (p *Pool) copyFromSource(v *store.Volume, quiesce func(string) (func(), error)) error {
	dst := p.ImagePath(v.ID)
	// A crashed attempt may have left a partial copy: start again.
	if err := os.Remove(dst); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	var srcSize int64
	switch v.Source.Kind {
	case store.FromSnapshot:
		s, err := p.ReadySnapshot(v.Source.ID)
		if err != nil {
			return err
		}
		srcSize = s.SizeBytes
		if err := p.dev.CopyImage(p.SnapshotPath(s.ID), dst, v.SizeBytes, p.reflink); err != nil {
			return fmt.Errorf("restore snapshot %s: %w", s.ID, err)
		}
	case store.FromVolume:
		src, err := p.ReadyVolume(v.Source.ID)
		if err != nil {
			return err
		}
		srcSize = src.SizeBytes
		if err := p.copyVolume(src, dst, v.SizeBytes, quiesce); err != nil {
			return fmt.Errorf("clone volume %s: %w", src.ID, err)
		}
	}
	if v.SizeBytes > srcSize {
		_, err := p.store.Update(v.ID, func(v *store.Volume) error {
			v.GrowFs = true
			return nil
		})
		return err
	}
	return nil
}

// DeleteSnapshot deletes a snapshot; one that does not exist is deleted.
func (p *Pool) DeleteSnapshot(id string) error {
	if !ValidSnapshotID(id) {
		return nil
	}
	if s, err := p.store.Snapshot(id); err == nil && s.GroupID != "" {
		// The CSI spec: a member goes with its group
		// (DeleteVolumeGroupSnapshot), never alone.
		return fmt.Errorf("snapshot %s is part of group snapshot %s and cannot be deleted alone: delete the group: %w", id, s.GroupID, errkind.ErrInvalid)
	}
	if _, err := p.store.UpdateSnapshot(id, func(s *store.Snapshot) { s.State = store.Deleting }); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		return err
	}
	return p.removeSnapshot(id)
}

// DeleteHeldSnapshot deletes a snapshot named by a handle that names no
// node, which may be any node's. A snapshot this pool holds is deleted, one
// it deleted is done. One it never held is on another node, or nowhere, and
// is left alone: errkind.ErrElsewhere, not success, or its
// VolumeSnapshotContent would go while its image stays on its node for
// ever. Snapshot ids are random and made by one pool, so "never held" is
// known here, if the store has recorded its deletions since it was made;
// one made by an older plugin has not, and a snapshot missing from it may
// have been deleted here before: done, as the CSI spec asks of a snapshot
// that is not there, since refusing would keep its VolumeSnapshotContent
// for ever (said in the log). An id of a shape this pool never makes is no
// snapshot anywhere: done.
func (p *Pool) DeleteHeldSnapshot(id string) error {
	if !ValidSnapshotID(id) {
		return nil
	}
	_, err := p.store.Snapshot(id)
	if errors.Is(err, store.ErrNotFound) {
		deleted, err := p.store.DeletedSnapshot(id)
		if err != nil {
			return fmt.Errorf("snapshot %s: %w", id, err)
		}
		if deleted {
			return nil
		}
		since, always := p.store.DeletionsRecordedSince()
		if always {
			return fmt.Errorf("snapshot %s was never in this node's pool: %w", id, errkind.ErrElsewhere)
		}
		klog.InfoS("Reporting a snapshot whose handle names no node as deleted: it is not in this pool, which has recorded its deletions only since an upgrade and may have deleted it before; if it is on another node after all, its image stays there, at snapshots/<id>.img in that node's pool",
			"snapshot", id, "deletionsRecordedSince", since.UTC().Format(time.RFC3339))
		return nil
	}
	if err != nil {
		return err
	}
	return p.DeleteSnapshot(id)
}

func (p *Pool) removeSnapshot(id string) error {
	if err := os.Remove(p.SnapshotPath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove snapshot image: %w", err)
	}
	return p.store.DeleteSnapshot(id)
}

func (p *Pool) recoverSnapshots() []error {
	snaps, err := p.store.Snapshots()
	if err != nil {
		return []error{err}
	}
	var errs []error
	for _, s := range snaps {
		if s.State == store.Creating || s.State == store.Deleting {
			klog.InfoS("Recovering interrupted snapshot operation", "snapshot", s.ID, "name", s.Name, "state", s.State)
			if err := p.removeSnapshot(s.ID); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errs
}
