package node

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/podvol/podvol/internal/errkind"
	"github.com/podvol/podvol/internal/store"
)

// Quiesce makes a staged volume's image consistent for a copy: a mounted
// filesystem is frozen (flushed, writes held) until the returned undo runs;
// a block volume's page cache is flushed. A volume assigned to a microVM is
// copied crash-consistent, as a cloud disk is snapshotted while attached: the
// guest owns its filesystem, and the host has nothing of it to freeze (its
// staging directory is then an empty directory on the node's filesystem,
// which must never be frozen).
func (n *Node) Quiesce(id string) (func(), error) {
	v, err := n.store.Volume(id)
	if err != nil || v.Stage == nil || v.Stage.State != store.Staged {
		return func() {}, nil
	}
	s := v.Stage
	if !n.dev.LoopServes(s.Device, n.pool.ImagePath(v.ID)) {
		// Not attached (a reboot took it): nothing writes to the image.
		return func() {}, nil
	}
	return n.handoverOf(v).quiesce(v)
}

// quiesce of a microVM's volume: the guest cannot be frozen from here, so
// the copy is crash-consistent, which only an atomic (reflink) copy is.
func (m microVM) quiesce(v *store.Volume) (func(), error) {
	if !m.n.pool.Reflink() {
		// Without reflink the copy reads the image extent by
		// extent for as long as it takes, while the guest goes on
		// writing: the copy would be torn, not crash-consistent.
		// A reflink copy is one atomic step.
		return nil, fmt.Errorf("volume %s is assigned to a microVM and this pool's filesystem has no reflink, so a copy of it while the guest writes would be torn: stop the pod first, or put the pool on XFS or btrfs: %w", v.ID, errkind.ErrInUse)
	}
	return func() {}, m.n.dev.SyncDevice(v.Stage.Device)
}

// quiesce of a host mount: freeze the staged filesystem, or flush a raw
// block device.
func (h hostMount) quiesce(v *store.Volume) (func(), error) {
	n, s, id := h.n, v.Stage, v.ID
	if s.Block {
		return func() {}, n.dev.SyncDevice(s.Device)
	}
	f, err := n.dev.OpenFilesystemOn(s.Path, s.Device)
	if err != nil {
		return nil, fmt.Errorf("volume %s is not mounted at its staging path, so it cannot be frozen for a consistent copy (stage it again): %w: %w", id, err, errkind.ErrNotStaged)
	}
	if err := f.Freeze(); err != nil {
		f.Close()
		return nil, fmt.Errorf("freeze volume %s for a consistent copy: %w", id, err)
	}
	return func() {
		if err := f.Thaw(); err != nil {
			klog.ErrorS(err, "Thawing volume after copy", "volume", id)
		}
		f.Close()
	}, nil
}

// QuiesceGroup quiesces several volumes at once for a group snapshot, as
// Quiesce does each, and returns the undo that releases them all. They are
// frozen in id order, whatever the order asked: two groups that share
// volumes then freeze them in the same order and cannot each hold one the
// other waits for. A freeze waits for the writes in flight, so the whole
// group has one deadline: when it passes, QuiesceGroup fails
// (context.DeadlineExceeded) and whatever is frozen by then, or gets
// frozen by a freeze still under way, is thawed at once. Every path thaws.
func (n *Node) QuiesceGroup(ids []string, timeout time.Duration) (func(), error) {
	sorted := slices.Sorted(slices.Values(ids))
	type result struct {
		undo func()
		err  error
	}
	done := make(chan result, 1)
	var mu sync.Mutex
	abandoned := false
	go func() {
		var undos []func()
		undo := func() {
			for i := len(undos) - 1; i >= 0; i-- {
				undos[i]()
			}
		}
		for _, id := range sorted {
			u, err := n.Quiesce(id)
			if err != nil {
				undo()
				done <- result{err: err}
				return
			}
			undos = append(undos, u)
			mu.Lock()
			late := abandoned
			mu.Unlock()
			if late {
				break
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if abandoned {
			// The caller gave up: nothing may stay frozen.
			undo()
			return
		}
		done <- result{undo: undo}
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case r := <-done:
		return r.undo, r.err
	case <-timer.C:
		mu.Lock()
		abandoned = true
		mu.Unlock()
		// The result may have been sent just before.
		select {
		case r := <-done:
			if r.undo != nil {
				r.undo()
			}
		default:
		}
		klog.InfoS("Group freeze timed out; thawing", "volumes", sorted, "timeout", timeout)
		return nil, fmt.Errorf("freezing the %d volumes of the group (%s) took longer than %s (writes in flight in one of them did not drain); every member frozen is thawed (one still freezing as soon as its freeze returns), retry later: %w", len(sorted), strings.Join(sorted, ", "), timeout, context.DeadlineExceeded)
	}
}
