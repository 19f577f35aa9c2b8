package node

import (
	"context"
	"fmt"

	"github.com/podvol/podvol/internal/device"
	"github.com/podvol/podvol/internal/errkind"
	"github.com/podvol/podvol/internal/store"
)

// Stats is what NodeGetVolumeStats reports.
type Stats struct {
	Block bool
	device.FSStats
}

// VolumeStats reports usage of a volume at one of its staging or target
// paths; any other path is refused.
func (n *Node) VolumeStats(ctx context.Context, id, path string) (Stats, error) {
	v, err := n.volume(id)
	if err != nil {
		return Stats{}, err
	}
	s := v.Stage
	_, published := v.Publications[path]
	if s == nil || (!published && s.Path != path && !n.mapsBlock(s, path)) {
		return Stats{}, fmt.Errorf("volume %s is not staged or published at %s: %w", id, path, errkind.ErrNotFound)
	}
	return n.handoverOf(v).stats(ctx, v, path)
}

// stats of a host mount: the filesystem at path, or the device's size.
func (h hostMount) stats(ctx context.Context, v *store.Volume, path string) (Stats, error) {
	n, s, id := h.n, v.Stage, v.ID
	if s.Block {
		size, err := n.dev.DeviceSize(s.Device)
		if err != nil {
			return Stats{}, err
		}
		return Stats{Block: true, FSStats: device.FSStats{TotalBytes: size}}, nil
	}
	m, err := n.dev.MountedAt(path)
	if err != nil {
		return Stats{}, err
	}
	if m == nil {
		return Stats{}, fmt.Errorf("volume %s: %s is not mounted any more: %w", id, path, errkind.ErrNotFound)
	}
	fs, err := n.dev.Statfs(path)
	return Stats{FSStats: fs}, err
}

// mapsBlock tells whether path is a device node of a block stage's loop
// device: kubelet asks for a raw block volume's stats at its own map path
// (volumeDevices/<pv>/dev/<pod uid>, a bind of the file podvol published),
// never at the target. Only the volume's own device answers, so no path
// can read another volume's size.
func (n *Node) mapsBlock(s *store.Stage, path string) bool {
	return s.Block && s.State == store.Staged && n.dev.DeviceNodeOf(path, s.Device) == nil
}
