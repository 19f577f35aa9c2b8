package driver

import (
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
	name, ok := pool.PoolOf(id)
	pl := d.pools[name]
	if !ok || !pool.ValidID(id) || pl == nil {
		return nil, nil, fmt.Errorf("volume %q is not in a pool of node %s: %w", id, d.cfg.NodeID, errkind.ErrNotFound)
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

// CutForMove returns the snapshot of volume id that a migration's pull
// for claim reads, cut the first time it is asked for, under the volume's
// lock, and whether it is the last: while the volume is staged (a pod may
// write it) the pre-copy's (pool.TransferSnapshotName), once it is not the
// final one (pool.FinalTransferSnapshotName), after which the volume is
// not staged here again until the final snapshot is gone (NodeStageVolume
// refuses: the volume's data is on its way to another node, and a write
// here would be lost).
func (d *Driver) CutForMove(id string, claim store.Claim) (*pool.Pool, *store.Snapshot, bool, error) {
	name, ok := pool.PoolOf(id)
	pl := d.pools[name]
	if !ok || !pool.ValidID(id) || pl == nil {
		return nil, nil, false, fmt.Errorf("volume %q is not in a pool of node %s: %w", id, d.cfg.NodeID, errkind.ErrNotFound)
	}
	// Snapshot names before the volume, as CreateSnapshot locks: which of
	// the two is cut depends on the volume's state, read under its lock.
	first, last := pool.TransferSnapshotName(claim.UID), pool.FinalTransferSnapshotName(claim.UID)
	defer d.locks.Lock("snapshot/" + first)()
	defer d.locks.Lock("snapshot/" + last)()
	defer d.locks.Lock(id)()
	v, err := pl.Pool.ReadyVolume(id)
	if err != nil {
		return nil, nil, false, err
	}
	final := v.Stage == nil && len(v.Publications) == 0
	snap := first
	if final {
		snap = last
	}
	s, err := pl.Pool.CreateSnapshot(pool.SnapshotRequest{Name: snap, SourceID: id, Quiesce: pl.Node.Quiesce, For: &claim})
	if err != nil {
		return nil, nil, false, err
	}
	return pl.Pool, s, final, nil
}
