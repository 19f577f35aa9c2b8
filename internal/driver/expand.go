package driver

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ControllerExpandVolume touches no pool: external-resizer runs once per
// cluster and may reach any node's plugin, not the one holding the volume.
// It validates the request and leaves the growth to NodeExpandVolume, which
// kubelet calls on the right node.
func (d *Driver) ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	if err := checkVolumeID(req.GetVolumeId()); err != nil {
		return nil, err
	}
	if req.GetCapacityRange() == nil {
		return nil, invalid("capacity range is required")
	}
	if c := req.GetVolumeCapability(); c != nil {
		if why := checkCapability(c); why != "" {
			return nil, invalid("%s", why)
		}
	}
	size, err := expandSize(req.GetCapacityRange())
	if err != nil {
		return nil, err
	}
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: size, NodeExpansionRequired: true}, nil
}

// expandSize is the size a volume grows to: required bytes rounded up like a
// new volume's, never beyond size.Max (OUT_OF_RANGE). Whether this
// node's pool can hold it is NodeExpandVolume's question (the pool's
// capacity check, RESOURCE_EXHAUSTED with the numbers, before it records).
func expandSize(r *csi.CapacityRange) (int64, error) {
	if r.GetRequiredBytes() <= 0 {
		return 0, status.Error(codes.InvalidArgument, "capacity range needs required_bytes > 0 to expand")
	}
	return sizeFor(r, "")
}

func (d *Driver) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	pl, id, err := d.volumeAtPath(req.GetVolumeId(), req.GetVolumePath())
	if err != nil {
		return nil, err
	}
	size, err := expandSize(req.GetCapacityRange())
	if err != nil {
		return nil, err
	}
	defer d.locks.Lock(req.GetVolumeId())()
	got, err := pl.Node.Expand(ctx, id, req.GetVolumePath(), size)
	if err != nil {
		return nil, toStatus(err)
	}
	return &csi.NodeExpandVolumeResponse{CapacityBytes: got}, nil
}
