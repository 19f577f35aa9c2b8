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
// filesystem is frozen (flushed, writes held) until the returned undo runs.
// Nothing holds the writes to a raw block device, nor a microVM's guest
// writing its assigned volume (the guest owns its filesystem, and the host
// has nothing of it to freeze: its staging directory is then an empty
// directory on the node's filesystem, which must never be frozen): such a
// volume is only flushed, and its copy is one instant (crash-consistent, as
// a cloud disk is snapshotted while attached) only if it is one atomic
// step, a reflink. On a pool without reflink it is refused (ErrInUse).
func (n *Node) Quiesce(id string) (func(), error) {
	v, h := n.live(id)
	if v == nil {
		return func() {}, nil
	}
	if what := h.unheld(v); what != "" {
		if err := n.atomicCopyOnly(v, what); err != nil {
			return nil, err
		}
	}
	return h.quiesce(v)
}

// live returns volume id and its handover if a consumer may be writing it
// now: staged, its loop device serving its image; nil otherwise (not
// staged, or not attached since a reboot: nothing writes to the image).
func (n *Node) live(id string) (*store.Volume, handover) {
	v, err := n.store.Volume(id)
	if err != nil || v.Stage == nil || v.Stage.State != store.Staged {
		return nil, nil
	}
	if !n.dev.LoopServes(v.Stage.Device, n.pool.ImagePath(v.ID)) {
		return nil, nil
	}
	return v, n.handoverOf(v)
}

// atomicCopyOnly refuses a copy of volume v, whose writes nothing holds
// (what it is), on a pool without reflink: a sparse copy reads the image
// extent by extent for as long as the data takes while the writes go on,
// so it would be torn, an image of no instant. A reflink copy is one
// atomic step: FICLONE takes the image's locks and waits for the direct
// I/O in flight, so every write its consumer saw complete is in the copy
// and none is in it half.
func (n *Node) atomicCopyOnly(v *store.Volume, what string) error {
	if n.pool.Reflink() {
		return nil
	}
	return fmt.Errorf("volume %s is %s and this pool's filesystem has no reflink: nothing can hold its writes, so a copy read while they go on would be torn, not one instant: stop the pod that uses it (the copy is made once the volume is unstaged), or put the pool on XFS or btrfs, whose reflink copies are atomic: %w", v.ID, what, errkind.ErrInUse)
}

func (microVM) unheld(*store.Volume) string { return "assigned to a microVM in use" }

// quiesce of a microVM's volume: flushed, for a crash-consistent copy.
func (m microVM) quiesce(v *store.Volume) (func(), error) {
	return func() {}, m.n.dev.SyncDevice(v.Stage.Device)
}

func (h hostMount) unheld(v *store.Volume) string {
	if v.Stage.Block {
		return "a raw block volume in use"
	}
	return ""
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
// Quiesce does each, and returns the undo that releases them all.
//
// The group is one instant when every member's writes are held while all
// are copied, or all but one, whose atomic copy (a reflink) is then the
// instant: the held members do not change around it. So a group with two
// or more members whose writes nothing holds (raw block volumes in use,
// volumes assigned to a microVM in use), each copied at its own instant,
// is refused (ErrInUse), before anything is frozen.
//
// They are frozen in id order, whatever the order asked: two groups that
// share volumes then freeze them in the same order and cannot each hold one
// the other waits for. A freeze waits for the writes in flight, so the
// whole group has one deadline: when it passes, QuiesceGroup fails
// (context.DeadlineExceeded), every member frozen by then is thawed at
// once, and a freeze still under way is thawed as soon as it returns; no
// later member is frozen. Every path thaws.
func (n *Node) QuiesceGroup(ids []string, timeout time.Duration) (func(), error) {
	sorted := slices.Sorted(slices.Values(ids))
	var unheld []string
	for _, id := range sorted {
		v, h := n.live(id)
		if v == nil {
			continue
		}
		what := h.unheld(v)
		if what == "" {
			continue
		}
		if err := n.atomicCopyOnly(v, what); err != nil {
			return nil, err
		}
		unheld = append(unheld, fmt.Sprintf("%s (%s)", id, what))
	}
	if len(unheld) > 1 {
		return nil, fmt.Errorf("volumes %s cannot be frozen: nothing holds the writes to a raw block device or to a microVM's disk, so each is copied at its own instant, and a group with more than one of them in use would not be one instant: stop the pods that use all but one of them (a group may hold one such volume in use, with any number of mounted ones), or take a snapshot of each: %w", strings.Join(unheld, ", "), errkind.ErrInUse)
	}

	var (
		mu        sync.Mutex
		undos     []func() // of the members frozen so far, in order
		abandoned bool     // the deadline passed
	)
	thaw := func(us []func()) {
		for i := len(us) - 1; i >= 0; i-- {
			us[i]()
		}
	}
	done := make(chan error, 1)
	go func() {
		for _, id := range sorted {
			u, err := n.Quiesce(id)
			mu.Lock()
			if abandoned {
				// The caller thawed the members before this one when
				// the deadline passed: this one, frozen late, goes
				// too, and no later one is frozen.
				mu.Unlock()
				if err == nil {
					u()
				}
				return
			}
			if err != nil {
				us := undos
				undos = nil
				mu.Unlock()
				thaw(us)
				done <- err
				return
			}
			undos = append(undos, u)
			mu.Unlock()
		}
		done <- nil
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case err := <-done:
		if err != nil {
			return nil, err
		}
		mu.Lock()
		us := undos
		mu.Unlock()
		return func() { thaw(us) }, nil
	case <-timer.C:
		mu.Lock()
		abandoned = true
		us := undos // all of them if the last freeze returned just now
		undos = nil
		mu.Unlock()
		thaw(us)
		klog.InfoS("Group freeze timed out; thawed", "volumes", sorted, "timeout", timeout, "thawed", len(us))
		return nil, fmt.Errorf("freezing the %d volumes of the group (%s) took longer than %s (writes in flight in one of them did not drain); every member frozen is thawed (one still freezing as soon as its freeze returns), retry later: %w", len(sorted), strings.Join(sorted, ", "), timeout, context.DeadlineExceeded)
	}
}
