package driver

import (
	"context"
	"errors"
	"fmt"

	"github.com/podvol/podvol/internal/errkind"
	"github.com/podvol/podvol/internal/pool"
	"github.com/podvol/podvol/internal/store"
)

// CutForTransfer returns the snapshot of volume id that a clone on another
// node pulls, cut the first time a pull for claim asks: as CreateSnapshot
// cuts one (a reflink copy of the image, its mounted filesystem frozen
// around it, under the volume's lock), so the source's pod pauses only for
// the reflink. One per claim: a pull that resumes reads the same image.
func (d *Driver) CutForTransfer(id string, claim store.Claim) (*pool.Pool, *store.Snapshot, error) {
	pl, err := d.transferPool(id)
	if err != nil {
		return nil, nil, err
	}
	snap := pool.TransferSnapshotName(claim.UID)
	defer d.locks.Lock("snapshot/" + snap)()
	defer d.locks.Lock(id)()
	s, err := pl.Pool.CreateSnapshot(pool.SnapshotRequest{Name: snap, SourceID: id, Quiesce: pl.Node.Quiesce, For: &claim})
	if err != nil {
		return nil, nil, err
	}
	return pl.Pool, s, nil
}

// CutForMove returns what a migration's pull for claim reads of volume
// id, decided under the volume's lock: while the volume is staged (a pod
// may write it), the snapshot cut for the pre-copy
// (pool.TransferSnapshotName; moving is nil); once it is not, the volume
// itself, marked moving (pool.MarkMoving), with that snapshot if there is
// one. A moving volume is not staged here again (NodeStageVolume refuses:
// its data is on its way to another node, and a write here would be lost)
// and does not change, so it is served as it is: the last copy takes no
// room. Without room in the pool for the pre-copy's snapshot the answer is
// errkind.ErrInUse: the data is copied once no pod uses the volume.
func (d *Driver) CutForMove(id string, claim store.Claim) (p *pool.Pool, first *store.Snapshot, moving *store.Volume, err error) {
	pl, err := d.transferPool(id)
	if err != nil {
		return nil, nil, nil, err
	}
	snap := pool.TransferSnapshotName(claim.UID)
	// The snapshot's name before the volume, as CreateSnapshot locks.
	defer d.locks.Lock("snapshot/" + snap)()
	defer d.locks.Lock(id)()
	v, err := pl.Pool.ReadyVolume(id)
	if err != nil {
		return nil, nil, nil, err
	}
	if v.Moving == nil && (v.Stage != nil || len(v.Publications) > 0) {
		if !pl.Pool.Reflink() && (v.Stage == nil || !v.Stage.Block) {
			// A copy under the filesystem's freeze would stop the pod's
			// writes for the whole copy. (A raw block volume's refusal
			// is the snapshot's own.)
			return nil, nil, nil, fmt.Errorf("pool %s has no reflink: a first copy of volume %s while a pod uses it would stop the pod's writes for the whole copy (XFS or btrfs pools copy in constant time); its data is copied once no pod does: %w", pl.Pool.Name(), id, errkind.ErrInUse)
		}
		s, err := pl.Pool.CreateSnapshot(pool.SnapshotRequest{Name: snap, SourceID: id, Quiesce: pl.Node.Quiesce, For: &claim})
		if errors.Is(err, errkind.ErrNoSpace) {
			return nil, nil, nil, fmt.Errorf("no room in pool %s for a snapshot of volume %s while a pod uses it (%w): its data is copied once no pod does: %w", pl.Pool.Name(), id, err, errkind.ErrInUse)
		}
		if err != nil {
			return nil, nil, nil, err
		}
		return pl.Pool, s, nil, nil
	}
	if v, err = pl.Pool.MarkMoving(id, claim); err != nil {
		return nil, nil, nil, err
	}
	s, err := pl.Pool.Store().SnapshotByName(snap)
	if err != nil || s.State != store.Ready || s.SourceID != id {
		s = nil
	}
	return pl.Pool, s, v, nil
}

// DeleteUnclaimed deletes volume id, pulled here for a claim that went
// before any PV named it (mobility.Sweeper), if unclaimed, asked under the
// locks CreateVolume takes for the volume's name and DeleteVolume for its
// id, still says it may: a CreateVolume cannot hand the volume out while it
// goes.
func (d *Driver) DeleteUnclaimed(ctx context.Context, id string, unclaimed func(*store.Volume) error) error {
	pl, err := d.transferPool(id)
	if err != nil {
		return err
	}
	v, err := pl.Pool.ReadyVolume(id)
	if err != nil {
		return err
	}
	defer d.locks.Lock("name/" + v.Name)()
	defer d.locks.Lock(id)()
	if v, err = pl.Pool.ReadyVolume(id); err != nil {
		return err
	}
	if err := unclaimed(v); err != nil {
		return err
	}
	return pl.Pool.DeleteVolume(ctx, id)
}

// transferPool is the pool of volume id, which a transfer or the sweep
// names: errkind.ErrNotFound unless id is well-formed and of a pool this
// node serves.
func (d *Driver) transferPool(id string) (*Pool, error) {
	if pool.ValidID(id) {
		if name, ok := pool.PoolOf(id); ok && d.pools[name] != nil {
			return d.pools[name], nil
		}
	}
	return nil, fmt.Errorf("volume %q is not in a pool of node %s: %w", id, d.cfg.NodeID, errkind.ErrNotFound)
}
