package main

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/podvol/podvol/internal/pool"
)

// poolSpec is one pool of the command line.
type poolSpec struct {
	name, dir string
	capacity  int64 // 0: the size of the filesystem holding dir
}

// poolFlags collects the repeatable --pool.
type poolFlags []string

func (f *poolFlags) String() string     { return strings.Join(*f, " ") }
func (f *poolFlags) Set(v string) error { *f = append(*f, v); return nil }

// parsePool reads NAME=DIR[,capacity=SIZE].
func parsePool(v string) (poolSpec, error) {
	name, rest, ok := strings.Cut(v, "=")
	if !ok {
		return poolSpec{}, fmt.Errorf("--pool %q: want NAME=DIR[,capacity=SIZE]", v)
	}
	if !pool.ValidName(name) {
		return poolSpec{}, fmt.Errorf("--pool %q: the name %q must be 1 to 16 lower-case letters and digits (it appears in volume ids and metric labels)", v, name)
	}
	dir, opts, _ := strings.Cut(rest, ",")
	s := poolSpec{name: name, dir: dir}
	if !filepath.IsAbs(dir) {
		return poolSpec{}, fmt.Errorf("--pool %q: the directory %q must be an absolute path", v, dir)
	}
	if opts != "" {
		size, ok := strings.CutPrefix(opts, "capacity=")
		if !ok {
			return poolSpec{}, fmt.Errorf("--pool %q: unknown option %q (the one option is capacity=SIZE)", v, opts)
		}
		var err error
		if s.capacity, err = quantity("pool "+name+" capacity", size); err != nil {
			return poolSpec{}, err
		}
	}
	return s, nil
}

// poolSpecs are the pools to serve: each --pool, and --pool-dir (with
// --capacity) as the pool named default when it is set or no --pool is.
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
		s := poolSpec{name: pool.DefaultName, dir: poolDir}
		if capacity != "" {
			var err error
			if s.capacity, err = quantity("capacity", capacity); err != nil {
				return nil, err
			}
		}
		specs = append(specs, s)
	} else if capacity != "" {
		return nil, errors.New("--capacity is the capacity of --pool-dir: with --pool, give each pool its own (--pool NAME=DIR,capacity=SIZE)")
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

// checkFilesystems refuses two pools on one filesystem unless each has
// its own capacity: each would otherwise count the whole filesystem as
// its own, and promise its free space twice.
func checkFilesystems(specs []poolSpec, pools []*pool.Pool) error {
	fsOf := map[uint64]int{}
	for i, p := range pools {
		var st unix.Stat_t
		if err := unix.Stat(p.Dir(), &st); err != nil {
			return fmt.Errorf("pool %s: %w", p.Name(), err)
		}
		id := st.Dev
		if j, ok := fsOf[id]; ok && (specs[i].capacity == 0 || specs[j].capacity == 0) {
			return fmt.Errorf("pools %s (%s) and %s (%s) are on one filesystem: give each its own capacity (--pool NAME=DIR,capacity=SIZE) so that its free space is not counted twice, or put them on filesystems of their own", pools[j].Name(), pools[j].Dir(), p.Name(), p.Dir())
		}
		fsOf[id] = i
	}
	return nil
}
