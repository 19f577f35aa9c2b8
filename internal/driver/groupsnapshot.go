package driver

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/podvol/podvol/internal/errkind"
	"github.com/podvol/podvol/internal/pool"
	"github.com/podvol/podvol/internal/snaphandle"
	"github.com/podvol/podvol/internal/store"
)

// DefaultGroupFreezeTimeout bounds how long the members of a group snapshot
// may take to freeze, all of them together: past it nothing stays frozen
// and the call fails (DEADLINE_EXCEEDED) for the sidecar to retry. A freeze
// waits for the writes in flight; a pod's writers hang for as long.
const DefaultGroupFreezeTimeout = 10 * time.Second

func (d *Driver) GroupControllerGetCapabilities(context.Context, *csi.GroupControllerGetCapabilitiesRequest) (*csi.GroupControllerGetCapabilitiesResponse, error) {
	return &csi.GroupControllerGetCapabilitiesResponse{Capabilities: []*csi.GroupControllerServiceCapability{{
		Type: &csi.GroupControllerServiceCapability_Rpc{Rpc: &csi.GroupControllerServiceCapability_RPC{
			Type: csi.GroupControllerServiceCapability_RPC_CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT,
		}},
	}}}, nil
}

// groupID is the pool's id of a group snapshot handle; like snapshotID, a
// handle naming another node is NOT_FOUND here.
func (d *Driver) groupID(handle string) (string, error) {
	id, node := snaphandle.Parse(handle)
	if node != "" && node != d.cfg.NodeID {
		return "", status.Errorf(codes.NotFound, "group snapshot %q lives on node %s, not on this node (%s)", handle, node, d.cfg.NodeID)
	}
	return id, nil
}

func (d *Driver) csiGroup(g *store.Group, snaps []*store.Snapshot) *csi.VolumeGroupSnapshot {
	out := &csi.VolumeGroupSnapshot{
		GroupSnapshotId: snaphandle.Format(g.ID, d.cfg.NodeID),
		CreationTime:    timestamppb.New(g.Created),
		ReadyToUse:      g.State == store.Ready,
	}
	for _, s := range snaps {
		out.Snapshots = append(out.Snapshots, d.csiSnapshot(s))
	}
	return out
}

// groupDeletionPolicy is the one parameter a group snapshot tolerates
// (with a valid value) besides the sidecar's.
const groupDeletionPolicy = "deletionPolicy"

// CreateVolumeGroupSnapshot cuts a snapshot of every volume at one instant
// (pool.CreateGroupSnapshot, node.QuiesceGroup). All volumes must be in
// this node's pool.
func (d *Driver) CreateVolumeGroupSnapshot(ctx context.Context, req *csi.CreateVolumeGroupSnapshotRequest) (*csi.CreateVolumeGroupSnapshotResponse, error) {
	if req.GetName() == "" {
		return nil, invalid("group snapshot name is required")
	}
	if len(req.GetName()) > pool.MaxNameLength {
		return nil, invalid("group snapshot name is %d bytes long, at most %d are allowed", len(req.GetName()), pool.MaxNameLength)
	}
	ids := req.GetSourceVolumeIds()
	if len(ids) == 0 {
		return nil, invalid("source volume ids are required")
	}
	seen := map[string]bool{}
	for _, id := range ids {
		if err := checkVolumeID(id); err != nil {
			return nil, invalid("source volume id: %s", status.Convert(err).Message())
		}
		if seen[id] {
			return nil, invalid("source volume %s is named twice", id)
		}
		seen[id] = true
	}
	for k, v := range req.GetParameters() {
		// Kubernetes' e2e suite writes a VolumeGroupSnapshotClass's
		// deletion policy into its parameters as well as its field; the
		// policy is the CO's business, so it is only checked for sense.
		if k == groupDeletionPolicy && (v == "Delete" || v == "Retain") {
			continue
		}
		if !strings.HasPrefix(k, sidecarPrefix) {
			return nil, invalid("group snapshots take no parameters besides %s* keys and %s (got %s=%q)", sidecarPrefix, groupDeletionPolicy, k, v)
		}
	}
	defer d.locks.Lock("groupsnapshot/" + req.GetName())()
	// Every member's lock, in id order: two groups sharing volumes, or a
	// group and a single snapshot, take them in one order.
	for _, id := range slices.Sorted(slices.Values(ids)) {
		defer d.locks.Lock(id)()
	}
	pl, err := d.groupPool(ids)
	if err != nil {
		return nil, err
	}
	if err := nameTaken(d, pl, req.GetName(), (*store.Store).GroupByName); err != nil {
		return nil, err
	}
	timeout := d.cfg.GroupFreezeTimeout
	if timeout <= 0 {
		timeout = DefaultGroupFreezeTimeout
	}
	g, snaps, err := pl.Pool.CreateGroupSnapshot(pool.GroupRequest{
		Name:      req.GetName(),
		SourceIDs: ids,
		Freeze: func(ids []string) (func(), error) {
			return pl.Node.QuiesceGroup(ids, timeout)
		},
	})
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			// The group's freeze deadline: nothing was cut, retry.
			return nil, status.Error(codes.DeadlineExceeded, err.Error())
		}
		if errors.Is(err, errkind.ErrElsewhere) {
			return nil, status.Errorf(codes.FailedPrecondition, "%s (this node is %s; the node of each other volume is in its PersistentVolume's node affinity)", err, d.cfg.NodeID)
		}
		return nil, toStatus(err)
	}
	return &csi.CreateVolumeGroupSnapshotResponse{GroupSnapshot: d.csiGroup(g, snaps)}, nil
}

// groupPool is the one pool of a group's members. A group is cut by
// reflinks within one filesystem, so members in two pools are refused,
// naming them. Ids that name no pool are left to the pool, which knows
// no such volume (FAILED_PRECONDITION: it is elsewhere).
func (d *Driver) groupPool(ids []string) (*Pool, error) {
	var in []string // "id (pool)" of each member, for the message
	name := ""
	for _, id := range ids {
		n, ok := pool.PoolOf(id)
		if !ok {
			continue
		}
		in = append(in, fmt.Sprintf("%s (%s)", id, n))
		if name == "" {
			name = n
		} else if n != name {
			return nil, invalid("the members of a group snapshot must be in one pool: %s", strings.Join(in, ", "))
		}
	}
	if name == "" {
		name = d.names[0]
	}
	pl, ok := d.pools[name]
	if !ok {
		return nil, d.missingPool(codes.FailedPrecondition, name)
	}
	return pl, nil
}

// checkMembers compares the snapshot ids a CO passes with the group's
// members: the spec asks a plugin that can tell a mismatch to report it.
// An empty list is not checked (csi-sanity sends none).
func (d *Driver) checkMembers(g *store.Group, handles []string) error {
	if len(handles) == 0 {
		return nil
	}
	ids := make([]string, len(handles))
	for i, h := range handles {
		id, err := d.snapshotID(h)
		if err != nil {
			return invalid("snapshot %q is not a member of group snapshot %s: %s", h, g.ID, status.Convert(err).Message())
		}
		ids[i] = id
	}
	if !pool.SameSnapshotSet(g, ids) {
		have := make([]string, len(g.Members))
		for i, m := range g.Members {
			have[i] = d.snapshotHandle(m.SnapshotID)
		}
		return invalid("snapshot ids %s are not the members of group snapshot %s (%s)", strings.Join(handles, ", "), g.ID, strings.Join(have, ", "))
	}
	return nil
}

func (d *Driver) GetVolumeGroupSnapshot(ctx context.Context, req *csi.GetVolumeGroupSnapshotRequest) (*csi.GetVolumeGroupSnapshotResponse, error) {
	if err := checkVolumeID(req.GetGroupSnapshotId()); err != nil {
		return nil, invalid("group snapshot id is required and must be well-formed")
	}
	id, err := d.groupID(req.GetGroupSnapshotId())
	if err != nil {
		return nil, err
	}
	pl, err := d.poolOf(id)
	if err != nil {
		return nil, err
	}
	g, snaps, err := pl.Pool.ReadyGroup(id)
	if err != nil {
		return nil, toStatus(err)
	}
	if err := d.checkMembers(g, req.GetSnapshotIds()); err != nil {
		return nil, err
	}
	return &csi.GetVolumeGroupSnapshotResponse{GroupSnapshot: d.csiGroup(g, snaps)}, nil
}

// DeleteVolumeGroupSnapshot deletes the group and its member snapshots.
func (d *Driver) DeleteVolumeGroupSnapshot(ctx context.Context, req *csi.DeleteVolumeGroupSnapshotRequest) (*csi.DeleteVolumeGroupSnapshotResponse, error) {
	if err := checkVolumeID(req.GetGroupSnapshotId()); err != nil {
		return nil, invalid("group snapshot id is required and must be well-formed")
	}
	id, err := d.groupID(req.GetGroupSnapshotId())
	if err != nil {
		// Not "deleted": the group is still on its node.
		return nil, status.Errorf(codes.FailedPrecondition, "%s: delete it through that node's plugin", status.Convert(err).Message())
	}
	pl, err := d.poolToDelete(id, pool.ValidGroupID)
	if pl == nil {
		return &csi.DeleteVolumeGroupSnapshotResponse{}, err
	}
	defer d.locks.Lock(id)()
	if g, _, err := pl.Pool.ReadyGroup(id); err == nil {
		if err := d.checkMembers(g, req.GetSnapshotIds()); err != nil {
			return nil, err
		}
	}
	if err := pl.Pool.DeleteGroupSnapshot(id); err != nil {
		return nil, toStatus(err)
	}
	return &csi.DeleteVolumeGroupSnapshotResponse{}, nil
}
