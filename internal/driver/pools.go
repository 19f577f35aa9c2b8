package driver

import (
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/podvol/podvol/internal/pool"
)

// servedPools names the pools this node serves, for messages.
func (d *Driver) servedPools() string { return strings.Join(d.names, ", ") }

// poolNamed is the pool a StorageClass's pool parameter (or an inline
// volume's attribute) names; "" is the default pool.
func (d *Driver) poolNamed(name string) (*Pool, bool) {
	if name == "" {
		name = pool.DefaultName
	}
	p, ok := d.pools[name]
	return p, ok
}

// missingPool says that this node has no pool name.
func (d *Driver) missingPool(code codes.Code, name string) error {
	if name == "" {
		name = pool.DefaultName
	}
	return status.Errorf(code, "node %s has no pool %q (it has %s)", d.cfg.NodeID, name, d.servedPools())
}

// poolOf is the pool that made id (a volume, snapshot or group id), if
// this node serves it. An id of a pool this node does not serve names
// nothing here: NOT_FOUND, with the pool named.
func (d *Driver) poolOf(id string) (*Pool, error) {
	name, ok := pool.PoolOf(id)
	if !ok {
		return nil, status.Errorf(codes.NotFound, "%q does not exist on node %s", id, d.cfg.NodeID)
	}
	p, ok := d.pools[name]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "%q is of pool %q, which node %s does not serve (it serves %s)", id, name, d.cfg.NodeID, d.servedPools())
	}
	return p, nil
}

// eachPool runs f on every pool in name order, stopping at the first error.
func (d *Driver) eachPool(f func(*Pool) error) error {
	for _, n := range d.names {
		if err := f(d.pools[n]); err != nil {
			return err
		}
	}
	return nil
}

// poolToDelete is the pool holding an id (of the shape valid accepts) to
// delete; nil, with no error, for an id podvol never hands out, which
// names nothing to delete. An id of a pool this node does not serve may
// still have its image in that pool's directory: reporting it deleted
// would drop its Kubernetes object and keep the image for ever, so it is
// FAILED_PRECONDITION, to be retried once the pool is served again.
func (d *Driver) poolToDelete(id string, valid func(string) bool) (*Pool, error) {
	if !valid(id) {
		return nil, nil
	}
	pl, err := d.poolOf(id)
	if err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "%s: serve the pool again (--pool) to delete it", status.Convert(err).Message())
	}
	return pl, nil
}

// holds reports whether volume id is in one of this node's pools, in any
// state: one that is not is another node's, or nowhere.
func (d *Driver) holds(id string) bool {
	pl, err := d.poolOf(id)
	if err != nil {
		return false
	}
	return pl.Pool.Holds(id)
}
