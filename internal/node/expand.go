package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"k8s.io/klog/v2"

	"github.com/podvol/podvol/internal/directvolume"
	"github.com/podvol/podvol/internal/errkind"
	"github.com/podvol/podvol/internal/failpoint"
	"github.com/podvol/podvol/internal/store"
)

// Expand grows a volume to size bytes: the image, the loop device and the
// filesystem. A volume that is not staged grows its image only; its
// filesystem follows when it is next staged. It returns the volume's
// recorded size, which is the device's size once it succeeded.
func (n *Node) Expand(ctx context.Context, id, path string, size int64) (int64, error) {
	v, err := n.volume(id)
	if err != nil {
		return 0, err
	}
	if s := v.Stage; s != nil {
		if _, published := v.Publications[path]; !published && path != s.Path {
			return 0, fmt.Errorf("volume %s is not staged or published at %s: %w", id, path, errkind.ErrNotFound)
		}
	}
	if v, err = n.pool.GrowVolume(id, size); err != nil {
		return 0, err
	}
	s := v.Stage
	if s == nil || s.State != store.Staged {
		return v.SizeBytes, nil
	}
	if err := n.dev.LoopSetCapacity(s.Device); err != nil {
		return 0, err
	}
	if err := n.handoverOf(v).grow(ctx, v); err != nil {
		return 0, err
	}
	return v.SizeBytes, n.pool.FsGrown(id)
}

// grow of a host mount: the staged filesystem, if it is to grow.
func (h hostMount) grow(ctx context.Context, v *store.Volume) error {
	if h.block || !v.GrowFs {
		return nil
	}
	return h.n.growMounted(ctx, v)
}

// grow of a microVM's volume: by the runtime once a sandbox has it, else
// on the host before the guest boots.
func (m microVM) grow(ctx context.Context, v *store.Volume) error {
	taken, err := m.n.sandboxTook(m.target)
	if err != nil {
		return err
	}
	if taken {
		// The filesystem is the guest's: only the runtime can grow it.
		return m.n.resizeDirect(ctx, v, m.target)
	}
	// Assigned, but no sandbox has taken it yet: kubelet calls
	// NodeExpandVolume after NodePublishVolume and before it has the
	// runtime create the pod's sandbox. Nothing mounts the filesystem,
	// so it grows on the host now, and the guest boots with it.
	if !v.Stage.Block && v.GrowFs {
		return m.n.growAssigned(ctx, v)
	}
	return nil
}

// growMounted grows the filesystem of a staged volume. xfs grows online.
// ext4 grows offline when no pod has it published (unmount, check, grow,
// mount again: safe, and it works where online growth is not allowed), and
// online otherwise.
func (n *Node) growMounted(ctx context.Context, v *store.Volume) error {
	s := v.Stage
	if v.FsType == "ext4" && len(n.livePublications(v)) == 0 {
		klog.InfoS("Growing ext4 offline", "volume", v.ID, "device", s.Device)
		if err := n.dev.Unmount(s.Path); err != nil {
			return err
		}
		failpoint.Hit("grow-offline-after-unmount")
		if err := n.growUnmounted(ctx, v, s.Device); err != nil {
			// Leave the volume as staged as it was.
			if merr := n.dev.Mount(ctx, s.Device, s.Path, v.FsType, n.stagingOptions(v.FsType, s.MountFlags)); merr != nil {
				klog.ErrorS(merr, "Mounting the staging path again after a failed offline growth", "volume", v.ID, "stagingPath", s.Path)
			}
			return err
		}
		return n.dev.Mount(ctx, s.Device, s.Path, v.FsType, n.stagingOptions(v.FsType, s.MountFlags))
	}
	if err := n.dev.GrowOnline(ctx, v.FsType, s.Device, s.Path); err != nil {
		return fmt.Errorf("grow the mounted %s filesystem of volume %s: %w; the image is grown, and the filesystem will be grown when the volume is next staged (restart the pod): %w", v.FsType, v.ID, err, errkind.ErrInUse)
	}
	return nil
}

// sandboxTook reports whether a sandbox has taken the volume assigned at
// target: the runtime writes its id beside the mount information when it
// does. A directory that is gone has no sandbox either.
func (n *Node) sandboxTook(target string) (bool, error) {
	if n.direct == nil {
		return false, fmt.Errorf("direct assignment is not configured on this plugin: %w", errkind.ErrInvalid)
	}
	id, err := directvolume.Sandbox(n.direct.Root, target)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("look for the sandbox of %s: %w", target, err)
	}
	return id != "", nil
}

// growAssigned grows the filesystem of a volume assigned to a microVM that
// no sandbox has taken yet. Its staging mount is gone (publishDirect took
// it), so the filesystem is grown unmounted, as a stage grows it before it
// mounts; the kernel, not the record, says that nothing mounts it.
func (n *Node) growAssigned(ctx context.Context, v *store.Volume) error {
	dev := v.Stage.Device
	if !n.dev.LoopServes(dev, n.pool.ImagePath(v.ID)) {
		return fmt.Errorf("volume %s: %s no longer serves its image; unpublish and unstage it, and stage it again: %w", v.ID, dev, errkind.ErrNotStaged)
	}
	if mnts, err := n.dev.MountsOf(dev); err != nil {
		return err
	} else if len(mnts) > 0 {
		return fmt.Errorf("volume %s is assigned to a microVM, yet %s is mounted at %v: not growing a mounted filesystem behind its back: %w", v.ID, dev, mnts, errkind.ErrInUse)
	}
	found, err := n.dev.Probe(ctx, dev)
	if err != nil {
		return fmt.Errorf("volume %s: %w", v.ID, err)
	}
	if found != v.FsType {
		return fmt.Errorf("volume %s holds %q, not %s: refusing to grow it: %w", v.ID, found, v.FsType, errkind.ErrInvalid)
	}
	klog.InfoS("Growing the filesystem of a volume assigned to a microVM that has not started yet", "volume", v.ID, "fsType", v.FsType, "device", dev)
	return n.growUnmounted(ctx, v, dev)
}

// growUnmounted grows the filesystem on dev, which nothing mounts, to fill
// the device: ext4 offline (e2fsck -f, resize2fs), which needs no privilege
// beyond root; xfs grows only while mounted, so at a private mount of its
// own below the pool (growDir), gone again when this returns. Both are
// idempotent: a filesystem that fills its device already stays as it is.
func (n *Node) growUnmounted(ctx context.Context, v *store.Volume, dev string) error {
	var err error
	switch v.FsType {
	case "ext4":
		err = n.dev.GrowOffline(ctx, dev)
	case "xfs":
		err = n.growAtPrivateMount(ctx, v, dev)
	default:
		err = fmt.Errorf("cannot grow %s: %w", v.FsType, errkind.ErrInvalid)
	}
	if err != nil {
		return fmt.Errorf("grow filesystem of volume %s: %w", v.ID, err)
	}
	return nil
}

// growDir holds the private mounts of growUnmounted: inside the pool, which
// no CO path may name (the driver refuses them) and which deploy/base mounts
// into the plugin without propagation, so nothing else sees these mounts.
func (n *Node) growDir() string { return filepath.Join(n.pool.Dir(), "growing") }

// growAtPrivateMount mounts the xfs on dev at growDir/<id>, grows it and
// unmounts it. A crash in between leaves the mount, which cleanGrowMounts
// removes at the next start (and this function itself before it mounts).
func (n *Node) growAtPrivateMount(ctx context.Context, v *store.Volume, dev string) error {
	dir := n.growDir()
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	if !isDir(dir) {
		return fmt.Errorf("%s is not a directory: %w", dir, errkind.ErrUnusable)
	}
	mnt := filepath.Join(dir, v.ID)
	if err := n.removeGrowMount(mnt); err != nil {
		return err
	}
	if err := os.Mkdir(mnt, 0o700); err != nil {
		return err
	}
	if err := n.dev.Mount(ctx, dev, mnt, v.FsType, withNoUUID(v.FsType, []string{"nosuid", "nodev", "noexec"})); err != nil {
		return errors.Join(err, os.Remove(mnt))
	}
	failpoint.Hit("grow-assigned-after-mount")
	err := n.dev.GrowOnline(ctx, v.FsType, dev, mnt)
	if rerr := n.removeGrowMount(mnt); rerr != nil {
		// The guest must never get a filesystem the host still mounts:
		// the error keeps kubelet retrying, and the retry (or the next
		// start) unmounts it first.
		return errors.Join(err, rerr)
	}
	return err
}

// removeGrowMount unmounts and removes one private mount directory of
// growAtPrivateMount; both steps succeed when already done.
func (n *Node) removeGrowMount(mnt string) error {
	if err := n.dev.Unmount(mnt); err != nil {
		return fmt.Errorf("unmount the private growth mount %s: %w", mnt, err)
	}
	if err := os.Remove(mnt); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove the private growth mount %s: %w", mnt, err)
	}
	return nil
}

// cleanGrowMounts removes the private mounts a crash left in growDir.
func (n *Node) cleanGrowMounts() error {
	ents, err := os.ReadDir(n.growDir())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		mnt := filepath.Join(n.growDir(), e.Name())
		klog.InfoS("Removing a private growth mount left by an interrupted NodeExpandVolume", "path", mnt)
		errs = append(errs, n.removeGrowMount(mnt))
	}
	return errors.Join(errs...)
}

// withNoUUID adds nouuid to the mount options of an xfs: a clone or restore
// carries its source's UUID, and XFS refuses to mount a second filesystem
// with a UUID already mounted.
func withNoUUID(fsType string, flags []string) []string {
	if fsType == "xfs" && !hasFlag(flags, "nouuid") {
		return append(slices.Clip(flags), "nouuid")
	}
	return flags
}

// stagingOptions are the mount options of a volume's own filesystem mount
// (the staging mount, or an inline volume's target): the StorageClass's
// flags, nouuid for xfs, and with --discard=mount, discard (unless the flags
// say nodiscard).
func (n *Node) stagingOptions(fsType string, flags []string) []string {
	flags = withNoUUID(fsType, flags)
	if n.discardMount && !hasFlag(flags, "discard") && !hasFlag(flags, "nodiscard") {
		flags = append(slices.Clip(flags), "discard")
	}
	return flags
}
