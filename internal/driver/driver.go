// Package driver is podvol's gRPC edge: it validates every CSI request,
// translates it into calls on the pool and node packages, and maps their
// errors to the status codes the CSI spec prescribes. Nothing below this
// package knows about gRPC.
package driver

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/podvol/podvol/internal/directvolume"
	"github.com/podvol/podvol/internal/errkind"
	"github.com/podvol/podvol/internal/inline"
	"github.com/podvol/podvol/internal/keylock"
	"github.com/podvol/podvol/internal/names"
	"github.com/podvol/podvol/internal/node"
	"github.com/podvol/podvol/internal/pool"
	"github.com/podvol/podvol/internal/store"
)

// Config is what the CSI services need.
type Config struct {
	Version    string
	NodeID     string
	MaxVolumes int64
	// Pools are the pools this node serves, each under its own name
	// (pool.Pool.Name). A request finds its pool from a volume's or
	// snapshot's id, or from the pool parameter of a new one.
	Pools []Pool
	// Locks are the per-volume locks the CSI calls take, shared with
	// the background work on the same volumes (inline collection); nil
	// makes the driver its own.
	Locks *keylock.Locks
	// InlineDefaultSize is the size of an inline volume that names none.
	InlineDefaultSize int64
	// InlinePools are the pools an inline volume may name (nil: the
	// default pool only): a pod's inline volume passes no StorageClass,
	// quota or scheduler on its way to a pool.
	InlinePools []string
	// Decider answers directAssign=auto; nil when the plugin has no API
	// access.
	Decider *directvolume.Decider
	// GroupFreezeTimeout bounds the freeze of a group snapshot's
	// members, all together; 0 is DefaultGroupFreezeTimeout.
	GroupFreezeTimeout time.Duration
	// Importer pulls the data of volumes made from another node's
	// snapshot or volume; nil: such a restore or clone is NOT_FOUND, as
	// without transfers.
	Importer Importer
}

// Importer pulls Importing volumes' data from their source nodes
// (internal/mobility), in the background: CreateVolume answers ABORTED
// with its progress until the volume is Ready.
type Importer interface {
	// Ensure runs the pull of v, an Importing volume of p, unless it runs,
	// and says how far it has got.
	Ensure(p *pool.Pool, v *store.Volume) string
	// Failed returns, once, why the last pull for the volume named name
	// was given up (its volume is gone); nil if none was.
	Failed(name string) error
	// VolumeNode returns the node that holds volume id, which the claim
	// imp names clones (its data source's PV): an error wrapping
	// errkind.ErrNotFound if the claim clones no such volume.
	VolumeNode(ctx context.Context, imp *store.Import, id string) (string, error)
}

// Driver implements the Identity, Controller and Node services.
type Driver struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer
	csi.UnimplementedNodeServer
	csi.UnimplementedGroupControllerServer

	cfg   Config
	locks *keylock.Locks
	pools map[string]*Pool
	// names of the pools, sorted: the order listings page through them.
	names []string
}

// Pool is one named pool and what serves its volumes on this node.
type Pool struct {
	Pool *pool.Pool
	Node *node.Node
	// Inline makes the pool's inline ephemeral volumes; nil: none.
	Inline *inline.Manager
}

// New returns a Driver. The pools must have distinct names.
func New(cfg Config) *Driver {
	locks := cfg.Locks
	if locks == nil {
		locks = &keylock.Locks{}
	}
	d := &Driver{cfg: cfg, locks: locks, pools: map[string]*Pool{}}
	for i := range cfg.Pools {
		p := &cfg.Pools[i]
		d.pools[p.Pool.Name()] = p
		d.names = append(d.names, p.Pool.Name())
	}
	slices.Sort(d.names)
	return d
}

func (d *Driver) topology() *csi.Topology {
	return &csi.Topology{Segments: map[string]string{names.TopologyKey: d.cfg.NodeID}}
}

// toStatus maps an error from the layers below to a CSI status code.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	code := codes.Internal
	switch {
	case errors.Is(err, errkind.ErrNotFound):
		code = codes.NotFound
	case errors.Is(err, errkind.ErrConflict):
		code = codes.AlreadyExists
	case errors.Is(err, errkind.ErrNoSpace):
		code = codes.ResourceExhausted
	case errors.Is(err, errkind.ErrInUse), errors.Is(err, errkind.ErrNotStaged), errors.Is(err, errkind.ErrUnusable), errors.Is(err, errkind.ErrElsewhere),
		errors.Is(err, errkind.ErrNoFilesystem):
		code = codes.FailedPrecondition
	case errors.Is(err, errkind.ErrOutOfRange):
		code = codes.OutOfRange
	case errors.Is(err, errkind.ErrInvalid):
		code = codes.InvalidArgument
	case errors.Is(err, errkind.ErrDenied):
		code = codes.PermissionDenied
	}
	return status.Error(code, err.Error())
}
