package node

import (
	"context"
	"fmt"

	"k8s.io/klog/v2"

	"github.com/podvol/podvol/internal/failpoint"
	"github.com/podvol/podvol/internal/pool"
	"github.com/podvol/podvol/internal/store"
)

// Expand grows a volume to size bytes: the image, the loop device and the
// filesystem. A volume that is not staged grows its image only; its
// filesystem follows when it is next staged.
func (n *Node) Expand(ctx context.Context, id, path string, size int64) (int64, error) {
	v, err := n.volume(id)
	if err != nil {
		return 0, err
	}
	if s := v.Stage; s != nil {
		if _, published := v.Publications[path]; !published && path != s.Path {
			return 0, fmt.Errorf("volume %s is not staged or published at %s: %w", id, path, pool.ErrNotFound)
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
	if t, direct := directPublication(v); direct {
		// The filesystem is the guest's: only the runtime can grow it.
		if err := n.resizeDirect(ctx, v, t); err != nil {
			return 0, err
		}
		return v.SizeBytes, n.pool.FsGrown(id)
	}
	if s.Block || !v.GrowFs {
		return v.SizeBytes, n.pool.FsGrown(id)
	}
	if err := n.growMounted(ctx, v); err != nil {
		return 0, err
	}
	return v.SizeBytes, n.pool.FsGrown(id)
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
		if err := n.dev.GrowOffline(ctx, s.Device); err != nil {
			// Leave the volume as staged as it was.
			_ = n.dev.Mount(ctx, s.Device, s.Path, v.FsType, s.MountFlags)
			return fmt.Errorf("grow filesystem of volume %s: %w", v.ID, err)
		}
		return n.dev.Mount(ctx, s.Device, s.Path, v.FsType, s.MountFlags)
	}
	if err := n.dev.GrowOnline(ctx, v.FsType, s.Device, s.Path); err != nil {
		return fmt.Errorf("grow the mounted %s filesystem of volume %s: %w; the image is grown, and the filesystem will be grown when the volume is next staged (restart the pod): %w", v.FsType, v.ID, err, pool.ErrInUse)
	}
	return nil
}

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
	if n.dev.LoopBackingFile(s.Device) != n.pool.ImagePath(v.ID) {
		// Not attached (a reboot took it): nothing writes to the image.
		return func() {}, nil
	}
	if _, direct := directPublication(v); s.Block || direct {
		if direct && !n.pool.Reflink() {
			// Without reflink the copy reads the image extent by
			// extent for as long as it takes, while the guest goes on
			// writing: the copy would be torn, not crash-consistent.
			// A reflink copy is one atomic step.
			return nil, fmt.Errorf("volume %s is assigned to a microVM and this pool's filesystem has no reflink, so a copy of it while the guest writes would be torn: stop the pod first, or put the pool on XFS or btrfs: %w", id, pool.ErrInUse)
		}
		return func() {}, n.dev.SyncDevice(s.Device)
	}
	f, err := n.dev.OpenFilesystemOn(s.Path, s.Device)
	if err != nil {
		return nil, fmt.Errorf("volume %s is not mounted at its staging path, so it cannot be frozen for a consistent copy (stage it again): %w: %w", id, err, pool.ErrNotStaged)
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
