package driver

import (
	"context"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/podvol/podvol/internal/names"
	"github.com/podvol/podvol/internal/node"
	"github.com/podvol/podvol/internal/pool"
)

func (d *Driver) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	var caps []*csi.NodeServiceCapability
	for _, t := range []csi.NodeServiceCapability_RPC_Type{
		csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
		csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
		csi.NodeServiceCapability_RPC_EXPAND_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_HEALTH,
		csi.NodeServiceCapability_RPC_GET_STORAGE_HEALTH,
		csi.NodeServiceCapability_RPC_VOLUME_MOUNT_GROUP,
	} {
		caps = append(caps, &csi.NodeServiceCapability{Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: t}}})
	}
	return &csi.NodeGetCapabilitiesResponse{Capabilities: caps}, nil
}

func (d *Driver) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{
		NodeId:             d.cfg.NodeID,
		MaxVolumesPerNode:  d.cfg.MaxVolumes,
		AccessibleTopology: d.topology(),
	}, nil
}

// checkNodeRequest validates what stage and publish requests share.
func (d *Driver) checkNodeRequest(id, what, path string, c *csi.VolumeCapability) error {
	if err := checkVolumeID(id); err != nil {
		return err
	}
	if err := d.checkPath(what, path); err != nil {
		return err
	}
	if c == nil {
		return invalid("volume capability is required")
	}
	if why := checkCapability(c); why != "" {
		return invalid("%s", why)
	}
	return nil
}

func (d *Driver) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	c := req.GetVolumeCapability()
	if err := d.checkNodeRequest(req.GetVolumeId(), "staging target path", req.GetStagingTargetPath(), c); err != nil {
		return nil, err
	}
	pl, err := d.poolOf(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	defer d.locks.Lock(req.GetVolumeId())()
	// A migration has taken the volume's last data for another node: a
	// write here now would not follow it.
	if v, err := pl.Pool.Store().Volume(req.GetVolumeId()); err == nil && v.Moving != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is being moved to another node (its last data was taken for claim %s/%s at %s): it is not staged here again; "+
			"its claim is re-made on the new node, or, if the migration is cancelled, this volume may be staged once podvol notices (within a minute)",
			req.GetVolumeId(), v.Moving.Claim.Namespace, v.Moving.Claim.Name, v.Moving.Since.Format(time.RFC3339))
	}
	err = pl.Node.Stage(ctx, node.StageRequest{
		VolumeID:    req.GetVolumeId(),
		StagingPath: req.GetStagingTargetPath(),
		Block:       c.GetBlock() != nil,
		FsType:      c.GetMount().GetFsType(),
		MountFlags:  c.GetMount().GetMountFlags(),
	})
	if err != nil {
		return nil, toStatus(err)
	}
	return &csi.NodeStageVolumeResponse{}, nil
}

func (d *Driver) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	if err := checkVolumeID(req.GetVolumeId()); err != nil {
		return nil, err
	}
	if err := d.checkPath("staging target path", req.GetStagingTargetPath()); err != nil {
		return nil, err
	}
	pl, err := d.poolOf(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	defer d.locks.Lock(req.GetVolumeId())()
	if err := pl.Node.Unstage(ctx, req.GetVolumeId(), req.GetStagingTargetPath()); err != nil {
		return nil, toStatus(err)
	}
	return &csi.NodeUnstageVolumeResponse{}, nil
}

func (d *Driver) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	c := req.GetVolumeCapability()
	if err := d.checkNodeRequest(req.GetVolumeId(), "target path", req.GetTargetPath(), c); err != nil {
		return nil, err
	}
	defer d.locks.Lock(req.GetVolumeId())()
	if isInline(req) {
		if err := d.publishInline(ctx, req); err != nil {
			return nil, err
		}
		return &csi.NodePublishVolumeResponse{}, nil
	}
	if err := d.checkPath("staging target path", req.GetStagingTargetPath()); err != nil {
		return nil, err
	}
	mode := c.GetAccessMode().GetMode()
	if !pool.ValidID(req.GetVolumeId()) {
		// Kubelet's handle of an inline volume, without the context
		// that says so, is no volume to publish.
		return nil, status.Errorf(codes.NotFound, "volume %q does not exist on node %s", req.GetVolumeId(), d.cfg.NodeID)
	}
	pl, v, err := d.lookup(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	direct, err := d.directAssign(ctx, v.Parameters[names.ParamDirectAssign], req.GetVolumeContext())
	if err != nil {
		return nil, err
	}
	err = pl.Node.Publish(ctx, node.PublishRequest{
		VolumeID:    req.GetVolumeId(),
		StagingPath: req.GetStagingTargetPath(),
		TargetPath:  req.GetTargetPath(),
		Block:       c.GetBlock() != nil,
		ReadOnly:    req.GetReadonly() || mode == csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY,
		MountFlags:  c.GetMount().GetMountFlags(),
		Exclusive:   mode == csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
		Direct:      direct,
		FsGroup:     c.GetMount().GetVolumeMountGroup(),

		FsGroupChangePolicy: v.Parameters[names.ParamFsGroupChangePolicy],
	})
	if err != nil {
		return nil, toStatus(err)
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

func (d *Driver) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	if err := checkVolumeID(req.GetVolumeId()); err != nil {
		return nil, err
	}
	if err := d.checkPath("target path", req.GetTargetPath()); err != nil {
		return nil, err
	}
	defer d.locks.Lock(req.GetVolumeId())()
	if pl, _, ok := d.inlineID(req.GetVolumeId()); ok {
		if err := pl.Inline.Unpublish(ctx, req.GetVolumeId(), req.GetTargetPath()); err != nil {
			return nil, toStatus(err)
		}
		return &csi.NodeUnpublishVolumeResponse{}, nil
	}
	pl, err := d.poolOf(req.GetVolumeId())
	if err != nil {
		// No volume of this node: what is left is the target, which
		// any pool's node removes the same way if nothing is mounted
		// there (a repeated unpublish succeeds).
		pl = d.pools[d.names[0]]
	}
	if err := pl.Node.Unpublish(ctx, req.GetVolumeId(), req.GetTargetPath()); err != nil {
		return nil, toStatus(err)
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// volumeAtPath validates a request naming a volume and one of its paths and
// returns its pool and the pool's id. The path is compared with the ones the volume was
// staged and published at; the only other one looked at (stat) is a raw
// block volume's device node at kubelet's map path. An unknown one is
// NOT_FOUND, found by the layers below.
func (d *Driver) volumeAtPath(id, path string) (*Pool, string, error) {
	if err := checkVolumeID(id); err != nil {
		return nil, "", err
	}
	if path == "" {
		return nil, "", invalid("volume path is required")
	}
	pl, v, err := d.lookup(id)
	if err != nil {
		return nil, "", err
	}
	// A path that is not clean and absolute, or lies in a pool, is none
	// of the volume's: NOT_FOUND, as the spec words it, and never looked at.
	if err := d.checkPath("volume path", path); err != nil {
		return nil, "", status.Errorf(codes.NotFound, "volume %s has no path %q: %s", id, path, status.Convert(err).Message())
	}
	return pl, v.ID, nil
}

func (d *Driver) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	pl, id, err := d.volumeAtPath(req.GetVolumeId(), req.GetVolumePath())
	if err != nil {
		return nil, err
	}
	st, err := pl.Node.VolumeStats(ctx, id, req.GetVolumePath())
	if err != nil {
		return nil, toStatus(err)
	}
	if st.Block {
		return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{{Unit: csi.VolumeUsage_BYTES, Total: st.TotalBytes}}}, nil
	}
	return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
		{Unit: csi.VolumeUsage_BYTES, Total: st.TotalBytes, Available: st.AvailableBytes, Used: st.UsedBytes},
		{Unit: csi.VolumeUsage_INODES, Total: st.TotalInodes, Available: st.FreeInodes, Used: st.UsedInodes},
	}}, nil
}
