package driver

import (
	"context"
	"errors"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/podvol/podvol/internal/errkind"
	"github.com/podvol/podvol/internal/names"
	"github.com/podvol/podvol/internal/pool"
	"github.com/podvol/podvol/internal/snaphandle"
	"github.com/podvol/podvol/internal/store"
)

// snapshotHandle is the CSI id of a snapshot of this node's pool: it names
// the node (see package snaphandle).
func (d *Driver) snapshotHandle(id string) string { return snaphandle.Format(id, d.cfg.NodeID) }

// snapshotID is the pool's id of a snapshot handle, which may name no node
// (handles made before podvol named nodes). A handle naming another node
// is NOT_FOUND here: that node's pool has it.
func (d *Driver) snapshotID(handle string) (string, error) {
	id, node := snaphandle.Parse(handle)
	if node != "" && node != d.cfg.NodeID {
		return "", status.Errorf(codes.NotFound, "snapshot %q lives on node %s, not on this node (%s)", handle, node, d.cfg.NodeID)
	}
	return id, nil
}

// snapshotSource is a restore's source: a snapshot of this node's pools,
// or, with transfers on, of another node's, whose data is pulled.
func (d *Driver) snapshotSource(handle string) (*store.Source, error) {
	if id, node := snaphandle.Parse(handle); d.cfg.Importer != nil && node != "" && node != d.cfg.NodeID {
		// Both go into a record, an API lookup, a certificate check and a
		// URL: only the shapes podvol makes.
		if !pool.ValidSnapshotID(id) || len(validation.IsDNS1123Subdomain(node)) > 0 {
			return nil, invalid("snapshot handle %q names no podvol snapshot of a node (want snap-<id>@<node name>)", handle)
		}
		return &store.Source{Kind: store.FromSnapshot, ID: id, Node: node}, nil
	}
	id, err := d.snapshotID(handle)
	if err != nil {
		return nil, err
	}
	return &store.Source{Kind: store.FromSnapshot, ID: id}, nil
}

func (d *Driver) csiSnapshot(s *store.Snapshot) *csi.Snapshot {
	out := &csi.Snapshot{
		SnapshotId:     d.snapshotHandle(s.ID),
		SourceVolumeId: s.SourceID,
		SizeBytes:      s.SizeBytes,
		CreationTime:   timestamppb.New(s.Created),
		ReadyToUse:     s.State == store.Ready,
	}
	if s.GroupID != "" {
		// The spec: a member names its group.
		out.GroupSnapshotId = snaphandle.Format(s.GroupID, d.cfg.NodeID)
	}
	return out
}

// CreateSnapshot copies the volume as it is now; a mounted filesystem is
// frozen for the copy so that the snapshot is consistent.
func (d *Driver) CreateSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	if req.GetName() == "" {
		return nil, invalid("snapshot name is required")
	}
	if len(req.GetName()) > pool.MaxNameLength {
		return nil, invalid("snapshot name is %d bytes long, at most %d are allowed", len(req.GetName()), pool.MaxNameLength)
	}
	if err := checkVolumeID(req.GetSourceVolumeId()); err != nil {
		return nil, invalid("source volume id: %s", status.Convert(err).Message())
	}
	if len(req.GetParameters()) > 0 {
		if _, err := volumeParameters(req.GetParameters()); err != nil || req.GetParameters()[names.ParamFsType] != "" {
			return nil, invalid("snapshots take no parameters besides %s* keys", sidecarPrefix)
		}
	}
	if !d.topologyAllows(req.GetAccessibilityRequirements()) {
		return nil, status.Errorf(codes.ResourceExhausted, "the requisite topology does not include this node (%s=%s): a snapshot lives beside its volume", names.TopologyKey, d.cfg.NodeID)
	}
	// A snapshot is cut in its volume's pool. A source this node does
	// not have is the pool's to report (FAILED_PRECONDITION, elsewhere).
	pl := d.pools[d.names[0]]
	if pool.ValidID(req.GetSourceVolumeId()) {
		var err error
		if pl, err = d.poolOf(req.GetSourceVolumeId()); err != nil {
			return nil, status.Errorf(codes.FailedPrecondition, "source volume %s", status.Convert(err).Message())
		}
	}
	defer d.locks.Lock("snapshot/" + req.GetName())()
	defer d.locks.Lock(req.GetSourceVolumeId())()
	if err := nameTaken(d, pl, req.GetName(), (*store.Store).SnapshotByName); err != nil {
		return nil, err
	}
	s, err := pl.Pool.CreateSnapshot(pool.SnapshotRequest{Name: req.GetName(), SourceID: req.GetSourceVolumeId(), Quiesce: pl.Node.Quiesce})
	if err != nil {
		return nil, toStatus(err)
	}
	return &csi.CreateSnapshotResponse{Snapshot: d.csiSnapshot(s)}, nil
}

func (d *Driver) DeleteSnapshot(ctx context.Context, req *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error) {
	if err := checkVolumeID(req.GetSnapshotId()); err != nil {
		return nil, invalid("snapshot id is required and must be well-formed")
	}
	id, err := d.snapshotID(req.GetSnapshotId())
	if err != nil {
		// Not "deleted": the snapshot is still on its node, and the
		// call reached the wrong one.
		return nil, status.Errorf(codes.FailedPrecondition, "%s: delete it through that node's plugin (label its VolumeSnapshotContent snapshot.storage.kubernetes.io/managed-by=<node>)", status.Convert(err).Message())
	}
	pl, err := d.poolToDelete(id, pool.ValidSnapshotID)
	if pl == nil {
		return &csi.DeleteSnapshotResponse{}, err
	}
	defer d.locks.Lock(id)()
	if _, node := snaphandle.Parse(req.GetSnapshotId()); node == "" {
		// A handle that names no node may be any node's: reporting a
		// snapshot this node never held as deleted would drop its
		// VolumeSnapshotContent and leave its image on its node for
		// ever. Refused instead (FAILED_PRECONDITION), csi-snapshotter
		// keeps the content and retries, and its events say where to
		// send it.
		if err := pl.Pool.DeleteHeldSnapshot(id); err != nil {
			if errors.Is(err, errkind.ErrElsewhere) {
				return nil, status.Errorf(codes.FailedPrecondition, "snapshot %q names no node, and this node (%s) never held it: it is on another node. Label its VolumeSnapshotContent snapshot.storage.kubernetes.io/managed-by=<that node> so that that node's csi-snapshotter deletes it", req.GetSnapshotId(), d.cfg.NodeID)
			}
			return nil, toStatus(err)
		}
		return &csi.DeleteSnapshotResponse{}, nil
	}
	if err := pl.Pool.DeleteSnapshot(id); err != nil {
		return nil, toStatus(err)
	}
	return &csi.DeleteSnapshotResponse{}, nil
}

func (d *Driver) GetSnapshot(ctx context.Context, req *csi.GetSnapshotRequest) (*csi.GetSnapshotResponse, error) {
	if err := checkVolumeID(req.GetSnapshotId()); err != nil {
		return nil, invalid("snapshot id is required and must be well-formed")
	}
	id, err := d.snapshotID(req.GetSnapshotId())
	if err != nil {
		return nil, err
	}
	pl, err := d.poolOf(id)
	if err != nil {
		return nil, err
	}
	s, err := pl.Pool.ReadySnapshot(id)
	if err != nil {
		return nil, toStatus(err)
	}
	return &csi.GetSnapshotResponse{Snapshot: d.csiSnapshot(s)}, nil
}

// ListSnapshots pages through snapshots in id order, like ListVolumes.
func (d *Driver) ListSnapshots(ctx context.Context, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	if req.GetMaxEntries() < 0 {
		return nil, invalid("max_entries must not be negative")
	}
	start := req.GetStartingToken()
	if start != "" && !pool.ValidSnapshotID(start) {
		return nil, status.Errorf(codes.Aborted, "starting token %q was not issued by this plugin", start)
	}
	resp := &csi.ListSnapshotsResponse{}
	if h := req.GetSnapshotId(); h != "" {
		id, err := d.snapshotID(h)
		if err != nil {
			return resp, nil
		}
		pl, err := d.poolOf(id)
		if err != nil {
			return resp, nil
		}
		s, err := pl.Pool.ReadySnapshot(id)
		if errors.Is(err, errkind.ErrNotFound) {
			return resp, nil
		}
		if err != nil {
			return nil, toStatus(err)
		}
		if src := req.GetSourceVolumeId(); s.For == nil && (src == "" || src == s.SourceID) {
			resp.Entries = append(resp.Entries, &csi.ListSnapshotsResponse_Entry{Snapshot: d.csiSnapshot(s)})
		}
		return resp, nil
	}
	// A cursor like ListVolumes'. Filtered by source volume, a page still
	// reads the other volumes' snapshots between its own.
	// Snapshots of one volume are in its pool alone.
	names := d.names
	if p, ok := pool.PoolOf(req.GetSourceVolumeId()); ok {
		if _, served := d.pools[p]; !served {
			return resp, nil
		}
		names = []string{p}
	}
	snaps, next, err := pagePools(d, names, start, int(req.GetMaxEntries()), "snapshots", (*store.Store).SnapshotPage, func(s *store.Snapshot) bool {
		// A snapshot cut for a clone on another node is no CO's.
		return s.State == store.Ready && s.For == nil && (req.GetSourceVolumeId() == "" || s.SourceID == req.GetSourceVolumeId())
	}, func(s *store.Snapshot) string { return s.ID })
	if err != nil {
		return nil, err
	}
	resp.NextToken = next
	for _, s := range snaps {
		resp.Entries = append(resp.Entries, &csi.ListSnapshotsResponse_Entry{Snapshot: d.csiSnapshot(s)})
	}
	return resp, nil
}
