// Package node makes a pool's volumes usable on this machine: it stages them
// (loop device, filesystem, staging mount), publishes them to the paths kubelet
// gives (bind mounts) and, after a restart, reconciles what the store says with
// what the kernel has.
package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/podvol/podvol/internal/device"
	"github.com/podvol/podvol/internal/directvolume"
	"github.com/podvol/podvol/internal/errkind"
	"github.com/podvol/podvol/internal/failpoint"
	"github.com/podvol/podvol/internal/pool"
	"github.com/podvol/podvol/internal/store"
)

// Node stages and publishes volumes of one pool.
type Node struct {
	pool   *pool.Pool
	store  *store.Store
	direct *directvolume.Shim // nil: no direct assignment
	dev    device.Interface

	// buffered turns direct I/O of loop devices off (--direct-io=false).
	buffered bool
	refused  refusals
	// discardMount mounts filesystems with discard instead of trimming
	// them (--discard=mount).
	discardMount bool
}

// How the space of files deleted in a volume goes back to the pool: the
// volume's filesystem discards the freed blocks, and the loop device punches
// them out of the sparse image. docs/design.md ("Data path") has the
// measurements behind the default.
const (
	// DiscardFstrim trims each filesystem volume (FITRIM) when it is
	// unstaged and periodically while it is staged: no cost to the
	// volume's I/O in between.
	DiscardFstrim = "fstrim"
	// DiscardMount mounts each filesystem with discard: space goes back
	// within seconds of a delete, at a cost to delete-heavy workloads.
	DiscardMount = "mount"
)

// DiscardModes are the values of --discard.
var DiscardModes = []string{DiscardFstrim, DiscardMount}

// SetDiscard sets how deleted space goes back to the pool, for mounts made
// from now on: DiscardFstrim (the default) or DiscardMount.
func (n *Node) SetDiscard(mode string) { n.discardMount = mode == DiscardMount }

// refusals counts loop devices attached buffered although direct I/O was
// asked for, because the pool's filesystem refused it.
type refusals struct {
	mu    sync.Mutex
	count int64
	last  string
}

// New returns a Node for p. direct configures Kata direct assignment; nil
// turns it off. dev is the machine the volumes are attached and mounted on:
// device.Host{} for this one, devicetest's fake in tests. A nil dev panics,
// so that a test that forgot its fake fails instead of acting on the host.
func New(p *pool.Pool, direct *directvolume.Shim, dev device.Interface) *Node {
	if dev == nil {
		panic("node.New: the device is nil: pass device.Host{} for this machine, or devicetest.New() in tests")
	}
	return &Node{pool: p, store: p.Store(), direct: direct, dev: dev}
}

// StageRequest is a validated NodeStageVolume.
type StageRequest struct {
	VolumeID    string
	StagingPath string
	Block       bool
	FsType      string // from the capability; "" means the volume's own
	MountFlags  []string
}

// SetDirectIO says whether loop devices attached from now on do direct I/O
// on their images (the default) or go through the host's page cache with
// 512-byte blocks, as they all did before (the escape hatch, and the
// "before" of the data path benchmark).
func (n *Node) SetDirectIO(on bool) { n.buffered = !on }

// DirectIORefused returns how many loop devices were attached buffered since
// the start because the pool's filesystem refused direct I/O, and what the
// last one was.
func (n *Node) DirectIORefused() (count int64, last string) {
	n.refused.mu.Lock()
	defer n.refused.mu.Unlock()
	return n.refused.count, n.refused.last
}

func (n *Node) volume(id string) (*store.Volume, error) { return n.pool.ReadyVolume(id) }

// Stage attaches the volume's image to a loop device and, for filesystem
// access, formats it if it is blank and mounts it at the staging path.
func (n *Node) Stage(ctx context.Context, r StageRequest) error {
	v, err := n.volume(r.VolumeID)
	if err != nil {
		return err
	}
	if s := v.Stage; s != nil && s.State == store.Staged {
		if s.Path != r.StagingPath || s.Block != r.Block {
			return fmt.Errorf("volume %s is already staged at %s (block=%v): %w", v.ID, s.Path, s.Block, errkind.ErrConflict)
		}
		if n.stageIntact(v) {
			return nil
		}
		// The mount or loop device went away under us (reboot, manual
		// unmount): stage again below.
	}
	if r.FsType != "" && r.FsType != v.FsType && !r.Block {
		return fmt.Errorf("volume %s was created for %s, the capability asks for %s: %w", v.ID, v.FsType, r.FsType, errkind.ErrInvalid)
	}
	if _, err := n.store.Update(v.ID, func(v *store.Volume) error {
		v.Stage = &store.Stage{Path: r.StagingPath, Block: r.Block, MountFlags: r.MountFlags, State: store.Staging}
		return nil
	}); err != nil {
		return err
	}
	failpoint.Hit("stage-after-record")

	dev, err := n.ensureLoop(v, r.Block)
	if err != nil {
		return n.failStage(v.ID, err)
	}
	if _, err := n.store.Update(v.ID, func(v *store.Volume) error {
		v.Stage.Device = dev
		return nil
	}); err != nil {
		return err
	}
	failpoint.Hit("stage-after-loop")

	if !r.Block {
		if err := n.mountStaging(ctx, v, dev, r.StagingPath, r.MountFlags); err != nil {
			return n.failStage(v.ID, err)
		}
		failpoint.Hit("stage-after-mount")
	} else if v.GrowFs {
		// A block volume has no filesystem of podvol's to grow.
		if err := n.pool.FsGrown(v.ID); err != nil {
			return err
		}
	}
	_, err = n.store.Update(v.ID, func(v *store.Volume) error {
		v.Stage.State = store.Staged
		return nil
	})
	return err
}

// failStage undoes a stage that could not complete, so that the volume is
// left as it was before and the CO's retry starts clean.
func (n *Node) failStage(id string, cause error) error {
	v, err := n.store.Volume(id)
	if err == nil && v.Stage != nil {
		if err := n.teardownStage(v); err != nil {
			klog.ErrorS(err, "Rolling back a failed stage", "volume", id)
		}
	}
	return cause
}

// ensureLoop returns the loop device of the volume's image, attaching one if
// there is none. Extra devices of the same image (a crash between attach and
// record) are detached unless mounted. A device attached before the plugin
// did direct I/O keeps its setup until the volume is unstaged: its block
// size cannot change under a mounted filesystem.
func (n *Node) ensureLoop(v *store.Volume, block bool) (string, error) {
	img := n.pool.ImagePath(v.ID)
	devs, err := n.dev.LoopsFor(img)
	if err != nil {
		return "", err
	}
	if len(devs) == 0 {
		opts := n.loopOptions(block)
		dev, err := n.dev.AttachLoop(img, opts)
		if err != nil {
			return "", fmt.Errorf("attach volume %s: %w", v.ID, err)
		}
		st, err := n.dev.LoopStatus(dev)
		if err != nil {
			klog.ErrorS(err, "Reading the setup of a loop device just attached", "volume", v.ID, "device", dev)
		} else if opts.DirectIO && !st.DirectIO {
			n.directIORefused(v.ID, img, dev, st)
		}
		klog.V(2).InfoS("Attached loop device", "volume", v.ID, "device", dev, "directIO", st.DirectIO, "blockSize", st.BlockSize)
		return dev, nil
	}
	keep := devs[0]
	if v.Stage != nil && slices.Contains(devs, v.Stage.Device) {
		keep = v.Stage.Device
	}
	for _, d := range devs {
		if d == keep {
			continue
		}
		if mnts, _ := n.dev.MountsOf(d); len(mnts) == 0 {
			if err := n.dev.DetachLoop(d, img); err != nil {
				klog.ErrorS(err, "Detaching a stray loop device", "volume", v.ID, "device", d)
			}
		}
	}
	return keep, nil
}

// loopOptions is how a volume's loop device is set up. A filesystem volume
// gets the pool's block size, or its filesystem's sector size if that is
// smaller (device.ChooseBlockSize). A raw block volume keeps 512-byte
// blocks, as it always had: its consumer's data (a partition table, a
// filesystem made in the pod, an application's O_DIRECT alignment) may
// depend on them, and podvol cannot tell.
func (n *Node) loopOptions(block bool) device.LoopOptions {
	tag := n.pool.LoopTag()
	switch {
	case n.buffered:
		return device.LoopOptions{BlockSize: device.LegacyBlockSize, Tag: tag}
	case block:
		return device.LoopOptions{DirectIO: true, BlockSize: device.LegacyBlockSize, Tag: tag}
	}
	return device.LoopOptions{DirectIO: true, Tag: tag}
}

// directIORefused records a loop device attached buffered against the
// plugin's wish: said once in the log (the pool's filesystem does not
// change while the plugin runs), counted for the metric and the pool's
// health.
func (n *Node) directIORefused(id, img, dev string, st device.LoopIO) {
	r := &n.refused
	r.mu.Lock()
	r.count++
	first := r.count == 1
	r.last = fmt.Sprintf("volume %s (%s, %d-byte blocks)", id, dev, st.BlockSize)
	r.mu.Unlock()
	msg := "The pool's filesystem refused direct I/O: the loop device reads and writes the image through the host's page cache, which then holds a second copy of the volume's data; put the pool on a filesystem that takes O_DIRECT (ext4, xfs)"
	if first {
		klog.InfoS(msg, "volume", id, "image", img, "device", dev, "blockSize", st.BlockSize)
		return
	}
	klog.V(2).InfoS(msg, "volume", id, "image", img, "device", dev, "blockSize", st.BlockSize)
}

func (n *Node) mountStaging(ctx context.Context, v *store.Volume, dev, path string, flags []string) error {
	if m, err := n.dev.MountedAt(path); err != nil {
		return err
	} else if m != nil {
		if m.Source == dev {
			return nil
		}
		return fmt.Errorf("staging path %s already has %s mounted: %w", path, m.Source, errkind.ErrConflict)
	}
	found, err := n.dev.Probe(ctx, dev)
	if err != nil {
		return fmt.Errorf("volume %s: %w", v.ID, err)
	}
	switch found {
	case "":
		if err := n.formattable(v); err != nil {
			return err
		}
		klog.InfoS("Formatting volume", "volume", v.ID, "fsType", v.FsType, "device", dev)
		if err := n.dev.Format(ctx, dev, v.FsType); err != nil {
			return fmt.Errorf("format volume %s: %w", v.ID, err)
		}
	case v.FsType:
		if err := n.dev.FsckIfNeeded(ctx, dev, found); err != nil {
			return fmt.Errorf("check filesystem of volume %s: %w", v.ID, err)
		}
		// The image grew while the volume was not mounted (offline
		// expansion, or a restore into a larger volume): ext4 grows
		// best before the mount, which needs no privilege beyond root.
		if v.GrowFs && found == "ext4" {
			if err := n.growUnmounted(ctx, v, dev); err != nil {
				return err
			}
			if err := n.pool.FsGrown(v.ID); err != nil {
				return err
			}
			v.GrowFs = false
		}
	default:
		return fmt.Errorf("volume %s holds %s, not %s: refusing to mount or format it: %w", v.ID, found, v.FsType, errkind.ErrInvalid)
	}
	if err := os.MkdirAll(path, 0o750); err != nil {
		return fmt.Errorf("create staging path: %w", err)
	}
	if err := n.dev.Mount(ctx, dev, path, v.FsType, n.stagingOptions(v.FsType, flags)); err != nil {
		return fmt.Errorf("mount volume %s: %w", v.ID, err)
	}
	if v.GrowFs {
		if err := n.dev.GrowOnline(ctx, v.FsType, dev, path); err != nil {
			return fmt.Errorf("grow filesystem of volume %s: %w", v.ID, err)
		}
		return n.pool.FsGrown(v.ID)
	}
	return nil
}

// formattable refuses to format a volume whose data podvol did not write:
// one pulled from another node (a restore, a clone, a migration's copy)
// that holds any data but no filesystem was found on. mkfs would destroy
// what the source held (its filesystem damaged on either node, or a raw
// block volume's data). One that holds no data at all was pulled from a
// source never formatted: nothing is lost, it is formatted as a new one.
func (n *Node) formattable(v *store.Volume) error {
	if !v.Pulled() {
		return nil
	}
	holds, err := n.pool.HoldsData(v.ID)
	if err != nil {
		return fmt.Errorf("volume %s, pulled from node %s: %w", v.ID, v.Source.Node, err)
	}
	if !holds {
		return nil
	}
	return fmt.Errorf("volume %s was pulled from node %s (%s %s) and holds data, but no %s filesystem was found on it: refusing to format it, which would destroy that data (its filesystem is damaged, on the source or in the copy, or it holds a raw block volume's data); restore the claim from a snapshot that holds its filesystem, or use it as a raw block volume: %w",
		v.ID, v.Source.Node, v.Source.Kind, v.Source.ID, v.FsType, errkind.ErrNoFilesystem)
}

// stageIntact reports whether the recorded stage still exists in the kernel.
func (n *Node) stageIntact(v *store.Volume) bool {
	s := v.Stage
	if !n.dev.LoopServes(s.Device, n.pool.ImagePath(v.ID)) {
		return false
	}
	if !n.handoverOf(v).mountsStaging() {
		// A direct-assigned volume is deliberately not mounted here.
		return true
	}
	return n.dev.MountedFrom(s.Path, s.Device) == nil
}

// ensureStaged makes sure that what a publication would bind is this
// volume's own: its filesystem on its loop device at the staging path, or
// for block its loop device still serving its image. A stage that went away
// (unmounted by hand, a remount that failed) is restored; if it cannot be,
// the publish fails, and never binds the empty directory underneath, where a
// pod would fill the node's own filesystem. It returns the volume as it is
// recorded afterwards.
func (n *Node) ensureStaged(ctx context.Context, v *store.Volume) (*store.Volume, error) {
	if n.stageIntact(v) {
		return v, nil
	}
	id, path := v.ID, v.Stage.Path
	klog.InfoS("The stage of volume is gone: staging it again before publishing", "volume", id, "stagingPath", path, "device", v.Stage.Device)
	_, err := n.restoreStage(ctx, v)
	if err == nil {
		if v, err = n.store.Volume(id); err == nil && !n.stageIntact(v) {
			err = errors.New("the staging path is not a directory any more")
		}
	}
	if err != nil {
		return nil, fmt.Errorf("volume %s is no longer staged at %s and could not be staged again (%v): refusing to publish anything else in its place; unstage and stage it again: %w", id, path, err, errkind.ErrNotStaged)
	}
	return v, nil
}

// Unstage unmounts the staging path and detaches the loop device.
func (n *Node) Unstage(ctx context.Context, id, stagingPath string) error {
	v, err := n.volume(id)
	if err != nil {
		return err
	}
	if v.Stage == nil {
		return nil
	}
	if v.Stage.Path != stagingPath {
		return fmt.Errorf("volume %s is staged at %s, not %s: %w", id, v.Stage.Path, stagingPath, errkind.ErrNotFound)
	}
	if live := n.livePublications(v); len(live) > 0 {
		return fmt.Errorf("volume %s is still published at %s: unpublish it first: %w", id, strings.Join(live, ", "), errkind.ErrInUse)
	}
	// The last chance to give back what the pod deleted while the volume
	// is not in use. An inline volume's image is deleted next anyway.
	if !n.discardMount && v.Inline == nil && v.Stage.State == store.Staged {
		if trimmed, err := n.trim(v, true); err != nil {
			klog.InfoS("Trimming the volume before unstaging it failed; unstaging anyway", "volume", id, "err", err)
		} else if trimmed > 0 {
			klog.V(2).InfoS("Trimmed volume", "volume", id, "bytes", trimmed)
		}
	}
	return n.teardownStage(v)
}

// Trim gives the space of files deleted in a staged filesystem volume back
// to the pool (device.Trim through a handle on the volume's own mount) and
// returns the bytes the filesystem discarded. A volume this host does not
// have mounted (not staged, block, assigned to a microVM) is left alone:
// its consumer's discards pass through the loop device by themselves. The
// caller holds the volume's lock, so that no unstage finds the mount busy
// and no snapshot finds it changing.
func (n *Node) Trim(id string) (int64, error) {
	v, err := n.store.Volume(id)
	if err != nil {
		return 0, err
	}
	if v.Stage == nil || v.Stage.State != store.Staged {
		return 0, nil
	}
	return n.trim(v, false)
}

// trim trims v's filesystem. idle: nothing uses it (at unstage), so it is
// frozen and thawed first: xfs frees a deleted file's blocks later, in the
// background (its inode garbage collection), and a freeze waits for that
// and commits the frees, so that the trim finds every one of them (make
// test saw a whole deleted GiB left after an unstage's trim).
func (n *Node) trim(v *store.Volume, idle bool) (int64, error) {
	s := v.Stage
	if !n.handoverOf(v).mountsStaging() {
		return 0, nil
	}
	h, err := n.dev.OpenFilesystemOn(s.Path, s.Device)
	if err != nil {
		return 0, fmt.Errorf("trim volume %s: %w", v.ID, err)
	}
	defer h.Close()
	if idle {
		if err := h.Freeze(); err != nil {
			return 0, fmt.Errorf("trim volume %s: %w", v.ID, err)
		}
		if err := h.Thaw(); err != nil {
			if err := h.Thaw(); err != nil {
				return 0, fmt.Errorf("trim volume %s: thaw after the freeze that settles its frees: %w", v.ID, err)
			}
		}
	}
	trimmed, err := h.Trim()
	if err != nil {
		return 0, fmt.Errorf("trim volume %s: %w", v.ID, err)
	}
	return trimmed, nil
}

// TrimAll trims every staged filesystem volume (Trim), one at a time, each
// under its lock (lock returns the release). Failures are logged: the next
// round tries again.
func (n *Node) TrimAll(ctx context.Context, lock func(key string) (unlock func())) {
	vols, err := n.store.Volumes()
	if err != nil {
		klog.ErrorS(err, "Listing volumes to trim")
		return
	}
	var total int64
	count := 0
	for _, v := range vols {
		if ctx.Err() != nil {
			return
		}
		if v.Stage == nil || v.Stage.Block {
			continue
		}
		// The CSI calls lock an inline volume by kubelet's handle.
		key := v.ID
		if v.Inline != nil {
			key = v.Inline.VolumeHandle
		}
		unlock := lock(key)
		trimmed, err := n.Trim(v.ID)
		unlock()
		switch {
		case errors.Is(err, store.ErrNotFound):
		case err != nil:
			klog.ErrorS(err, "Trimming a staged volume", "volume", v.ID)
		default:
			total += trimmed
			count++
		}
	}
	klog.V(2).InfoS("Trimmed staged volumes", "volumes", count, "bytes", total)
}

// teardownStage is idempotent: each step succeeds when already done, and the
// record goes last.
func (n *Node) teardownStage(v *store.Volume) error {
	s := v.Stage
	if !s.Block {
		if m, err := n.dev.MountedAt(s.Path); err != nil {
			return err
		} else if m != nil && (m.Source == s.Device || n.dev.LoopServes(m.Source, n.pool.ImagePath(v.ID))) {
			if err := n.dev.Unmount(s.Path); err != nil {
				return err
			}
		}
	}
	img := n.pool.ImagePath(v.ID)
	devs, err := n.dev.LoopsFor(img)
	if err != nil {
		return err
	}
	for _, d := range devs {
		if mnts, _ := n.dev.MountsOf(d); len(mnts) > 0 {
			return fmt.Errorf("volume %s: %s is still mounted at %s: %w", v.ID, d, strings.Join(mnts, ", "), errkind.ErrInUse)
		}
		if err := n.dev.DetachLoop(d, img); err != nil {
			return err
		}
	}
	_, err = n.store.Update(v.ID, func(v *store.Volume) error {
		v.Stage = nil
		v.Publications = nil
		return nil
	})
	return err
}

// livePublications drops publication records whose target is no longer
// mounted (a reboot, or a kubelet that cleaned up without us) and returns the
// targets that are.
func (n *Node) livePublications(v *store.Volume) []string {
	var live, stale []string
	for t := range v.Publications {
		if n.handoverAt(v, t).alive(t) {
			live = append(live, t)
		} else {
			stale = append(stale, t)
		}
	}
	if len(stale) > 0 {
		// Best effort: the stale records are left out of the answer either
		// way, and the next call tries again.
		if _, err := n.store.Update(v.ID, func(v *store.Volume) error {
			for _, t := range stale {
				delete(v.Publications, t)
			}
			return nil
		}); err != nil {
			klog.ErrorS(err, "Removing stale publication records", "volume", v.ID)
		}
	}
	slices.Sort(live)
	return live
}

// isDir reports whether path is an existing directory (not following a final
// symlink).
func isDir(path string) bool {
	fi, err := os.Lstat(path)
	return err == nil && fi.IsDir()
}

// RemoveTarget removes the file or empty directory at a target path. It is
// called only after the path was verified not to be a mount point.
func RemoveTarget(path string) error {
	err := os.Remove(path)
	if err == nil || errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("target %s is not a mount point and not empty: leaving it alone: %w", path, errkind.ErrInvalid)
	}
	return fmt.Errorf("remove target %s: %w", path, err)
}

// parentExists checks what the CSI spec makes the CO responsible for.
func parentExists(path string) error {
	if !isDir(filepath.Dir(path)) {
		return fmt.Errorf("parent directory of %s does not exist: %w", path, errkind.ErrNotFound)
	}
	return nil
}
