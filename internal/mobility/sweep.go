package mobility

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/podvol/podvol/internal/errkind"
	"github.com/podvol/podvol/internal/names"
	"github.com/podvol/podvol/internal/pool"
	"github.com/podvol/podvol/internal/store"
)

// Sweeper deletes the snapshots this node cut for clones on other nodes
// (Images.Cut) once their claims no longer need them: bound (the copy is
// in use), deleted, or replaced by another of the same name. Until then
// every pull for the claim reads the one snapshot, sent whole or not: the
// volume is cut once per claim.
//
// It also deletes the volumes pulled here for claims deleted before any PV
// named them (the claim went after the copy was checked and before
// external-provisioner's CreateVolume): nothing would ever delete them.
type Sweeper struct {
	Client kubernetes.Interface
	Pools  []*pool.Pool
	// Every is the pause between sweeps (1 minute if 0).
	Every time.Duration
	// Grace is how long a pulled volume must stay unnamed by any PV, its
	// claim gone, before it is deleted (30 minutes if 0).
	// external-provisioner saves the PV of a volume it was given at once,
	// and retries a failed save with a growing backoff: a save that fails
	// for longer (the API server down) may name a deleted volume, but only
	// for a claim the user deleted.
	Grace time.Duration
	// Delete deletes a pulled volume once its check, asked again under the
	// locks CreateVolume and DeleteVolume take, allows it (the driver's
	// DeleteUnclaimed); nil: the check, then a delete from its pool.
	Delete DeleteFunc

	// orphans: when each pulled volume was first seen with no PV and its
	// claim gone.
	orphans map[string]time.Time
}

// DeleteFunc deletes volume id if unclaimed, asked under the volume's
// locks, says it may.
type DeleteFunc func(ctx context.Context, id string, unclaimed func(*store.Volume) error) error

// Run sweeps until ctx ends.
func (s *Sweeper) Run(ctx context.Context) {
	every := s.Every
	if every <= 0 {
		every = time.Minute
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		s.Sweep(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Sweep deletes the transfer snapshots whose claims are done with them and
// returns how many it deleted.
func (s *Sweeper) Sweep(ctx context.Context) int {
	deleted := 0
	for _, p := range s.Pools {
		snaps, err := p.TransferSnapshots()
		if err != nil {
			klog.ErrorS(err, "Cannot list the snapshots cut for clones on other nodes", "pool", p.Name())
		}
		for _, snap := range snaps {
			why, err := s.done(ctx, snap.For)
			if err != nil {
				klog.ErrorS(err, "Cannot tell whether a snapshot cut for a clone is still needed; kept", "snapshot", snap.ID, "claim", snap.For.Namespace+"/"+snap.For.Name)
				continue
			}
			if why == "" {
				continue
			}
			if err := p.DeleteSnapshot(snap.ID); err != nil {
				klog.ErrorS(err, "Cannot delete a snapshot cut for a clone", "snapshot", snap.ID)
				continue
			}
			deleted++
			klog.InfoS("Deleted a snapshot cut for a clone on another node", "snapshot", snap.ID, "volume", snap.SourceID, "claim", snap.For.Namespace+"/"+snap.For.Name, "because", why)
		}
		s.sweepMoving(ctx, p)
	}
	s.sweepPulled(ctx)
	return deleted
}

// sweepPulled deletes the volumes pulled for claims that went before any PV
// named them, once they have been seen so for Grace, and forgets the claim
// of those a PV names: a PV deleted later (reclaim policy Retain) leaves
// its volume to the admin.
func (s *Sweeper) sweepPulled(ctx context.Context) {
	var vols []*store.Volume
	byID := map[string]*pool.Pool{}
	for _, p := range s.Pools {
		vs, err := p.Pulled()
		if err != nil {
			klog.ErrorS(err, "Cannot list the volumes pulled from other nodes", "pool", p.Name())
			continue
		}
		for _, v := range vs {
			byID[v.ID] = p
		}
		vols = append(vols, vs...)
	}
	seen := s.orphans
	s.orphans = map[string]time.Time{}
	if len(vols) == 0 {
		return
	}
	named, err := s.namedByPVs(ctx)
	if err != nil {
		klog.ErrorS(err, "Cannot list PVs to tell whether pulled volumes are claimed")
		s.orphans = seen
		return
	}
	grace := s.Grace
	if grace <= 0 {
		grace = 30 * time.Minute
	}
	for _, v := range vols {
		p := byID[v.ID]
		if named[v.ID] {
			if err := p.Claimed(v.ID); err != nil {
				klog.ErrorS(err, "Cannot record that a PV names a pulled volume", "volume", v.ID)
			}
			continue
		}
		why, err := s.unclaimed(ctx, v)
		if err != nil || why == "" {
			continue
		}
		first, ok := seen[v.ID]
		if !ok {
			first = time.Now()
		}
		s.orphans[v.ID] = first
		if !ok || time.Since(first) < grace {
			continue
		}
		// Asked again under the volume's locks: a PV or claim made since.
		check := func(v *store.Volume) error {
			if v.PulledFor == nil {
				return fmt.Errorf("volume %s is claimed now: %w", v.ID, errkind.ErrInUse)
			}
			named, err := s.namedByPVs(ctx)
			if err == nil && named[v.ID] {
				err = fmt.Errorf("a PV names volume %s now: %w", v.ID, errkind.ErrInUse)
			}
			if err == nil {
				why, err = s.unclaimed(ctx, v)
				if err == nil && why == "" {
					err = fmt.Errorf("claim %s/%s of volume %s wants it now: %w", v.PulledFor.Namespace, v.PulledFor.Name, v.ID, errkind.ErrInUse)
				}
			}
			return err
		}
		if s.Delete != nil {
			err = s.Delete(ctx, v.ID, check)
		} else if err = check(v); err == nil {
			err = p.DeleteVolume(ctx, v.ID)
		}
		if err != nil {
			klog.ErrorS(err, "Kept a volume pulled for a claim that looked gone", "volume", v.ID)
			continue
		}
		delete(s.orphans, v.ID)
		klog.InfoS("Deleted a volume pulled from another node for a claim that no longer wants it; no PV names it",
			"volume", v.ID, "name", v.Name, "claim", v.PulledFor.Namespace+"/"+v.PulledFor.Name, "because", why, "unclaimedFor", time.Since(first).Round(time.Second))
	}
}

// namedByPVs: the handles of podvol's PVs.
func (s *Sweeper) namedByPVs(ctx context.Context) (map[string]bool, error) {
	pvs, err := s.Client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	named := map[string]bool{}
	for _, pv := range pvs.Items {
		if pv.Spec.CSI != nil && pv.Spec.CSI.Driver == names.Driver {
			named[pv.Spec.CSI.VolumeHandle] = true
		}
	}
	return named, nil
}

// unclaimed says why no one will ask for pulled volume v again ("" if
// someone may): its claim is gone, replaced or being deleted. A bound claim
// may be bound to v's PV made since the PVs were listed; if to another, v
// goes once the claim does.
func (s *Sweeper) unclaimed(ctx context.Context, v *store.Volume) (string, error) {
	why, err := s.done(ctx, v.PulledFor)
	if why == "the claim is bound" {
		why = ""
	}
	return why, err
}

// sweepMoving lets the volumes whose migration was cancelled be staged
// again: their copy's claim is gone and their PV (if any) no longer
// carries a migration's phase. A volume whose migration switched keeps
// its mark: its claim lives on another node now.
func (s *Sweeper) sweepMoving(ctx context.Context, p *pool.Pool) {
	vols, err := p.MovingVolumes()
	if err != nil || len(vols) == 0 {
		if err != nil {
			klog.ErrorS(err, "Cannot list the volumes being moved", "pool", p.Name())
		}
		return
	}
	pvs, err := s.Client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		klog.ErrorS(err, "Cannot list PVs to tell whether migrations are over")
		return
	}
	for _, v := range vols {
		why, err := s.done(ctx, &v.Moving.Claim)
		if err != nil || why == "" || why == "the claim is bound" {
			continue
		}
		migrating := false
		for _, pv := range pvs.Items {
			if pv.Spec.CSI != nil && pv.Spec.CSI.VolumeHandle == v.ID && pv.Annotations[names.MigrationPhase] != "" {
				migrating = true
			}
		}
		if migrating {
			continue
		}
		if err := p.ClearMoving(v.ID, v.Moving.Claim.UID); err != nil {
			klog.ErrorS(err, "Cannot let a volume whose migration was cancelled be staged again", "volume", v.ID)
			continue
		}
		klog.InfoS("A volume's migration was cancelled: it may be staged again", "volume", v.ID, "claim", v.Moving.Claim.Namespace+"/"+v.Moving.Claim.Name, "because", why)
	}
}

// done says why claim no longer needs its snapshot; "" if it may.
func (s *Sweeper) done(ctx context.Context, c *store.Claim) (string, error) {
	pvc, err := s.Client.CoreV1().PersistentVolumeClaims(c.Namespace).Get(ctx, c.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return "the claim is deleted", nil
	case err != nil:
		return "", err
	case string(pvc.UID) != c.UID:
		return "the claim is deleted (another of its name is there)", nil
	case pvc.DeletionTimestamp != nil:
		return "the claim is being deleted", nil
	case pvc.Spec.VolumeName != "":
		return "the claim is bound", nil
	}
	return "", nil
}
