package mobility

import (
	"context"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/podvol/podvol/internal/pool"
	"github.com/podvol/podvol/internal/store"
)

// Sweeper deletes the snapshots this node cut for clones on other nodes
// (Images.Cut) once their claims no longer need them: bound (the copy is
// in use), deleted, or replaced by another of the same name. A pull sent to
// its end deletes its snapshot at once; the sweep is for the rest (a pull
// given up, a claim deleted mid-copy, a plugin stopped between).
type Sweeper struct {
	Client kubernetes.Interface
	Pools  []*pool.Pool
	// Every is the pause between sweeps (1 minute if 0).
	Every time.Duration
}

// Run sweeps until ctx ends.
func (s Sweeper) Run(ctx context.Context) {
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
func (s Sweeper) Sweep(ctx context.Context) int {
	deleted := 0
	for _, p := range s.Pools {
		snaps, err := p.TransferSnapshots()
		if err != nil {
			klog.ErrorS(err, "Cannot list the snapshots cut for clones on other nodes", "pool", p.Name())
			continue
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
	}
	return deleted
}

// done says why claim no longer needs its snapshot; "" if it may.
func (s Sweeper) done(ctx context.Context, c *store.Claim) (string, error) {
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
