package pool

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/podvol/podvol/internal/device"
)

// servedFile records, in a pool's directory, the names of the pools its
// plugin served together with it, one per line. A later start that leaves
// one of them out would forget that pool's volumes: their
// PersistentVolumes could be neither staged nor deleted, and their images
// would stay on the disk unaccounted for. So the start is refused instead
// (CheckServed), as a lost store is.
const servedFile = "served-with"

// ServedWith returns the names of the pools this pool was last served
// with (itself included); none for a pool never served with a record.
func (p *Pool) ServedWith() ([]string, error) {
	b, err := os.ReadFile(filepath.Join(p.dir, servedFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("pool %s: read the pools it was served with: %w", p.name, err)
	}
	return strings.Fields(string(b)), nil
}

// RecordServedWith writes the names of the pools served now into this
// pool's directory, for CheckServed at the next start.
func (p *Pool) RecordServedWith(names []string) error {
	names = slices.Sorted(slices.Values(names))
	path := filepath.Join(p.dir, servedFile)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(strings.Join(names, "\n")+"\n"), 0o600); err != nil {
		return fmt.Errorf("pool %s: record the pools served: %w", p.name, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("pool %s: record the pools served: %w", p.name, err)
	}
	return device.SyncDir(p.dir)
}

// CheckServed refuses to serve pools when one they were last served with
// is missing from them, unless it is named in forget (an admin's word
// that the pool and its volumes are gone for good).
func CheckServed(pools []*Pool, forget []string) error {
	serving := map[string]bool{}
	for _, p := range pools {
		serving[p.name] = true
	}
	var errs []error
	missing := map[string]bool{}
	for _, p := range pools {
		was, err := p.ServedWith()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, name := range was {
			if !serving[name] && !slices.Contains(forget, name) && !missing[name] {
				missing[name] = true
				errs = append(errs, fmt.Errorf("pool %q was served before, together with pool %s (%s), and is not served now: its volumes would be forgotten, neither staged nor deleted, their images left on its disk. Serve it again (--pool %s=DIR), or, if that pool and its volumes are gone for good, start once with --forget-pool %s", name, p.name, p.dir, name, name))
			}
		}
	}
	return errors.Join(errs...)
}
