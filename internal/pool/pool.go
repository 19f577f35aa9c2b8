// Package pool keeps the volumes of one node as sparse image files in a pool
// directory: it creates, sizes and deletes them, and accounts for capacity.
// It never mounts; the node package does that with the images it hands out.
package pool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/podvol/podvol/internal/device"
	"github.com/podvol/podvol/internal/errkind"
	"github.com/podvol/podvol/internal/failpoint"
	"github.com/podvol/podvol/internal/store"
)

// MaxNameLength bounds CSI names (Kubernetes names are at most 253).
const MaxNameLength = 512

// Config is what the pool needs to know.
type Config struct {
	// Name of the pool (ValidName); "" is DefaultName.
	Name string
	Dir  string
	// Capacity in bytes; 0 takes what the filesystem holding Dir can give
	// the pool's images (Room.Bytes). A capacity above that is not
	// refused here: the caller compares it with Pool.Room, where it can
	// add up the pools that share a filesystem, and refuses it or lowers
	// it (ReduceCapacity).
	Capacity int64
	// UnknownImages is what to do with images the store has no record
	// of: UnknownRefuse (the default), UnknownAdopt or UnknownDelete.
	UnknownImages string
	// Device is the machine the images are attached, probed and copied
	// on: device.Host{} for this machine, devicetest's fake in tests.
	// Required: Open refuses a nil one.
	Device device.Interface
	// LockWait is how long Open waits for another plugin holding the
	// pool's store to let go (a pod being replaced by another
	// DaemonSet's, which nothing orders); 0: one try (2 s).
	LockWait time.Duration
}

// Pool is one node's volume pool.
type Pool struct {
	name     string
	dir      string
	volDir   string
	snapDir  string
	capacity int64
	room     Room
	store    *store.Store
	reflink  bool
	dev      device.Interface
	// configured is the capacity the pool was given (Config.Capacity), or
	// its room at open when none was: above capacity once ReduceCapacity
	// lowered it.
	configured int64
	// loopTag names this pool to the kernel in each loop device it
	// attaches (device.LoopOptions.Tag): see LoopTag.
	loopTag string

	// mu serialises every capacity check with the allocation it admits
	// (volume and snapshot creation, growth).
	mu sync.Mutex
}

// Open opens or initialises the pool at cfg.Dir.
func Open(cfg Config) (*Pool, error) {
	if cfg.Device == nil {
		// No default: a test that forgot its fake would otherwise attach
		// loop devices and mount on the machine running it.
		return nil, errors.New("pool: Config.Device is nil: pass device.Host{} for this machine, or devicetest.New() in tests")
	}
	name := cfg.Name
	if name == "" {
		name = DefaultName
	}
	if !ValidName(name) {
		return nil, fmt.Errorf("pool name %q: want 1 to 16 lower-case letters and digits", cfg.Name)
	}
	if cfg.Dir == "" || !filepath.IsAbs(cfg.Dir) {
		return nil, fmt.Errorf("pool directory %q must be an absolute path", cfg.Dir)
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("create pool directory: %w", err)
	}
	// Resolve once, so that every path handed to the kernel (and compared
	// with what /sys reports for a loop device) is canonical.
	dir, err := filepath.EvalSymlinks(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("resolve pool directory: %w", err)
	}
	p := &Pool{name: name, dir: dir, volDir: filepath.Join(dir, "volumes"), snapDir: filepath.Join(dir, "snapshots"), dev: cfg.Device}
	_, err = os.Lstat(p.snapDir)
	held := err == nil // the pool held snapshots before, maybe under a store now lost
	for _, d := range []string{p.volDir, p.snapDir} {
		if err := mkdirNoSymlink(d); err != nil {
			return nil, err
		}
	}
	if p.loopTag, err = LoopTag(p.volDir); err != nil {
		return nil, err
	}
	p.reflink = p.dev.CanReflink(p.volDir)
	if p.reflink {
		klog.InfoS("Pool filesystem supports reflink: snapshots and clones share extents and take constant time", "dir", dir)
	} else {
		klog.InfoS("Pool filesystem has no reflink: snapshots and clones are sparse copies, their time grows with the data (use XFS or btrfs for constant time)", "dir", dir)
	}
	if p.store, err = openStore(filepath.Join(dir, "podvol.db"), cfg.LockWait); err != nil {
		return nil, err
	}
	if p.store.Made() && held {
		// A new store in a pool that was there before: the snapshots
		// the lost one deleted are not in it (DeleteHeldSnapshot).
		if err := p.store.MissedDeletionsBefore(time.Now()); err != nil {
			return nil, errors.Join(err, p.store.Close())
		}
	}
	if err := p.accountForImages(context.Background(), cfg.UnknownImages); err != nil {
		return nil, errors.Join(err, p.store.Close())
	}
	// Measured once every image left is the pool's own.
	if p.room, err = p.measureRoom(); err != nil {
		return nil, errors.Join(fmt.Errorf("pool %s: %w", dir, err), p.store.Close())
	}
	p.capacity = cfg.Capacity
	if p.capacity == 0 {
		p.capacity = p.room.Bytes()
	}
	p.configured = p.capacity
	return p, nil
}

// openStore opens the store at path, waiting up to wait for another
// process that holds it.
func openStore(path string, wait time.Duration) (*store.Store, error) {
	deadline := time.Now().Add(wait)
	for logged := false; ; logged = true {
		s, err := store.Open(path)
		if !errors.Is(err, store.ErrLocked) || time.Now().After(deadline) {
			if errors.Is(err, store.ErrLocked) && wait > 0 {
				err = fmt.Errorf("%w (waited %s for it to let go: is a second plugin running on this pool?)", err, wait)
			}
			return s, err
		}
		if !logged {
			klog.InfoS("Another podvol-plugin holds the pool (its pod being replaced?); waiting for it to let go", "store", path, "wait", wait)
		}
	}
}

// mkdirNoSymlink creates dir, refusing a symlink planted in its place.
func mkdirNoSymlink(dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s must be a directory, found %s: %w", dir, fi.Mode().Type(), errkind.ErrUnusable)
	}
	return nil
}

// Close closes the metadata store.
func (p *Pool) Close() error { return p.store.Close() }

// Store gives the node package access to volume records.
func (p *Pool) Store() *store.Store { return p.store }

// Name is the pool's name (DefaultName for a plugin's only pool).
func (p *Pool) Name() string { return p.name }

// Dir is the canonical pool directory.
func (p *Pool) Dir() string { return p.dir }

// ImagePath returns the image file of a volume. id must be ValidID.
func (p *Pool) ImagePath(id string) string { return filepath.Join(p.volDir, id+".img") }

// Reflink reports whether copies share extents.
func (p *Pool) Reflink() bool { return p.reflink }

// Capacity returns the configured capacity and what volumes and snapshots
// take of it. A volume counts its full size, whatever its sparse image holds,
// and so does a VolumeSnapshot's snapshot: it shares extents with its source
// at first, but every later write to the source unshares some. A snapshot
// cut for a transfer counts the blocks its image held when cut
// (Snapshot.Held): its image never changes, and each block a later write to
// the source needs is the source's, inside the source's full size, so the
// promise stays whole; the pre-copy of a migration needs room for the
// volume's data, not its size. (VolumeSnapshots could count the same way,
// but kubectl podvol status adds a node's allocation up from the API, where
// only their restore size is.) It reads the store's
// running total, so neither GetCapacity nor an admission (under p.mu) costs
// more as volumes accumulate.
func (p *Pool) Capacity() (total, allocated int64) {
	u := p.store.Usage()
	return p.capacity, u.VolumeBytes + u.SnapshotBytes
}

// ReduceCapacity lowers the pool's capacity to c, when its filesystem
// cannot give it the one it was given (ConfiguredCapacity keeps that) and
// refusing to start would cost volumes their mounts: cmd/podvol-plugin's
// checkCapacities. Only before the pool serves: Capacity reads it unlocked.
func (p *Pool) ReduceCapacity(c int64) {
	p.capacity = min(p.capacity, c)
}

// ConfiguredCapacity is the capacity the pool was given, or its room at open
// when none was: more than Capacity's total once ReduceCapacity lowered it.
func (p *Pool) ConfiguredCapacity() int64 { return p.configured }

// admit checks that more bytes fit. The caller holds p.mu and records the
// allocation before releasing it.
func (p *Pool) admit(more int64) error {
	total, allocated := p.Capacity()
	if free := total - allocated; more > free {
		if p.configured > total {
			return fmt.Errorf("requested %d bytes, %d of %d free: the pool's capacity, %d given, was reduced to %d at the plugin's start, all its filesystem could give it (other files fill it): make room on that filesystem and restart the plugin: %w",
				more, max(free, 0), total, p.configured, total, errkind.ErrNoSpace)
		}
		return fmt.Errorf("requested %d bytes, %d of %d free: %w", more, max(free, 0), total, errkind.ErrNoSpace)
	}
	return nil
}

// Check reports why the pool cannot serve, or nil: the directory must be
// there and writable and the store readable.
func (p *Pool) Check() error {
	if err := unix.Access(p.volDir, unix.W_OK); err != nil {
		return fmt.Errorf("pool %s is not writable: %w: %w", p.volDir, err, errkind.ErrUnusable)
	}
	if _, err := p.store.Volumes(); err != nil {
		return fmt.Errorf("metadata store: %w: %w", err, errkind.ErrUnusable)
	}
	return nil
}

// CreateRequest is a validated CreateVolume.
type CreateRequest struct {
	Name       string
	SizeBytes  int64
	FsType     string
	Parameters map[string]string
	// Namespace is the namespace of the claim the volume is for, ""
	// if not known (store.Volume.Namespace).
	Namespace string
	Source    *store.Source
	Inline    *store.Inline
	// Format makes the filesystem when the image is made, for a volume
	// every capability of which mounts it: CreateVolume runs while
	// kube-scheduler waits for the claim to be bound anyway, and
	// NodeStageVolume, on the pod's path, is left to attach and mount.
	// A volume with a source has its source's filesystem.
	Format bool
	// Quiesce is called around the copy of a source volume, so that a
	// mounted filesystem is consistent in the copy. It returns the undo.
	Quiesce func(volumeID string) (func(), error)
	// Import names the claim a volume whose Source is on another node
	// (Source.Node) is for: such a volume is recorded Importing, empty,
	// for a pull to fill.
	Import *store.Import
}

// CreateVolume creates a volume, or returns the existing one of that name if
// it has the same size and parameters.
func (p *Pool) CreateVolume(ctx context.Context, r CreateRequest) (*store.Volume, error) {
	v, err := p.store.VolumeByName(r.Name)
	switch {
	case err == nil:
		if v.SizeBytes != r.SizeBytes || v.FsType != r.FsType || !maps.Equal(v.Parameters, r.Parameters) || !sameSource(v.Source, r.Source) {
			return nil, fmt.Errorf("volume %q (%s, %d bytes, %s): %w", r.Name, v.ID, v.SizeBytes, v.FsType, errkind.ErrConflict)
		}
		if v.State == store.Ready || v.State == store.Importing {
			return v, nil
		}
		if v.State == store.Deleting {
			return nil, fmt.Errorf("volume %q is being deleted: %w", r.Name, errkind.ErrInUse)
		}
		return p.finishCreate(ctx, v, r)
	case !errors.Is(err, store.ErrNotFound):
		return nil, err
	}
	if r.Source != nil && r.Source.Node != "" {
		return p.createImport(r)
	}
	if err := p.checkSource(&r); err != nil {
		return nil, err
	}

	v = &store.Volume{
		ID:         p.newID(kindVolume),
		Name:       r.Name,
		SizeBytes:  r.SizeBytes,
		FsType:     r.FsType,
		Parameters: r.Parameters,
		State:      store.Creating,
		Created:    time.Now().UTC(),
		Namespace:  r.Namespace,
		Source:     r.Source,
		Inline:     r.Inline,
	}
	if err := p.record(v); err != nil {
		return nil, err
	}
	failpoint.Hit("create-after-record")
	return p.finishCreate(ctx, v, r)
}

// record admits a new volume's size and writes its record, as one step
// under the pool's lock: two creations cannot both take the last room.
func (p *Pool) record(v *store.Volume) error {
	p.mu.Lock()
	err := p.admit(v.SizeBytes)
	if err == nil {
		err = p.store.Create(v)
	}
	p.mu.Unlock()
	if store.IsExists(err) {
		return fmt.Errorf("volume %q is being created concurrently: %w", v.Name, errkind.ErrInUse)
	}
	return err
}

// finishCreate makes the image of a volume recorded as Creating. A crash
// before it is Ready is rolled back by Recover, a retry starts it again.
func (p *Pool) finishCreate(ctx context.Context, v *store.Volume, r CreateRequest) (*store.Volume, error) {
	var err error
	if v.Source == nil {
		err = makeImage(p.ImagePath(v.ID), v.SizeBytes)
		if err == nil && r.Format {
			if err = p.dev.Format(ctx, p.ImagePath(v.ID), v.FsType); err != nil {
				err = fmt.Errorf("make %s filesystem on volume %s: %w", v.FsType, v.ID, err)
			}
		}
	} else {
		err = p.copyFromSource(v, r.Quiesce)
	}
	if err != nil {
		// Leave nothing behind: the record goes with the image.
		if rerr := p.removeVolume(v.ID); rerr != nil {
			klog.ErrorS(rerr, "Removing a volume whose creation failed", "volume", v.ID)
		}
		return nil, err
	}
	if err := writeParameters(p.ImagePath(v.ID), v.Parameters); err != nil {
		if rerr := p.removeVolume(v.ID); rerr != nil {
			klog.ErrorS(rerr, "Removing a volume whose creation failed", "volume", v.ID)
		}
		return nil, fmt.Errorf("volume %s: %w", v.ID, err)
	}
	failpoint.Hit("create-after-image")
	return p.store.Update(v.ID, func(v *store.Volume) error {
		v.State = store.Ready
		return nil
	})
}

func sameSource(a, b *store.Source) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// parametersXattr holds, on a volume's image, the StorageClass parameters
// it was created with: the store is not their only copy, so a volume
// adopted after the store was lost (--unknown-images=adopt) keeps them. A
// direct-assigned volume adopted without its directAssign would be mounted
// on the host, with a filesystem a guest wrote, instead of being handed to
// its microVM. A user.* attribute: the pool's filesystems (ext4, xfs,
// btrfs) and tmpfs keep them, and the plugin needs no privilege for it.
const parametersXattr = "user.podvol.parameters"

// writeParameters records params on the image (none: no attribute, should
// a copy have brought its source's). A filesystem without user attributes
// only costs them at adoption.
func writeParameters(img string, params map[string]string) error {
	var err error
	if len(params) == 0 {
		if err = unix.Lremovexattr(img, parametersXattr); errors.Is(err, unix.ENODATA) {
			return nil
		}
	} else {
		var b []byte
		if b, err = json.Marshal(params); err != nil {
			return err
		}
		err = unix.Lsetxattr(img, parametersXattr, b, 0)
	}
	if errors.Is(err, unix.ENOTSUP) {
		klog.InfoS("The pool's filesystem keeps no user attributes: a volume adopted after a loss of the metadata store will have default parameters", "image", img)
		return nil
	}
	if err != nil {
		return fmt.Errorf("record the parameters on image %s: %w", img, err)
	}
	return nil
}

// readParameters returns the parameters recorded on the image, nil if none.
func readParameters(img string) (map[string]string, error) {
	buf := make([]byte, 4096)
	n, err := unix.Lgetxattr(img, parametersXattr, buf)
	if errors.Is(err, unix.ENODATA) || errors.Is(err, unix.ENOTSUP) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the parameters recorded on image %s: %w", img, err)
	}
	var params map[string]string
	if err := json.Unmarshal(buf[:n], &params); err != nil {
		return nil, fmt.Errorf("parameters recorded on image %s: %w", img, err)
	}
	return params, nil
}

// makeImage creates a sparse file of size bytes. An image left by a crashed
// attempt for the same id is reused.
func makeImage(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("create image: %w", err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		return fmt.Errorf("size image %s to %d bytes: %w", path, size, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync image: %w", err)
	}
	return device.SyncDir(filepath.Dir(path))
}

// DeleteVolume deletes a volume and its image. A volume that does not exist
// is already deleted. A staged or published volume is in use.
func (p *Pool) DeleteVolume(ctx context.Context, id string) error {
	if !ValidID(id) {
		return nil
	}
	v, err := p.store.Volume(id)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if v.Stage != nil || len(v.Publications) > 0 {
		where := ""
		if v.Stage != nil {
			where = " at " + v.Stage.Path
		}
		return fmt.Errorf("volume %s is staged%s: unstage it first: %w", id, where, errkind.ErrInUse)
	}
	if _, err := p.store.Update(id, func(v *store.Volume) error {
		v.State = store.Deleting
		return nil
	}); err != nil {
		return err
	}
	failpoint.Hit("delete-after-mark")
	return p.removeVolume(id)
}

// removeVolume detaches any loop device left on the image, removes the image
// and then the record, in that order, so that a crash in between is finished
// by Recover.
func (p *Pool) removeVolume(id string) error {
	img := p.ImagePath(id)
	if err := p.detachUnused(img); err != nil {
		return fmt.Errorf("volume %s: %w", id, err)
	}
	if err := os.Remove(img); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove image: %w", err)
	}
	failpoint.Hit("delete-after-image")
	return p.store.Delete(id)
}

// detachUnused detaches loop devices of img that nothing has mounted. A
// mounted one means the volume is in use after all.
func (p *Pool) detachUnused(img string) error {
	devs, err := p.dev.LoopsFor(img)
	if err != nil {
		return err
	}
	for _, dev := range devs {
		mnts, err := p.dev.MountsOf(dev)
		if err != nil {
			return err
		}
		if len(mnts) > 0 {
			return fmt.Errorf("%s is mounted at %s: %w", dev, strings.Join(mnts, ", "), errkind.ErrInUse)
		}
		if err := p.dev.DetachLoop(dev, img); err != nil {
			return err
		}
	}
	return nil
}

// Recover finishes what a crash interrupted: volumes caught being created are
// rolled back (the CO retries the creation) and volumes caught being deleted
// are deleted. Images without a record were dealt with when the pool opened.
func (p *Pool) Recover(ctx context.Context) error {
	vols, err := p.store.Volumes()
	if err != nil {
		return err
	}
	var errs []error
	for _, v := range vols {
		switch v.State {
		case store.Creating, store.Deleting:
			klog.InfoS("Recovering interrupted operation", "volume", v.ID, "name", v.Name, "state", v.State)
			if err := p.removeVolume(v.ID); err != nil {
				errs = append(errs, err)
			}
		case store.Ready:
			// Growth records the new size before it grows the image.
			if err := p.dev.GrowFile(p.ImagePath(v.ID), v.SizeBytes); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	errs = append(errs, p.recoverGroups()...)
	errs = append(errs, p.recoverSnapshots()...)
	// The store keeps its running total with every write; counting the
	// records once more, now that recovery has settled them, would catch
	// a write that bypassed it before the total misleads an admission.
	was, counted, err := p.store.Recount()
	if err != nil {
		errs = append(errs, err)
	} else if was != counted {
		klog.ErrorS(nil, "The metadata store's running totals differed from its records; using the records (a bug: please report it)", "totals", was, "records", counted)
	}
	return errors.Join(errs...)
}

// LoopImage reports whether loop device dev, listed by LoopDevices with
// backing, serves a volume image of this pool, and returns the volume id
// and the backing file to name to DetachLoop. The path the kernel reports
// is the one in the mount namespace that attached the device: this
// plugin's earlier container reports another directory for this pool's
// images, and another node's plugin on the same kernel (the dev cluster)
// reports this very pool's path for images of its own pool. So the path
// only names a candidate, by its file name; the image's device and inode
// decide. A device whose image was deleted has neither left: it is this
// pool's if the pool attached it (its LoopTag), and the kernel's report
// then names it to DetachLoop.
func (p *Pool) LoopImage(dev, backing string) (id, detachAs string, ours bool) {
	name, deleted := strings.CutSuffix(filepath.Base(backing), deletedSuffix)
	id, isImage := strings.CutSuffix(name, ".img")
	if !isImage || !p.Owns(id) || !ValidID(id) {
		return "", "", false
	}
	if deleted {
		// The tag names one pool on this machine until it reboots,
		// which loop devices do not outlive.
		if p.dev.LoopTag(dev) != p.loopTag {
			return "", "", false
		}
		return id, backing, true
	}
	if !p.dev.LoopServes(dev, p.ImagePath(id)) {
		return "", "", false
	}
	return id, p.ImagePath(id), true
}

// LoopTag is the tag of the loop devices this pool attaches: the device and
// inode of its volumes directory, which no other pool on this machine has
// (whatever path its plugin's mount namespace shows it at) and which only
// changes with the directory itself.
func (p *Pool) LoopTag() string { return p.loopTag }

// LoopTag is the name a pool whose volume directory is volDir gives each
// loop device it attaches: the directory's device and inode, the same in
// every mount namespace, so that a device whose image is deleted (whose
// backing file no longer resolves) is still known as this pool's.
func LoopTag(volDir string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(volDir, &st); err != nil {
		return "", fmt.Errorf("pool %s: %w", volDir, err)
	}
	return fmt.Sprintf("podvol pool %d:%d", st.Dev, st.Ino), nil
}

// deletedSuffix ends the path the kernel reports for a loop device's
// backing file that was deleted.
const deletedSuffix = " (deleted)"

// Unwritten returns how many bytes the pool filesystem has free and how many
// the volumes and snapshots may still write into their sparse images. When
// the first is smaller, a write inside a volume can fail with ENOSPC although
// the volume is not full: the pool's filesystem is shared or too small.
func (p *Pool) Unwritten() (fsFree, promised int64, err error) {
	used, fsFree, err := p.Written()
	if err != nil {
		return 0, 0, err
	}
	_, allocated := p.Capacity()
	// used counts the blocks a volume shares with a snapshot twice, once in
	// each image; a snapshot charged its full size made up for that, and one
	// charged what it holds (a transfer's) does not: add back the difference,
	// so that this warning stays on the safe side.
	snaps, err := p.store.Snapshots()
	if err != nil {
		return 0, 0, err
	}
	for _, s := range snaps {
		allocated += s.SizeBytes - s.Held()
	}
	return fsFree, max(allocated-used, 0), nil
}

// Written returns how many bytes the images occupy on the pool filesystem
// (their written blocks) and how many that filesystem has free.
func (p *Pool) Written() (used, fsFree int64, err error) {
	fs, err := p.dev.Statfs(p.dir)
	if err != nil {
		return 0, 0, err
	}
	for _, dir := range []string{p.volDir, p.snapDir} {
		ents, err := os.ReadDir(dir)
		if err != nil {
			return 0, 0, err
		}
		for _, e := range ents {
			var st unix.Stat_t
			if unix.Lstat(filepath.Join(dir, e.Name()), &st) == nil {
				used += st.Blocks * 512
			}
		}
	}
	return used, fs.AvailableBytes, nil
}

// Holds reports whether the pool has a record of volume id, in any state.
func (p *Pool) Holds(id string) bool {
	if !ValidID(id) {
		return false
	}
	_, err := p.store.Volume(id)
	return !errors.Is(err, store.ErrNotFound)
}

// ReadyVolume returns the volume with id if it is ready: created and not
// being deleted. Anything else is errkind.ErrNotFound, as the CSI calls about an
// existing volume want it.
func (p *Pool) ReadyVolume(id string) (*store.Volume, error) {
	if !ValidID(id) {
		return nil, fmt.Errorf("volume %q does not exist on this node: %w", id, errkind.ErrNotFound)
	}
	v, err := p.store.Volume(id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("volume %q does not exist on this node: %w", id, errkind.ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	if v.State != store.Ready {
		return nil, fmt.Errorf("volume %s is %s: %w", id, v.State, errkind.ErrNotFound)
	}
	return v, nil
}
