package main

import (
	"errors"
	"fmt"
	"math/big"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/klog/v2"

	"github.com/podvol/podvol/internal/pool"
)

// poolSpec is one pool of the command line.
type poolSpec struct {
	name, dir string
	capacity  int64 // 0: what the filesystem holding dir can give (pool.Room)
	// nodeLabels the node must have for the pool to be served on it;
	// none: every node.
	nodeLabels map[string]string
}

// poolFlags collects the repeatable --pool.
type poolFlags []string

func (f *poolFlags) String() string     { return strings.Join(*f, " ") }
func (f *poolFlags) Set(v string) error { *f = append(*f, v); return nil }

const poolSyntax = "NAME=DIR[,capacity=SIZE][,node-label=KEY=VALUE]..."

// parsePool reads NAME=DIR[,capacity=SIZE][,node-label=KEY=VALUE]...
func parsePool(v string) (poolSpec, error) {
	name, rest, ok := strings.Cut(v, "=")
	if !ok {
		return poolSpec{}, fmt.Errorf("--pool %q: want %s", v, poolSyntax)
	}
	if !pool.ValidName(name) {
		return poolSpec{}, fmt.Errorf("--pool %q: the name %q must be 1 to 16 lower-case letters and digits (it appears in volume ids and metric labels)", v, name)
	}
	parts := strings.Split(rest, ",")
	s := poolSpec{name: name, dir: parts[0]}
	if !filepath.IsAbs(s.dir) {
		return poolSpec{}, fmt.Errorf("--pool %q: the directory %q must be an absolute path", v, s.dir)
	}
	for _, o := range parts[1:] {
		switch k, val, _ := strings.Cut(o, "="); k {
		case "capacity":
			var err error
			if s.capacity, err = quantity("pool "+name+" capacity", val); err != nil {
				return poolSpec{}, err
			}
		case "node-label":
			lk, lv, ok := strings.Cut(val, "=")
			if !ok || lk == "" {
				return poolSpec{}, fmt.Errorf("--pool %q: node-label=%q: want node-label=KEY=VALUE", v, val)
			}
			if s.nodeLabels == nil {
				s.nodeLabels = map[string]string{}
			}
			s.nodeLabels[lk] = lv
		default:
			return poolSpec{}, fmt.Errorf("--pool %q: unknown option %q (want %s)", v, o, poolSyntax)
		}
	}
	return s, nil
}

// poolSpecs are the pools of the command line: each --pool, and
// --pool-dir as the pool named default when it is set or no --pool is.
// --capacity is the default pool's, however it is given.
func poolSpecs(flags []string, poolDir string, poolDirSet bool, capacity string) ([]poolSpec, error) {
	var specs []poolSpec
	for _, f := range flags {
		s, err := parsePool(f)
		if err != nil {
			return nil, err
		}
		specs = append(specs, s)
	}
	if len(flags) == 0 || poolDirSet {
		specs = append(specs, poolSpec{name: pool.DefaultName, dir: poolDir})
	}
	if capacity != "" {
		i := slices.IndexFunc(specs, func(s poolSpec) bool { return s.name == pool.DefaultName })
		switch {
		case i < 0:
			return nil, errors.New("--capacity is the capacity of the pool named default, which is not given: give each pool its own (--pool NAME=DIR,capacity=SIZE)")
		case specs[i].capacity != 0:
			return nil, errors.New("the default pool's capacity is given twice, by --capacity and by --pool default=...,capacity=; use one")
		}
		var err error
		if specs[i].capacity, err = quantity("capacity", capacity); err != nil {
			return nil, err
		}
	}
	for i, a := range specs {
		for _, b := range specs[:i] {
			ad, bd := filepath.Clean(a.dir), filepath.Clean(b.dir)
			switch {
			case a.name == b.name && a.name == pool.DefaultName:
				return nil, fmt.Errorf("pool %s is given twice: by --pool-dir and by --pool %s=...; use one", a.name, a.name)
			case a.name == b.name:
				return nil, fmt.Errorf("pool %s is given twice", a.name)
			case ad == bd:
				return nil, fmt.Errorf("pools %s and %s have one directory, %s", b.name, a.name, ad)
			case strings.HasPrefix(ad+"/", bd+"/") || strings.HasPrefix(bd+"/", ad+"/"):
				return nil, fmt.Errorf("pools %s (%s) and %s (%s): one's directory is inside the other's", b.name, bd, a.name, ad)
			}
		}
	}
	return specs, nil
}

// onThisNode keeps the pools whose node labels the node has. labels is
// nil when no pool names any.
func onThisNode(specs []poolSpec, labels map[string]string) []poolSpec {
	var out []poolSpec
	for _, s := range specs {
		ok := true
		for k, v := range s.nodeLabels {
			if got, has := labels[k]; !has || got != v {
				ok = false
			}
		}
		if ok {
			out = append(out, s)
		} else {
			klog.InfoS("Pool not served on this node: the node lacks its labels", "pool", s.name, "dir", s.dir, "nodeLabels", s.nodeLabels)
		}
	}
	return out
}

// needsNodeLabels reports whether a pool names node labels.
func needsNodeLabels(specs []poolSpec) bool {
	return slices.ContainsFunc(specs, func(s poolSpec) bool { return len(s.nodeLabels) > 0 })
}

// parseForget reads --forget-pool.
func parseForget(v string) ([]string, error) {
	var out []string
	for _, n := range strings.Split(v, ",") {
		if n = strings.TrimSpace(n); n == "" {
			continue
		}
		if !pool.ValidName(n) {
			return nil, fmt.Errorf("--forget-pool %q: %q is no pool's name", v, n)
		}
		out = append(out, n)
	}
	return out, nil
}

// checkFilesystems refuses two pools on one filesystem unless each has
// its own capacity: each would otherwise count the whole filesystem as
// its own, and promise its free space twice. A directory not made yet is
// on its nearest existing parent's filesystem; nothing is written.
func checkFilesystems(specs []poolSpec) error {
	fsOf := map[uint64]int{}
	for i, s := range specs {
		var st unix.Stat_t
		dir := s.dir
		for {
			err := unix.Stat(dir, &st)
			if err == nil {
				break
			}
			if !errors.Is(err, unix.ENOENT) || dir == "/" {
				return fmt.Errorf("pool %s: %s: %w", s.name, dir, err)
			}
			dir = filepath.Dir(dir)
		}
		if j, ok := fsOf[st.Dev]; ok && (s.capacity == 0 || specs[j].capacity == 0) {
			return fmt.Errorf("pools %s (%s) and %s (%s) are on one filesystem: give each its own capacity (--pool NAME=DIR,capacity=SIZE) so that its free space is not counted twice, or put them on filesystems of their own", specs[j].name, specs[j].dir, s.name, s.dir)
		}
		fsOf[st.Dev] = i
	}
	return nil
}

// checkCapacities refuses a capacity given for a pool that is more than the
// filesystem holding it can give the pool's images (pool.Room), and the
// capacities of pools on one filesystem that together are: volumes written
// whole would find the filesystem full, and writes inside them would fail
// with ENOSPC although no volume is. With force, each such promise is
// logged and kept. A pool with no capacity given takes its room, so it
// passes (and shares no filesystem: checkFilesystems). rooms and fsIDs are
// the pools', by index of specs: their measure and their filesystem.
//
// The refusal is for a configuration that is wrong from the start: a new
// node, a new pool. held says the plugin's pools hold volumes or
// snapshots; refusing to start then would not correct a configuration but
// take the node's pods their volumes' mounts, for as long as the filesystem
// stays full of other files (logs, images) that filled it after the pools
// were sized. Then each such pool is logged and served with its capacity
// lowered to what the filesystem can give (pools on one filesystem share
// that in proportion to what they were given): reduced holds it by index of
// specs.
func checkCapacities(specs []poolSpec, rooms []pool.Room, fsIDs []uint64, held, force bool) (reduced map[int]int64, err error) {
	var errs []error
	reduced = map[int]int64{}
	done := map[uint64]bool{}
	for i, s := range specs {
		if s.capacity == 0 || done[fsIDs[i]] {
			continue
		}
		done[fsIDs[i]] = true
		room, given, names, group := pool.Room{}, int64(0), []string{}, []int{}
		for j := i; j < len(specs); j++ {
			if fsIDs[j] != fsIDs[i] {
				continue
			}
			if len(names) == 0 {
				room = rooms[j]
			} else {
				room = room.Plus(rooms[j])
			}
			given += specs[j].capacity
			names = append(names, fmt.Sprintf("%s (%s)", specs[j].name, humanQuantity(specs[j].capacity)))
			group = append(group, j)
		}
		if given <= room.Bytes() {
			continue
		}
		var err error
		if len(names) == 1 {
			err = fmt.Errorf("pool %s: its capacity, %s, is more than the filesystem holding %s can give its volumes, %s; volumes written whole would find the filesystem full, and writes inside them fail with ENOSPC although no volume is full: give a capacity of at most %s (or none: the plugin then takes this figure), make room on the filesystem, or pass --force-capacity to promise it anyway",
				s.name, humanQuantity(s.capacity), s.dir, room, humanQuantity(room.Bytes()))
		} else {
			err = fmt.Errorf("pools %s are on one filesystem and given %s together, more than it can give their volumes, %s; volumes written whole would find the filesystem full, and writes inside them fail with ENOSPC although no volume is full: give them at most %s together, make room on the filesystem, or pass --force-capacity to promise it anyway",
				strings.Join(names, ", "), humanQuantity(given), room, humanQuantity(room.Bytes()))
		}
		switch {
		case force:
			klog.ErrorS(err, "Capacity forced (--force-capacity): promised anyway")
		case !held:
			errs = append(errs, err)
		default:
			var to []string
			for _, j := range group {
				reduced[j] = share(specs[j].capacity, room.Bytes(), given)
				to = append(to, fmt.Sprintf("%s: %s", specs[j].name, humanQuantity(reduced[j])))
			}
			klog.ErrorS(err, "The node's pools hold volumes, so the plugin starts rather than refuse (its pods would lose their volumes' mounts): it serves with the capacity reduced to what the filesystem can give, admits nothing beyond it, and reports PoolCapacityReduced until room is made and the plugin restarted",
				"reducedTo", strings.Join(to, ", "))
		}
	}
	return reduced, errors.Join(errs...)
}

// share is given's share of room, of total given on one filesystem
// (given <= total), in whole MiB. Exact: given*room may exceed 64 bits.
func share(given, room, total int64) int64 {
	q := new(big.Int).Mul(big.NewInt(given), big.NewInt(room))
	return q.Quo(q, big.NewInt(total)).Int64() &^ (1<<20 - 1)
}

// humanQuantity is n bytes as a quantity a flag takes (2Gi, 1500Mi).
func humanQuantity(n int64) string {
	return resource.NewQuantity(n, resource.BinarySI).String()
}

// checkOpenedCapacities is checkCapacities on the opened pools, each in the
// order of specs, and lowers the capacities it reduces.
func checkOpenedCapacities(specs []poolSpec, opened []*pool.Pool, force bool) error {
	rooms := make([]pool.Room, len(opened))
	fsIDs := make([]uint64, len(opened))
	held := false
	for i, p := range opened {
		var st unix.Stat_t
		if err := unix.Stat(p.Dir(), &st); err != nil {
			return fmt.Errorf("pool %s: %w", p.Name(), err)
		}
		rooms[i], fsIDs[i] = p.Room(), st.Dev
		// Any record: an inline volume, one being deleted, a snapshot
		// whose volume is gone are data or mounts too.
		if u := p.Store().Usage(); u.Volumes+u.Snapshots > 0 {
			held = true
		}
	}
	reduced, err := checkCapacities(specs, rooms, fsIDs, held, force)
	if err != nil {
		return err
	}
	for i, c := range reduced {
		opened[i].ReduceCapacity(c)
	}
	return nil
}
