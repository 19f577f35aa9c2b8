package driver

import (
	"context"
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/podvol/podvol/internal/names"
	"github.com/podvol/podvol/internal/pool"
	"github.com/podvol/podvol/internal/size"
	"github.com/podvol/podvol/internal/store"
)

func (d *Driver) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	var caps []*csi.ControllerServiceCapability
	for _, t := range []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES_PUBLISHED_NODES,
		csi.ControllerServiceCapability_RPC_GET_VOLUME,
		csi.ControllerServiceCapability_RPC_GET_CAPACITY,
		csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
		csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
		csi.ControllerServiceCapability_RPC_GET_SNAPSHOT,
		csi.ControllerServiceCapability_RPC_CLONE_VOLUME,
		csi.ControllerServiceCapability_RPC_EXPAND_VOLUME,
		csi.ControllerServiceCapability_RPC_GET_VOLUME_HEALTH,
		csi.ControllerServiceCapability_RPC_LIST_VOLUME_HEALTH,
	} {
		caps = append(caps, &csi.ControllerServiceCapability{Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: t}}})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

func (d *Driver) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	name := req.GetName()
	if name == "" {
		return nil, invalid("volume name is required")
	}
	if len(name) > pool.MaxNameLength {
		return nil, invalid("volume name is %d bytes long, at most %d are allowed", len(name), pool.MaxNameLength)
	}
	if err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
		return nil, err
	}
	params, err := volumeParameters(req.GetParameters())
	if err != nil {
		return nil, err
	}
	fsType, err := fsTypeFor(req.GetVolumeCapabilities(), params)
	if err != nil {
		return nil, err
	}
	size, err := sizeFor(req.GetCapacityRange(), fsType)
	if err != nil {
		return nil, err
	}
	source, err := d.contentSource(req.GetVolumeContentSource())
	if err != nil {
		return nil, err
	}
	if !d.topologyAllows(req.GetAccessibilityRequirements()) {
		return nil, status.Errorf(codes.ResourceExhausted, "the requisite topology does not include this node (%s=%s): podvol provisions only on the node that runs this plugin", names.TopologyKey, d.cfg.NodeID)
	}

	defer d.locks.Lock("name/" + name)()
	if source != nil && source.Kind == store.FromVolume {
		// As for a snapshot: no unstage or offline growth of the source
		// may run while it is frozen and copied.
		defer d.locks.Lock(source.ID)()
	}
	format := true
	for _, c := range req.GetVolumeCapabilities() {
		format = format && c.GetMount() != nil
	}
	v, err := d.cfg.Pool.CreateVolume(ctx, pool.CreateRequest{Name: name, SizeBytes: size, FsType: fsType, Parameters: params, Source: source, Format: format, Quiesce: d.cfg.Node.Quiesce})
	if err != nil {
		return nil, toStatus(err)
	}
	return &csi.CreateVolumeResponse{Volume: d.csiVolume(v)}, nil
}

func (d *Driver) csiVolume(v *store.Volume) *csi.Volume {
	cv := &csi.Volume{
		VolumeId:           v.ID,
		CapacityBytes:      v.SizeBytes,
		VolumeContext:      map[string]string{names.ParamFsType: v.FsType},
		AccessibleTopology: []*csi.Topology{d.topology()},
	}
	switch src := v.Source; {
	case src == nil:
	case src.Kind == store.FromSnapshot:
		cv.ContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: d.snapshotHandle(src.ID)}}}
	case src.Kind == store.FromVolume:
		cv.ContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: src.ID}}}
	}
	return cv
}

// contentSource translates a CreateVolume's content source. Its existence is
// checked by the pool (NOT_FOUND).
func (d *Driver) contentSource(cs *csi.VolumeContentSource) (*store.Source, error) {
	switch {
	case cs == nil:
		return nil, nil
	case cs.GetSnapshot() != nil:
		if err := checkVolumeID(cs.GetSnapshot().GetSnapshotId()); err != nil {
			return nil, invalid("source snapshot id is required and must be well-formed")
		}
		id, err := d.snapshotID(cs.GetSnapshot().GetSnapshotId())
		if err != nil {
			return nil, err
		}
		return &store.Source{Kind: store.FromSnapshot, ID: id}, nil
	case cs.GetVolume() != nil:
		if err := checkVolumeID(cs.GetVolume().GetVolumeId()); err != nil {
			return nil, invalid("source volume id is required and must be well-formed")
		}
		return &store.Source{Kind: store.FromVolume, ID: cs.GetVolume().GetVolumeId()}, nil
	}
	return nil, invalid("volume content source must name a snapshot or a volume")
}

func (d *Driver) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	if err := checkVolumeID(req.GetVolumeId()); err != nil {
		return nil, err
	}
	defer d.locks.Lock(req.GetVolumeId())()
	if err := d.cfg.Pool.DeleteVolume(ctx, req.GetVolumeId()); err != nil {
		return nil, toStatus(err)
	}
	return &csi.DeleteVolumeResponse{}, nil
}

// lookup returns the ready volume with id (or inline handle), or NOT_FOUND.
func (d *Driver) lookup(id string) (*store.Volume, error) {
	if err := checkVolumeID(id); err != nil {
		return nil, err
	}
	if !pool.ValidID(id) {
		inl, ok := d.inlineID(id)
		if !ok {
			return nil, status.Errorf(codes.NotFound, "volume %q does not exist on node %s", id, d.cfg.NodeID)
		}
		id = inl
	}
	v, err := d.cfg.Pool.ReadyVolume(id)
	if err != nil {
		return nil, toStatus(fmt.Errorf("node %s: %w", d.cfg.NodeID, err))
	}
	return v, nil
}

func (d *Driver) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	if err := checkVolumeID(req.GetVolumeId()); err != nil {
		return nil, err
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, invalid("volume capabilities are required")
	}
	v, err := d.lookup(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	for _, c := range req.GetVolumeCapabilities() {
		why := checkCapability(c)
		if fs := c.GetMount().GetFsType(); why == "" && fs != "" && fs != v.FsType {
			why = fmt.Sprintf("volume %s is %s, not %s", v.ID, v.FsType, fs)
		}
		if why != "" {
			return &csi.ValidateVolumeCapabilitiesResponse{Message: why}, nil
		}
	}
	if _, err := volumeParameters(req.GetParameters()); err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: status.Convert(err).Message()}, nil
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}

// publishedNodes is this node when the volume is staged here: node-local
// volumes are never published anywhere else.
func (d *Driver) publishedNodes(v *store.Volume) []string {
	if v.Stage != nil || len(v.Publications) > 0 {
		return []string{d.cfg.NodeID}
	}
	return nil
}

// ListVolumes pages through volumes in id order. The token is the id to
// start at: a cursor, not an offset, so a page costs what its volumes cost
// and stays right when volumes are created or deleted between pages (every
// volume that exists through the whole listing is on exactly one page).
func (d *Driver) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	vols, next, err := d.volumePage(req.GetMaxEntries(), req.GetStartingToken())
	if err != nil {
		return nil, err
	}
	resp := &csi.ListVolumesResponse{NextToken: next}
	for _, v := range vols {
		resp.Entries = append(resp.Entries, &csi.ListVolumesResponse_Entry{
			Volume: d.csiVolume(v),
			Status: &csi.ListVolumesResponse_VolumeStatus{PublishedNodeIds: d.publishedNodes(v)},
		})
	}
	return resp, nil
}

// volumePage is one page of the ready volumes, for the listing RPCs.
func (d *Driver) volumePage(maxEntries int32, start string) ([]*store.Volume, string, error) {
	if maxEntries < 0 {
		return nil, "", invalid("max_entries must not be negative")
	}
	// Any id of the right shape is a valid cursor, including one whose
	// volume has gone since the token was issued.
	if start != "" && !pool.ValidID(start) {
		return nil, "", status.Errorf(codes.Aborted, "starting token %q was not issued by this plugin", start)
	}
	vols, next, err := d.cfg.Pool.Store().VolumePage(start, int(maxEntries), func(v *store.Volume) bool { return v.State == store.Ready })
	if err != nil {
		return nil, "", toStatus(fmt.Errorf("list volumes: %w", err))
	}
	return vols, next, nil
}

func (d *Driver) ControllerGetVolume(ctx context.Context, req *csi.ControllerGetVolumeRequest) (*csi.ControllerGetVolumeResponse, error) {
	v, err := d.lookup(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	return &csi.ControllerGetVolumeResponse{
		Volume: d.csiVolume(v),
		Status: &csi.ControllerGetVolumeResponse_VolumeStatus{PublishedNodeIds: d.publishedNodes(v)},
	}, nil
}

// GetCapacity reports what is left of this node's pool; other topology
// segments have nothing here.
func (d *Driver) GetCapacity(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	if t := req.GetAccessibleTopology(); t != nil && t.GetSegments()[names.TopologyKey] != d.cfg.NodeID {
		return &csi.GetCapacityResponse{}, nil
	}
	for _, c := range req.GetVolumeCapabilities() {
		if checkCapability(c) != "" {
			return &csi.GetCapacityResponse{}, nil
		}
	}
	fs := "ext4"
	if len(req.GetVolumeCapabilities()) > 0 || req.GetParameters() != nil {
		if params, err := volumeParameters(req.GetParameters()); err == nil {
			if f, err := fsTypeFor(req.GetVolumeCapabilities(), params); err == nil {
				fs = f
			}
		}
	}
	total, allocated := d.cfg.Pool.Capacity()
	free := max(total-allocated, 0)
	return &csi.GetCapacityResponse{
		AvailableCapacity: free,
		MaximumVolumeSize: wrapperspb.Int64(free),
		MinimumVolumeSize: wrapperspb.Int64(size.MinSize(fs)),
	}, nil
}
