package driver

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/google/uuid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/podvol/podvol/internal/names"
	"github.com/podvol/podvol/internal/pool"
	"github.com/podvol/podvol/internal/size"
	"github.com/podvol/podvol/internal/snaphandle"
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
	// A node without the class's pool is no place for the volume:
	// RESOURCE_EXHAUSTED gives the claim back to the scheduler, which
	// sees capacity 0 for the class on this node.
	pl, ok := d.poolNamed(params[names.ParamPool])
	if !ok {
		return nil, d.missingPool(codes.ResourceExhausted, params[names.ParamPool])
	}
	var imp *store.Import
	if source != nil && source.Kind == store.FromVolume && d.cfg.Importer != nil && !d.holds(source.ID) {
		// A clone of a volume this node does not hold: the API server
		// tells which node does (the source claim's PV), for the claim
		// the provisioner names. Its id goes into a record and a URL:
		// only the shape podvol makes.
		if !pool.ValidID(source.ID) {
			return nil, invalid("source volume %q is not a podvol volume id (want pv-[<pool>-]<24 hex digits>)", source.ID)
		}
		if imp, err = importFor(name, req.GetParameters()); err != nil {
			return nil, err
		}
		node, err := d.cfg.Importer.VolumeNode(ctx, imp, source.ID)
		if err != nil {
			return nil, toStatus(err)
		}
		if node != d.cfg.NodeID {
			source.Node = node
		}
	}
	if source != nil && source.Node != "" {
		// Pulled from another node, for the claim the provisioner names.
		if imp == nil {
			if imp, err = importFor(name, req.GetParameters()); err != nil {
				return nil, err
			}
		}
		if err := d.cfg.Importer.Failed(name); err != nil {
			return nil, toStatus(err)
		}
	} else if source != nil {
		// A copy is a reflink (or a sparse copy) within one filesystem.
		// A source id of no pool is the pool's to report (NOT_FOUND).
		if from, ok := pool.PoolOf(source.ID); ok && from != pl.Pool.Name() {
			return nil, invalid("source %s is in pool %q, the new volume's class asks for pool %q: a clone or restore stays in its source's pool", source.ID, from, pl.Pool.Name())
		}
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
	if err := nameTaken(d, pl, name, (*store.Store).VolumeByName); err != nil {
		return nil, err
	}
	ns, err := claimNamespace(req.GetParameters())
	if err != nil {
		return nil, err
	}
	v, err := pl.Pool.CreateVolume(ctx, pool.CreateRequest{Name: name, SizeBytes: size, FsType: fsType, Parameters: params, Namespace: ns,
		Source: source, Format: format, Quiesce: pl.Node.Quiesce, Import: imp})
	if err != nil {
		return nil, toStatus(err)
	}
	if v.State == store.Importing {
		// The provisioner retries ABORTED (an operation in progress) and
		// records each answer on the claim: the progress shows there.
		return nil, status.Error(codes.Aborted, d.cfg.Importer.Ensure(pl.Pool, v))
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
	case src.Kind == store.FromSnapshot && src.Node != "":
		cv.ContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snaphandle.Format(src.ID, src.Node)}}}
	case src.Kind == store.FromSnapshot:
		cv.ContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: d.snapshotHandle(src.ID)}}}
	case src.Kind == store.FromVolume:
		// The id alone, as it was asked for: a volume's id names no
		// node.
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
		return d.snapshotSource(cs.GetSnapshot().GetSnapshotId())
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
	pl, err := d.poolToDelete(req.GetVolumeId(), pool.ValidID)
	if pl == nil {
		return &csi.DeleteVolumeResponse{}, err
	}
	defer d.locks.Lock(req.GetVolumeId())()
	if err := pl.Pool.DeleteVolume(ctx, req.GetVolumeId()); err != nil {
		return nil, toStatus(err)
	}
	return &csi.DeleteVolumeResponse{}, nil
}

// lookup returns the ready volume with id (or inline handle) and its
// pool, or NOT_FOUND.
func (d *Driver) lookup(id string) (*Pool, *store.Volume, error) {
	if err := checkVolumeID(id); err != nil {
		return nil, nil, err
	}
	pl, poolID, err := d.volumePool(id)
	if err != nil {
		return nil, nil, err
	}
	v, err := pl.Pool.ReadyVolume(poolID)
	if err != nil {
		return nil, nil, toStatus(fmt.Errorf("node %s: %w", d.cfg.NodeID, err))
	}
	return pl, v, nil
}

// volumePool is the pool of a request's volume id and the pool's id of
// the volume, which differs for an inline volume (kubelet names it).
func (d *Driver) volumePool(id string) (*Pool, string, error) {
	if pool.ValidID(id) {
		pl, err := d.poolOf(id)
		return pl, id, err
	}
	if pl, inl, ok := d.inlineID(id); ok {
		return pl, inl, nil
	}
	return nil, "", status.Errorf(codes.NotFound, "volume %q does not exist on node %s", id, d.cfg.NodeID)
}

// nameTaken refuses a CSI name that another pool of this node already
// holds (found by byName in its store): the spec's ALREADY_EXISTS for a
// name asked for again with other parameters. Names are unique per
// store; the driver's name lock makes them unique per node.
func nameTaken[T any](d *Driver, in *Pool, name string, byName func(*store.Store, string) (T, error)) error {
	return d.eachPool(func(p *Pool) error {
		if p == in {
			return nil
		}
		_, err := byName(p.Pool.Store(), name)
		switch {
		case err == nil:
			return status.Errorf(codes.AlreadyExists, "%q already exists in pool %q of node %s, not in pool %q", name, p.Pool.Name(), d.cfg.NodeID, in.Pool.Name())
		case errors.Is(err, store.ErrNotFound):
			return nil
		}
		return toStatus(err)
	})
}

func (d *Driver) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	if err := checkVolumeID(req.GetVolumeId()); err != nil {
		return nil, err
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, invalid("volume capabilities are required")
	}
	_, v, err := d.lookup(req.GetVolumeId())
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
	return pagePools(d, d.names, start, int(maxEntries), "volumes", (*store.Store).VolumePage,
		func(v *store.Volume) bool { return v.State == store.Ready }, func(v *store.Volume) string { return v.ID })
}

// pagePools is one page of a listing through the pools of names (sorted):
// the pools in name order, each in id order. The cursor is an id, which names its
// pool, so a page starts in the right pool and no pool is read twice.
func pagePools[T any](d *Driver, names []string, start string, limit int, what string,
	page func(s *store.Store, start string, limit int, keep func(T) bool) ([]T, string, error), keep func(T) bool, idOf func(T) string,
) ([]T, string, error) {
	from := 0
	if start != "" {
		name, _ := pool.PoolOf(start)
		i, found := slices.BinarySearch(names, name)
		if !found {
			return nil, "", status.Errorf(codes.Aborted, "starting token %q is of pool %q, which this listing does not read (node %s serves %s)", start, name, d.cfg.NodeID, d.servedPools())
		}
		from = i
	}
	var out []T
	for i := from; i < len(names); i++ {
		left := 0 // no limit
		if limit > 0 {
			left = limit - len(out)
		}
		s := d.pools[names[i]].Pool.Store()
		items, next, err := page(s, start, left, keep)
		if err != nil {
			return nil, "", toStatus(fmt.Errorf("list %s of pool %s: %w", what, names[i], err))
		}
		out = append(out, items...)
		if next != "" {
			return out, next, nil
		}
		start = ""
		if limit > 0 && len(out) == limit {
			// The page is full: the next starts at the first item of
			// a later pool, if any has one.
			for j := i + 1; j < len(names); j++ {
				first, _, err := page(d.pools[names[j]].Pool.Store(), "", 1, keep)
				if err != nil {
					return nil, "", toStatus(fmt.Errorf("list %s of pool %s: %w", what, names[j], err))
				}
				if len(first) > 0 {
					return out, idOf(first[0]), nil
				}
			}
			return out, "", nil
		}
	}
	return out, "", nil
}

func (d *Driver) ControllerGetVolume(ctx context.Context, req *csi.ControllerGetVolumeRequest) (*csi.ControllerGetVolumeResponse, error) {
	_, v, err := d.lookup(req.GetVolumeId())
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
	// The class's pool: a node without it has no room for the class,
	// so the scheduler never picks it.
	pl, ok := d.poolNamed(req.GetParameters()[names.ParamPool])
	if !ok {
		return &csi.GetCapacityResponse{MaximumVolumeSize: wrapperspb.Int64(0)}, nil
	}
	total, allocated := pl.Pool.Capacity()
	free := max(total-allocated, 0)
	return &csi.GetCapacityResponse{
		AvailableCapacity: free,
		MaximumVolumeSize: wrapperspb.Int64(free),
		MinimumVolumeSize: wrapperspb.Int64(size.MinSize(fs)),
	}, nil
}

// Parameters external-provisioner adds with --extra-create-metadata.
const (
	pvcNameParam      = "csi.storage.k8s.io/pvc/name"
	pvcNamespaceParam = "csi.storage.k8s.io/pvc/namespace"
)

// claimNamespace is the namespace of the claim a volume is for, as the
// provisioner names it (--extra-create-metadata), "" if it names none. It
// is recorded with the volume and its snapshots: the snapshots' data is
// that namespace's, and only its claims may pull them from another node.
func claimNamespace(params map[string]string) (string, error) {
	ns := params[pvcNamespaceParam]
	if ns != "" && len(validation.IsDNS1123Label(ns)) > 0 {
		return "", invalid("parameter %s=%q is not a namespace name", pvcNamespaceParam, ns)
	}
	return ns, nil
}

// importFor names the claim a pulled volume is for, which the source node
// checks before it serves anything: its namespace and name from the
// provisioner's metadata, its UID from the volume's name, which
// external-provisioner makes "pvc-<claim UID>".
func importFor(name string, params map[string]string) (*store.Import, error) {
	ns, claim := params[pvcNamespaceParam], params[pvcNameParam]
	uid, ok := strings.CutPrefix(name, "pvc-")
	if ns == "" || claim == "" || !ok || uuid.Validate(uid) != nil {
		return nil, status.Errorf(codes.FailedPrecondition,
			"volume %q is made from another node's snapshot or volume, which is pulled for a claim the source node checks: the provisioner must name the volume pvc-<claim UID> and pass %s and %s (external-provisioner's defaults with --extra-create-metadata)",
			name, pvcNamespaceParam, pvcNameParam)
	}
	return &store.Import{ClaimNamespace: ns, ClaimName: claim, ClaimUID: uid}, nil
}
