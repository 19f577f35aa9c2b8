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
			if merr := n.dev.Mount(ctx, s.Device, s.Path, v.FsType, s.MountFlags); merr != nil {
				klog.ErrorS(merr, "Mounting the staging path again after a failed offline growth", "volume", v.ID, "stagingPath", s.Path)
			}
			return fmt.Errorf("grow filesystem of volume %s: %w", v.ID, err)
		}
		return n.dev.Mount(ctx, s.Device, s.Path, v.FsType, s.MountFlags)
	}
	if err := n.dev.GrowOnline(ctx, v.FsType, s.Device, s.Path); err != nil {
		return fmt.Errorf("grow the mounted %s filesystem of volume %s: %w; the image is grown, and the filesystem will be grown when the volume is next staged (restart the pod): %w", v.FsType, v.ID, err, pool.ErrInUse)
	}
	return nil
}
