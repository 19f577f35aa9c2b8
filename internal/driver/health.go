package driver

import (
	"context"
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/podvol/podvol/internal/node"
)

var severity = map[node.Severity]csi.VolumeHealthErrorType{
	node.Degraded:     csi.VolumeHealthErrorType_DEGRADED,
	node.Inaccessible: csi.VolumeHealthErrorType_INACCESSIBLE,
	node.DataLoss:     csi.VolumeHealthErrorType_DATA_LOSS,
}

func (d *Driver) volumeHealth(ctx context.Context, pl *Pool, id string, viaRuntime bool) (*csi.VolumeHealth, error) {
	cs, err := pl.Node.Health(ctx, id, viaRuntime)
	if err != nil {
		return nil, toStatus(err)
	}
	h := &csi.VolumeHealth{VolumeId: id}
	for _, c := range cs {
		h.HealthStatuses = append(h.HealthStatuses, &csi.VolumeHealth_VolumeHealthEntry{Status: severity[c.Severity], Reason: c.Reason, Message: c.Message})
	}
	return h, nil
}

func (d *Driver) ControllerGetVolumeHealth(ctx context.Context, req *csi.ControllerGetVolumeHealthRequest) (*csi.ControllerGetVolumeHealthResponse, error) {
	pl, _, err := d.lookup(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	h, err := d.volumeHealth(ctx, pl, req.GetVolumeId(), false)
	if err != nil {
		return nil, err
	}
	return &csi.ControllerGetVolumeHealthResponse{VolumeHealth: h}, nil
}

func (d *Driver) ControllerListVolumeHealth(ctx context.Context, req *csi.ControllerListVolumeHealthRequest) (*csi.ControllerListVolumeHealthResponse, error) {
	vols, next, err := d.volumePage(req.GetMaxEntries(), req.GetStartingToken())
	if err != nil {
		return nil, err
	}
	resp := &csi.ControllerListVolumeHealthResponse{NextToken: next}
	for _, v := range vols {
		var h *csi.VolumeHealth
		pl, err := d.poolOf(v.ID)
		if err == nil {
			h, err = d.volumeHealth(ctx, pl, v.ID, false)
		}
		if status.Code(err) == codes.NotFound {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, err
		}
		resp.Entries = append(resp.Entries, h)
	}
	return resp, nil
}

func (d *Driver) NodeGetVolumeHealth(ctx context.Context, req *csi.NodeGetVolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error) {
	pl, v, err := d.lookup(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	h, err := d.volumeHealth(ctx, pl, v.ID, true)
	if err != nil {
		return nil, err
	}
	h.VolumeId = req.GetVolumeId()
	return &csi.NodeGetVolumeHealthResponse{VolumeHealth: h}, nil
}

// NodeGetStorageHealth reports on each pool: whether it can serve, whether
// its filesystem can still hold everything the volumes were promised, and
// whether its capacity was reduced at start to what the filesystem could
// give. Each entry names its pool.
func (d *Driver) NodeGetStorageHealth(ctx context.Context, req *csi.NodeGetStorageHealthRequest) (*csi.NodeGetStorageHealthResponse, error) {
	resp := &csi.NodeGetStorageHealthResponse{}
	err := d.eachPool(func(pl *Pool) error {
		add := func(s csi.StorageHealthErrorType, reason, format string, a ...any) {
			resp.BackendHealth = append(resp.BackendHealth, &csi.NodeGetStorageHealthResponse_StorageBackendHealth{
				Status: s, Reason: reason, Message: fmt.Sprintf("pool %s: ", pl.Pool.Name()) + fmt.Sprintf(format, a...),
			})
		}
		if err := pl.Pool.Check(); err != nil {
			add(csi.StorageHealthErrorType_STORAGE_UNREACHABLE, "PoolUnusable", "%v: check the pool directory and its filesystem", err)
			return nil
		}
		free, promised, err := pl.Pool.Unwritten()
		if err != nil {
			return toStatus(fmt.Errorf("pool %s: %w", pl.Pool.Name(), err))
		}
		if free < promised {
			add(csi.StorageHealthErrorType_STORAGE_DEGRADED, "PoolOvercommitted", "the pool filesystem has %d bytes free, but volumes and snapshots may still write %d into their sparse images: writes may fail with ENOSPC; give the pool its own filesystem or lower its capacity", free, promised)
		}
		if total, _ := pl.Pool.Capacity(); total < pl.Pool.ConfiguredCapacity() {
			add(csi.StorageHealthErrorType_STORAGE_DEGRADED, "PoolCapacityReduced", "its capacity, %d bytes given, was reduced to %d at the plugin's start, all its filesystem could give its volumes then (%s): other files fill it, and volumes beyond that are refused (RESOURCE_EXHAUSTED); make room on the filesystem and restart the plugin, or lower the capacity given", pl.Pool.ConfiguredCapacity(), total, pl.Pool.Room())
		}
		if n, last := pl.Node.DirectIORefused(); n > 0 {
			add(csi.StorageHealthErrorType_STORAGE_DEGRADED, "DirectIORefused", "the pool filesystem refused direct I/O for %d loop device(s) since the plugin started (the last: %s): they work, through the host's page cache, which holds a second copy of their data that no pod's memory limit counts; put the pool on a filesystem that takes O_DIRECT (ext4, xfs), or start the plugin with --direct-io=false to stop asking", n, last)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}
