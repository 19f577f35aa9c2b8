// Package store is podvol's crash-safe metadata: the one place that knows
// which volumes exist and what state each is in on this node. Every change is
// committed (fsync'd) before the action it describes, so that after a crash
// the plugin can finish or roll back whatever was under way.
package store

import (
	"errors"
	"fmt"
	"os"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// ErrNotFound is returned for a volume the store does not know.
var ErrNotFound = errors.New("not found")

// ErrLocked is returned by Open while another process has the store open.
var ErrLocked = errors.New("locked: another podvol-plugin is using this pool")

var (
	bucketVolumes       = []byte("volumes")
	bucketNames         = []byte("volume-names")
	bucketSnapshots     = []byte("snapshots")
	bucketSnapshotNames = []byte("snapshot-names")
	bucketGroups        = []byte("groups")
	bucketGroupNames    = []byte("group-names")
	// Snapshots deleted here: id -> time. See DeletedSnapshot.
	bucketDeletedSnapshots = []byte("deleted-snapshots")
	// Older stores' index of those by time, to trim them: removed.
	bucketDeletedSnapshotTimes = []byte("deleted-snapshot-times")
	// Facts about the store itself.
	bucketMeta        = []byte("meta")
	keyDeletionsSince = []byte("deletions-recorded-since")
)

// Volume states. A volume is written as Creating before its image exists and
// as Deleting before its image goes, so a restart knows what to clean up.
const (
	Creating = "creating"
	Ready    = "ready"
	Deleting = "deleting"
	// Importing: the volume's data is being pulled from another node
	// (Import). Unlike Creating it survives a restart, which resumes the
	// pull; it is not a volume any call but its creation and deletion
	// can see until it is Ready.
	Importing = "importing"
)

// Stage states: Staging is written before the loop device and the mount are
// made, Staged once both exist.
const (
	Staging = "staging"
	Staged  = "staged"
)

// Publish states, likewise.
const (
	Publishing = "publishing"
	Published  = "published"
)

// Volume is one volume of this node's pool.
type Volume struct {
	ID         string            `json:"id"`
	Name       string            `json:"name"`
	SizeBytes  int64             `json:"sizeBytes"`
	FsType     string            `json:"fsType"`
	Parameters map[string]string `json:"parameters,omitempty"`
	State      string            `json:"state"`
	Created    time.Time         `json:"created"`
	// Namespace is the namespace of the claim the volume was provisioned
	// for (external-provisioner's csi.storage.k8s.io/pvc/namespace, with
	// --extra-create-metadata); "" when not known: no such parameter, a
	// volume made before podvol recorded it, an adopted or inline one.
	// Its snapshots carry it (Snapshot.Namespace).
	Namespace string `json:"namespace,omitempty"`
	// Source is the snapshot or volume this one was made from.
	Source *Source `json:"source,omitempty"`
	// GrowFs is set when the image grew and the filesystem on it has not
	// yet been grown to match.
	GrowFs bool `json:"growFs,omitempty"`
	// Inline is set for a CSI inline ephemeral volume: it lives and dies
	// with one pod, and is staged straight at that pod's target path.
	Inline *Inline `json:"inline,omitempty"`
	// Import is how far the pull of an Importing volume has got.
	Import *Import `json:"import,omitempty"`
	// Moving is set once a migration took the volume's last data for
	// another node: the volume is not staged here again while it is.
	Moving *Moving `json:"moving,omitempty"`
	// PulledFor is the claim a finished pull made the volume for, until a
	// PV is seen to name it: if that claim goes first, no one will ever
	// ask for the volume (mobility.Sweeper deletes it).
	PulledFor *Claim `json:"pulledFor,omitempty"`

	Stage        *Stage                  `json:"stage,omitempty"`
	Publications map[string]*Publication `json:"publications,omitempty"`
}

// Pulled tells whether the volume's data was pulled from another node (its
// Source is there): podvol did not write it, so it is never formatted.
func (v *Volume) Pulled() bool { return v.Source != nil && v.Source.Node != "" }

// Inline identifies the pod of an inline ephemeral volume.
type Inline struct {
	VolumeHandle string `json:"volumeHandle"` // the id kubelet gave the volume
	PodUID       string `json:"podUID"`
	PodName      string `json:"podName"`
	PodNamespace string `json:"podNamespace"`
}

// Source kinds.
const (
	FromSnapshot = "snapshot"
	FromVolume   = "volume"
)

// Source names what a volume was made from.
type Source struct {
	Kind string `json:"kind"`
	ID   string `json:"id"`
	// Node holds the source when it is not this node (its data is pulled).
	Node string `json:"node,omitempty"`
}

// Import records the pull of a volume's data from another node: the claim
// it is for (which the source node checks), and the pull's last checkpoint.
type Import struct {
	ClaimNamespace string `json:"claimNamespace"`
	ClaimName      string `json:"claimName"`
	ClaimUID       string `json:"claimUID"`
	// Identity and Size of the source's image; Verified: every byte
	// before it is synced and checked.
	Identity string `json:"identity,omitempty"`
	Size     int64  `json:"size,omitempty"`
	Verified int64  `json:"verified,omitempty"`
	// Base is the image the copy held whole before Identity's changes
	// (a migration's pre-copy); with no Identity, the copy is Base.
	Base string `json:"base,omitempty"`
}

// Moving names the claim a migration's last data was taken for, and when.
type Moving struct {
	Claim Claim     `json:"claim"`
	Since time.Time `json:"since"`
}

// Stage records a NodeStageVolume: the loop device and, for filesystem
// volumes, the staging mount.
type Stage struct {
	Path       string   `json:"path"`
	Device     string   `json:"device,omitempty"`
	Block      bool     `json:"block,omitempty"`
	MountFlags []string `json:"mountFlags,omitempty"`
	State      string   `json:"state"`
}

// Publication records a NodePublishVolume at one target path.
type Publication struct {
	// Direct: assigned to a microVM through the Kata direct-volume
	// protocol instead of mounted at the target.
	Direct     bool   `json:"direct,omitempty"`
	Block      bool   `json:"block,omitempty"`
	ReadOnly   bool   `json:"readOnly,omitempty"`
	AccessMode int32  `json:"accessMode"` // AccessShared or AccessExclusive
	State      string `json:"state"`
}

// A publication's access mode, as recorded.
const (
	AccessShared int32 = 0
	// AccessExclusive (ReadWriteOncePod): no other publication of the
	// volume may be mounted meanwhile.
	AccessExclusive int32 = 1
)

// Exclusive tells whether the publication is ReadWriteOncePod.
func (p *Publication) Exclusive() bool { return p.AccessMode == AccessExclusive }

// Store is the metadata database in the pool.
type Store struct {
	db        *bolt.DB
	ledger    *ledger
	volumes   table[Volume]
	snapshots table[Snapshot]
	groups    table[Group]
	// deletionsSince: see DeletionsRecordedSince.
	deletionsSince time.Time
	// made: Open created the file.
	made bool
}

// Made tells whether Open created the store, rather than opened one.
func (s *Store) Made() bool { return s.made }

// Open opens (creating if needed) the database at path. A second plugin on
// the same pool fails here rather than corrupting the first one's state.
func Open(path string) (*Store, error) {
	_, err := os.Lstat(path)
	made := errors.Is(err, os.ErrNotExist)
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	if err != nil {
		if errors.Is(err, bolterrors.ErrTimeout) {
			return nil, fmt.Errorf("open %s: %w", path, ErrLocked)
		}
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	var since time.Time
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketVolumes, bucketNames, bucketSnapshots, bucketSnapshotNames, bucketDeletedSnapshots, bucketGroups, bucketGroupNames} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		var err error
		since, err = deletionsSince(tx, made, time.Now())
		return err
	})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("initialise %s: %w", path, err), db.Close())
	}
	l := &ledger{}
	s := &Store{
		db:             db,
		ledger:         l,
		deletionsSince: since,
		made:           made,
		volumes:        table[Volume]{db: db, ledger: l, kind: "volume", records: bucketVolumes, names: bucketNames, id: func(v *Volume) string { return v.ID }, name: func(v *Volume) string { return v.Name }, usage: volumeUsage},
		snapshots: table[Snapshot]{db: db, ledger: l, kind: "snapshot", records: bucketSnapshots, names: bucketSnapshotNames, id: func(s *Snapshot) string { return s.ID }, name: func(s *Snapshot) string { return s.Name }, usage: snapshotUsage,
			deleted: func(tx *bolt.Tx, id string) error { return rememberDeleted(tx, id, time.Now()) }},
		groups: table[Group]{db: db, ledger: l, kind: "group snapshot", records: bucketGroups, names: bucketGroupNames, id: func(g *Group) string { return g.ID }, name: func(g *Group) string { return g.Name }, usage: func(*Group) Usage { return Usage{} }},
	}
	if _, _, err := s.Recount(); err != nil {
		return nil, errors.Join(fmt.Errorf("open %s: %w", path, err), db.Close())
	}
	return s, nil
}

// Close releases the database.
func (s *Store) Close() error { return s.db.Close() }

// Volume returns the volume with id.
func (s *Store) Volume(id string) (*Volume, error) { return s.volumes.get(id) }

// VolumeByName returns the volume created under the CSI name.
func (s *Store) VolumeByName(name string) (*Volume, error) { return s.volumes.byName(name) }

// Volumes returns every volume, ordered by id.
func (s *Store) Volumes() ([]*Volume, error) { return s.volumes.list() }

// VolumePage returns, in id order from the id start on, at most limit
// volumes (0: no limit) that keep accepts, and the id the next page starts
// at ("" after the last). Its cost follows the page, not the store.
func (s *Store) VolumePage(start string, limit int, keep func(*Volume) bool) ([]*Volume, string, error) {
	return s.volumes.page(start, limit, keep)
}

// Create stores a new volume. It fails if the name is taken, so that two
// concurrent creations of one name cannot both proceed.
func (s *Store) Create(v *Volume) error { return s.volumes.create(v) }

// Update reads the volume, lets fn change it and writes it back, atomically.
func (s *Store) Update(id string, fn func(v *Volume) error) (*Volume, error) {
	return s.volumes.update(id, fn)
}

// Delete forgets the volume.
func (s *Store) Delete(id string) error { return s.volumes.delete(id) }

var errExists = errors.New("already exists")

// IsExists reports whether err came from a creation finding the name taken.
func IsExists(err error) bool { return errors.Is(err, errExists) }
