package pool

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/podvol/podvol/internal/device"
)

// servedFile records, in a pool's directory, the pool's own name (first
// line) and the names of the pools its plugin served together with it. A
// later start that serves the directory under another name, or leaves one
// of those pools out, or serves one of them from a directory without a
// store (its disk not mounted), would forget volumes: their
// PersistentVolumes could be neither staged nor deleted, and their images
// would stay on the disk unaccounted for. CheckServed refuses such a
// start instead, before anything is written, as a lost store is refused.
const servedFile = "served-with"

// Served is one pool a plugin is about to serve.
type Served struct {
	Name, Dir string
}

// record is what a pool's servedFile says.
type record struct {
	self string
	with []string
}

func readRecord(dir string) (*record, error) {
	b, err := os.ReadFile(filepath.Join(dir, servedFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the pools %s was served with: %w", dir, err)
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return nil, fmt.Errorf("%s is empty: it should name the pool and the pools it was served with; remove it only if you know which pool the directory is", filepath.Join(dir, servedFile))
	}
	return &record{self: f[0], with: f[1:]}, nil
}

// CheckServed refuses to serve pools when a directory was another pool's,
// when a pool they were last served with is missing from them (unless
// named in forget: an admin's word that the pool and its volumes are gone
// for good), or when a pool served before comes without its store. It
// reads the pools' directories and writes nothing.
func CheckServed(pools []Served, forget []string) error {
	serving := map[string]bool{}
	for _, p := range pools {
		serving[p.Name] = true
	}
	var errs []error
	known := map[string]string{} // pool name -> a pool whose record names it
	for _, p := range pools {
		r, err := readRecord(p.Dir)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if r == nil {
			continue
		}
		if r.self != p.Name {
			errs = append(errs, fmt.Errorf("directory %s holds pool %q, and is given as pool %q: its volumes' ids name %q; give it that name again", p.Dir, r.self, p.Name, r.self))
		}
		for _, name := range r.with {
			if _, ok := known[name]; !ok {
				known[name] = p.Name
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(known)) {
		if !serving[name] && !slices.Contains(forget, name) {
			errs = append(errs, fmt.Errorf("pool %q was served before, together with pool %s, and is not served now: its volumes would be forgotten, neither staged nor deleted, their images left on its disk. Serve it again (--pool %s=DIR), or, if that pool and its volumes are gone for good, start once with --forget-pool %s", name, known[name], name, name))
		}
	}
	for _, p := range pools {
		by, ok := known[p.Name]
		if !ok || by == p.Name {
			continue
		}
		if _, err := os.Stat(filepath.Join(p.Dir, "podvol.db")); errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("pool %q was served before (pool %s's record says so), yet its directory %s holds no store: is its disk mounted there? Mount it, or give the pool's right directory", p.Name, by, p.Dir))
		}
	}
	return errors.Join(errs...)
}

// RecordServedWith writes this pool's name and the names of the pools
// served now into its directory, for CheckServed at the next start.
func (p *Pool) RecordServedWith(names []string) error {
	names = slices.Sorted(slices.Values(names))
	path := filepath.Join(p.dir, servedFile)
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("pool %s: record the pools served: %w", p.name, err)
	}
	_, err = f.WriteString(p.name + "\n" + strings.Join(names, "\n") + "\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		return fmt.Errorf("pool %s: record the pools served: %w", p.name, err)
	}
	return device.SyncDir(p.dir)
}
