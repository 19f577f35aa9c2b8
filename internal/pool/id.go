package pool

import (
	"crypto/rand"
	"encoding/hex"
	"regexp"
)

// DefaultName is the pool a plugin with only --pool-dir serves. Its ids
// carry no pool name, so that every id made before pools had names stays
// valid.
const DefaultName = "default"

// Id kinds: a volume, a snapshot, a group snapshot.
const (
	kindVolume   = "pv"
	kindSnapshot = "snap"
	kindGroup    = "group"
)

var (
	namePattern = regexp.MustCompile(`^[a-z0-9]{1,16}$`)
	// kind-[pool-]24 hex digits; the pool is absent for the default
	// pool. Names are short and plain because they appear in ids, paths
	// and metric labels.
	idPattern = regexp.MustCompile(`^(pv|snap|group)-(?:([a-z0-9]{1,16})-)?([0-9a-f]{24})$`)
)

// ValidName reports whether name can name a pool.
func ValidName(name string) bool { return namePattern.MatchString(name) }

// parseID returns the kind and pool of an id podvol hands out.
func parseID(id string) (kind, pool string, ok bool) {
	m := idPattern.FindStringSubmatch(id)
	if m == nil {
		return "", "", false
	}
	switch m[2] {
	case "":
		return m[1], DefaultName, true
	case DefaultName:
		// One spelling per id: the default pool's carry no name.
		return "", "", false
	}
	return m[1], m[2], true
}

// PoolOf returns the name of the pool that made id (a volume, snapshot or
// group snapshot id), or false if podvol hands out no such id.
func PoolOf(id string) (string, bool) {
	_, p, ok := parseID(id)
	return p, ok
}

func isKind(id, kind string) bool {
	k, _, ok := parseID(id)
	return ok && k == kind
}

// ValidID reports whether id has the shape of a volume id of some pool.
// Anything else cannot name a volume, and is never joined to a path.
func ValidID(id string) bool { return isKind(id, kindVolume) }

// ValidSnapshotID reports whether id has the shape of a snapshot id of
// some pool.
func ValidSnapshotID(id string) bool { return isKind(id, kindSnapshot) }

// ValidGroupID reports whether id has the shape of a group snapshot id of
// some pool.
func ValidGroupID(id string) bool { return isKind(id, kindGroup) }

// Owns reports whether id (of any kind) was made by this pool.
func (p *Pool) Owns(id string) bool {
	name, ok := PoolOf(id)
	return ok && name == p.name
}

// newID is a fresh id of kind in this pool.
func (p *Pool) newID(kind string) string {
	b := make([]byte, 12)
	_, _ = rand.Read(b) // crypto/rand.Read never returns an error (it crashes the program instead)
	if p.name == DefaultName {
		return kind + "-" + hex.EncodeToString(b)
	}
	return kind + "-" + p.name + "-" + hex.EncodeToString(b)
}
