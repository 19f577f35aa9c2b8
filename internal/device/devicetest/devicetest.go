// Package devicetest is an in-memory stand-in for the machine podvol acts on
// (device.Interface), in the way k8s.io/mount-utils' FakeMounter stands in
// for mount(8): the packages above internal/device (node, pool, inline) get
// fast tests that run without root, with -race, and with failures injected
// at any step.
//
// Only the kernel is faked. Image files stay real files (in t.TempDir()),
// and so do the directories that are mounted on; what the fake keeps in
// memory is what the kernel would:
//
//   - Loop devices: a table of number → backing file, each holding the file
//     open as the kernel does (an image deleted while attached stays readable
//     and is listed with " (deleted)"). A new device takes the lowest free
//     number, so a detached number is reused at once, by whoever asks next.
//     A device's size is its file's size when attached, until
//     LoopSetCapacity. A device does direct I/O if asked, unless the image's
//     directory was marked with RefuseDirectIO (the kernel asks the real
//     filesystem, which the fake does not, so that unit tests do not
//     depend on where TMPDIR is: tmpfs took O_DIRECT only from Linux 6.6);
//     its logical block size is
//     what it was asked for, or chosen as device.ChooseBlockSize does, from
//     the real pool filesystem and the fake filesystem's sector size.
//     DetachLoop of a device whose filesystem is still
//     alive (mounted, or frozen) marks it to detach when the last user goes
//     and fails, as the real one does after its wait.
//   - Filesystems: mkfs writes a small signature (type, UUID, size, root
//     group) at the start of the image itself, through the loop device, so
//     that it is data: a new image probes blank, a copy or a restore carries
//     it, blkid on an image file finds it, and growth is visible to the next
//     mount. WriteSignature plants a foreign one (swap, a partition table).
//     A signature records the sector size mkfs chose (ext4: its 4 KiB
//     block; xfs: the device's logical block size, or the pool's for an
//     image file), and a mount on a device with larger logical blocks
//     fails, as xfs and ext4 refuse it.
//   - Mounts: a table in mount order. Mounts at one path stack (the last one
//     is what MountedAt sees, Unmount removes them all); a bind mount of a
//     directory shares the superblock of the mount it lies in (or is the
//     host's filesystem, if none), a bind mount of /dev/loopN onto a file is
//     devtmpfs with root /loopN, as /proc/self/mountinfo shows them. Mounting
//     one device twice gives one superblock; an xfs whose UUID is already
//     mounted is refused unless "nouuid" is given. Unmounting a mount that
//     has a mount beneath it, or that a Filesystem handle was opened through,
//     fails with EBUSY.
//   - Freezing: per superblock, through a handle from OpenFilesystemOn, which
//     checks what the real one checks (the path is the root of a mount of
//     that device's filesystem). A frozen filesystem outlives its last
//     unmount and is found frozen by the next mount of its device, as in
//     Linux (the freeze holds the superblock); only a thaw or a Reboot ends
//     it. Every freeze and thaw is logged with the handle it went through.
//   - Copies: CopyImage records whether its source was consistent (its
//     filesystem unmounted, read-only or frozen).
//
// Where the fake is not faithful:
//   - File contents of a mounted filesystem are not modelled: a file written
//     under a mount point lands in the real directory beneath it, and a
//     mount point can be removed (os.Remove) where the kernel would say
//     EBUSY. The fake models a filesystem's identity, size, root group,
//     read-only, frozen, shut-down and error state, not its files.
//   - Operations that would block on a frozen filesystem (SetGroup,
//     GrowOnline) fail with ErrWouldBlock instead of hanging.
//   - Paths are compared as given (cleaned), not resolved: a symlink in a
//     directory above a mount point is not followed, and a renamed image is
//     still listed under its old name.
//   - Statfs of a mounted fake filesystem reports its size with nothing
//     used; paths on no fake mount are answered by the real statfs.
//   - Per-operation failures come only from what Inject sets up: there is
//     no ENOSPC, EIO or timeout of its own.
package devicetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/podvol/podvol/internal/device"
)

// Op names an operation of device.Interface (its method name), for Inject
// and Calls. Freeze, Thaw and Trim are the Filesystem handle's.
type Op string

const (
	AttachLoop       Op = "AttachLoop"
	DetachLoop       Op = "DetachLoop"
	LoopDevices      Op = "LoopDevices"
	LoopsFor         Op = "LoopsFor"
	LoopSetCapacity  Op = "LoopSetCapacity"
	LoopStatus       Op = "LoopStatus"
	LoopServes       Op = "LoopServes"
	DeviceSize       Op = "DeviceSize"
	DeviceNodeOf     Op = "DeviceNodeOf"
	SyncDevice       Op = "SyncDevice"
	Mount            Op = "Mount"
	Unmount          Op = "Unmount"
	MountedAt        Op = "MountedAt"
	MountsOf         Op = "MountsOf"
	MountedFrom      Op = "MountedFrom"
	OpenFilesystemOn Op = "OpenFilesystemOn"
	Freeze           Op = "Freeze"
	Thaw             Op = "Thaw"
	Trim             Op = "Trim"
	Statfs           Op = "Statfs"
	ReadableRoot     Op = "ReadableRoot"
	SetGroup         Op = "SetGroup"
	Probe            Op = "Probe"
	Format           Op = "Format"
	FsckIfNeeded     Op = "FsckIfNeeded"
	GrowOffline      Op = "GrowOffline"
	GrowOnline       Op = "GrowOnline"
	CopyImage        Op = "CopyImage"
	GrowFile         Op = "GrowFile"
)

// hostSource is the device of the host's own filesystem, as a bind mount
// of a directory that is on no fake mount shows it.
const hostSource = "/dev/hostroot"

// ErrWouldBlock is returned where the kernel would block on a frozen
// filesystem until it is thawed.
var ErrWouldBlock = errors.New("devicetest: would block on a frozen filesystem")

// Fake is the machine. The zero value is not usable: call New. It is safe
// for concurrent use.
type Fake struct {
	mu         sync.Mutex
	loops      map[int]*loop
	created    map[int]bool // loop numbers whose device node exists
	mounts     []*mount     // in mount order
	sbs        map[int]*superblock
	handles    map[int]*handle // open ones
	nextID     int
	inject     map[Op]func(arg string) error
	calls      map[Op]int
	freezeLog  []FreezeEvent
	copies     []Copy
	reflink    bool
	noOnlineFs bool
	noDirect   map[string]bool // directories whose filesystem refuses O_DIRECT
}

var _ device.Interface = (*Fake)(nil)

// New returns a machine with no loop device and nothing mounted, whose pool
// filesystem has no reflink and which may grow a mounted ext4.
func New() *Fake {
	return &Fake{
		loops:    map[int]*loop{},
		created:  map[int]bool{},
		sbs:      map[int]*superblock{},
		handles:  map[int]*handle{},
		inject:   map[Op]func(string) error{},
		calls:    map[Op]int{},
		noDirect: map[string]bool{},
	}
}

type loop struct {
	n       int
	backing string
	file    *os.File
	size    int64
	io      device.LoopIO
	// autoclear: detach when the filesystem on it goes (LOOP_CLR_FD on a
	// device in use).
	autoclear bool
}

type superblock struct {
	loop     *loop
	fsType   string
	uuid     string
	size     int64
	ro       bool // errors=remount-ro happened
	frozen   bool
	frozenBy int
	shutdown bool
	errCount int
	errFunc  string
}

type mount struct {
	id      int
	target  string
	source  string
	root    string
	fsType  string
	options []string
	sb      *superblock // nil: the host's filesystem or devtmpfs
}

// ---- test controls ----

// Inject makes every later call of op consult fn with the call's main
// argument (the image, device or path): a non-nil error is returned instead
// of doing anything. fn runs without the fake's lock, so it may also block,
// to hold an operation mid-way while others run. A nil fn removes the
// injection.
func (f *Fake) Inject(op Op, fn func(arg string) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fn == nil {
		delete(f.inject, op)
	} else {
		f.inject[op] = fn
	}
}

// FailNext makes the next call of op fail with err.
func (f *Fake) FailNext(op Op, err error) {
	var once sync.Once
	f.Inject(op, func(string) error {
		var e error
		once.Do(func() { e = err })
		return e
	})
}

// Calls returns how many times op was called (failed calls included).
func (f *Fake) Calls(op Op) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[op]
}

// SetReflink sets what CanReflink answers (and whether CopyImage accepts
// reflink=true).
func (f *Fake) SetReflink(on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reflink = on
}

// RefuseDirectIO makes dir's filesystem refuse direct I/O, as ramfs or a
// FUSE filesystem does: loop devices over images in it attach buffered.
func (f *Fake) RefuseDirectIO(dir string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	abs, _ := filepath.Abs(dir)
	f.noDirect[abs] = true
}

// SetOnlineExt4Growth(false) plays a host that withholds CAP_SYS_RESOURCE:
// growing a mounted ext4 fails as it does there.
func (f *Fake) SetOnlineExt4Growth(allowed bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.noOnlineFs = !allowed
}

// Reboot forgets every loop device, mount, freeze and open handle, as a
// reboot does; image files and directories stay.
func (f *Fake) Reboot() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, l := range f.loops {
		l.file.Close()
	}
	for _, h := range f.handles {
		h.closed = true
	}
	f.loops = map[int]*loop{}
	f.mounts = nil
	f.sbs = map[int]*superblock{}
	f.handles = map[int]*handle{}
}

// SetShutdown makes the filesystem on dev answer EIO, as an XFS does after
// it shuts down. dev must have a mounted filesystem.
func (f *Fake) SetShutdown(dev string) error {
	return f.withSuper(dev, func(sb *superblock) { sb.shutdown = true })
}

// SetErrors makes the mounted filesystem on dev record ext4 errors and
// remount itself read-only (errors=remount-ro).
func (f *Fake) SetErrors(dev string, count int, lastFunc string) error {
	return f.withSuper(dev, func(sb *superblock) { sb.errCount, sb.errFunc, sb.ro = count, lastFunc, true })
}

func (f *Fake) withSuper(dev string, fn func(*superblock)) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, ok := loopNumber(dev)
	sb := f.sbs[n]
	if !ok || sb == nil {
		return fmt.Errorf("devicetest: no filesystem is mounted from %s", dev)
	}
	fn(sb)
	return nil
}

// Frozen reports whether the filesystem on dev is frozen.
func (f *Fake) Frozen(dev string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, _ := loopNumber(dev)
	sb := f.sbs[n]
	return sb != nil && sb.frozen
}

// FreezeEvent is one freeze or thaw that took effect.
type FreezeEvent struct {
	Thaw   bool
	Dev    string // the device whose filesystem it reached
	Handle int    // the handle it went through
}

// FreezeLog returns every freeze and thaw so far, in order.
func (f *Fake) FreezeLog() []FreezeEvent {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.freezeLog)
}

// OpenHandles returns how many Filesystem handles are open.
func (f *Fake) OpenHandles() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.handles)
}

// Copy is one CopyImage that succeeded.
type Copy struct {
	Src, Dst string
	// Consistent: no filesystem of the source was mounted writable and
	// unfrozen while it was copied.
	Consistent bool
}

// Copies returns the image copies made so far.
func (f *Fake) Copies() []Copy {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.copies)
}

// MountEntry is one line of the mount table.
type MountEntry struct {
	Target, Source, Root, FsType string
	Options                      []string
}

// MountTable returns the mounts in mount order.
func (f *Fake) MountTable() []MountEntry {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]MountEntry, 0, len(f.mounts))
	for _, m := range f.mounts {
		out = append(out, MountEntry{Target: m.target, Source: m.source, Root: m.root, FsType: m.fsType, Options: slices.Clone(m.options)})
	}
	return out
}

// Leftovers describes every loop device, mount, frozen filesystem and open
// handle there is: nothing, once everything was cleaned up.
func (f *Fake) Leftovers() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, n := range sortedKeys(f.loops) {
		out = append(out, fmt.Sprintf("loop device %s → %s", devName(n), f.loops[n].name()))
	}
	for _, m := range f.mounts {
		out = append(out, fmt.Sprintf("mount of %s at %s", m.source, m.target))
	}
	for _, n := range sortedKeys(f.sbs) {
		if f.sbs[n].frozen {
			out = append(out, "frozen filesystem on "+devName(n))
		}
	}
	for range f.handles {
		out = append(out, "open filesystem handle")
	}
	return out
}

func sortedKeys[V any](m map[int]V) []int {
	ks := make([]int, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// ---- filesystem signatures ----

const magic = "PODVOL-DEVICETEST-SIGNATURE\n"

// Signature is what mkfs wrote at the start of an image.
type Signature struct {
	Type   string `json:"type"` // ext4, xfs, or anything planted (swap...)
	UUID   string `json:"uuid,omitempty"`
	Size   int64  `json:"size,omitempty"` // the filesystem's size
	Group  int    `json:"group"`          // the root directory's group
	Setgid bool   `json:"setgid,omitempty"`
	// Sector is the filesystem's sector size (ext4: block size); a device
	// whose logical block size is larger cannot mount it. 0: 512, as
	// signatures written before sector sizes were modelled.
	Sector int `json:"sector,omitempty"`
}

func (s *Signature) sector() int {
	if s.Sector == 0 {
		return device.LegacyBlockSize
	}
	return s.Sector
}

// ReadSignature returns the signature at the start of an image file or
// device; nil if it has none (blank, or data blkid would not recognise).
func ReadSignature(path string) (*Signature, error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	return readSig(file)
}

// WriteSignature plants a signature of type typ at the start of an image
// file, as mkfs, mkswap or a partitioning tool would.
func WriteSignature(path, typ string) error {
	file, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer file.Close()
	return writeSig(file, &Signature{Type: typ, UUID: newUUID()})
}

func readSig(file *os.File) (*Signature, error) {
	buf := make([]byte, 4096)
	n, err := file.ReadAt(buf, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	rest, ok := bytes.CutPrefix(buf[:n], []byte(magic))
	if !ok {
		return nil, nil
	}
	line, _, _ := bytes.Cut(rest, []byte("\n"))
	s := &Signature{}
	if err := json.Unmarshal(line, s); err != nil {
		return nil, fmt.Errorf("devicetest: corrupt signature: %w", err)
	}
	return s, nil
}

func writeSig(file *os.File, s *Signature) error {
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	buf := append([]byte(magic), b...)
	buf = append(buf, '\n')
	_, err = file.WriteAt(buf, 0)
	return err
}

func newUUID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// ---- helpers (callers hold f.mu, but for enter) ----

// enter counts a call of op and asks its injection, without holding f.mu:
// an injected function may block (holding the operation mid-way while
// others run) or call the fake itself.
func (f *Fake) enter(op Op, arg string) error {
	f.mu.Lock()
	f.calls[op]++
	fn := f.inject[op]
	f.mu.Unlock()
	if fn != nil {
		return fn(arg)
	}
	return nil
}

func loopNumber(dev string) (int, bool) {
	s, ok := strings.CutPrefix(dev, "/dev/loop")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil && n >= 0 && strconv.Itoa(n) == s
}

func devName(n int) string { return "/dev/loop" + strconv.Itoa(n) }

// name is the backing file as /sys shows it.
func (l *loop) name() string {
	var st unix.Stat_t
	if unix.Fstat(int(l.file.Fd()), &st) == nil && st.Nlink == 0 {
		return l.backing + " (deleted)"
	}
	return l.backing
}

func (f *Fake) attached(dev string) *loop {
	n, ok := loopNumber(dev)
	if !ok {
		return nil
	}
	return f.loops[n]
}

// top returns the topmost mount exactly at path.
func (f *Fake) top(path string) *mount {
	for i := len(f.mounts) - 1; i >= 0; i-- {
		if f.mounts[i].target == path {
			return f.mounts[i]
		}
	}
	return nil
}

// covering returns the mount whose filesystem path lies in (nil: the
// host's) and path's place relative to that mount's root.
func (f *Fake) covering(path string) (*mount, string) {
	for p := path; ; p = filepath.Dir(p) {
		if m := f.top(p); m != nil {
			rel, _ := filepath.Rel(p, path)
			return m, rel
		}
		if p == "/" || p == "." {
			return nil, path
		}
	}
}

func within(path, dir string) bool {
	return dir == "/" || strings.HasPrefix(path, dir+"/")
}

// release drops a superblock nothing holds any more, and detaches its loop
// device if a detach was asked for meanwhile.
func (f *Fake) release(sb *superblock) {
	if sb == nil || sb.frozen {
		return
	}
	for _, m := range f.mounts {
		if m.sb == sb {
			return
		}
	}
	for _, h := range f.handles {
		if h.sb == sb {
			return
		}
	}
	if f.sbs[sb.loop.n] == sb {
		delete(f.sbs, sb.loop.n)
	}
	if l := f.loops[sb.loop.n]; l == sb.loop && l.autoclear {
		f.detach(l)
	}
}

func (f *Fake) detach(l *loop) {
	l.file.Close()
	delete(f.loops, l.n)
}

func (f *Fake) sig(l *loop) (*Signature, error) { return readSig(l.file) }

// ---- Loops ----

func (f *Fake) AttachLoop(image string, opts device.LoopOptions) (string, error) {
	if err := f.enter(AttachLoop, image); err != nil {
		return "", err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	file, err := os.OpenFile(image, os.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("open image: %w", err)
	}
	fi, err := file.Stat()
	if err != nil {
		file.Close()
		return "", err
	}
	bs := opts.BlockSize
	if bs == 0 {
		bs = device.PoolBlockSize(image)
		if sig, err := readSig(file); err == nil && sig != nil && (sig.Type == "ext4" || sig.Type == "xfs") && sig.sector() < bs {
			bs = sig.sector()
		}
	}
	if bs < 512 || bs > 4096 || bs&(bs-1) != 0 {
		file.Close()
		return "", fmt.Errorf("attach %s: logical block size %d: want 512, 1024, 2048 or 4096", image, bs)
	}
	abs, _ := filepath.Abs(image)
	dio := opts.DirectIO && !f.noDirect[filepath.Dir(abs)]
	n := 0
	for f.loops[n] != nil {
		n++
	}
	f.loops[n] = &loop{n: n, backing: abs, file: file, size: fi.Size() &^ 511, io: device.LoopIO{DirectIO: dio, BlockSize: bs}}
	f.created[n] = true
	return devName(n), nil
}

func (f *Fake) LoopStatus(dev string) (device.LoopIO, error) {
	if err := f.enter(LoopStatus, dev); err != nil {
		return device.LoopIO{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.attached(dev)
	if l == nil {
		return device.LoopIO{}, fmt.Errorf("%s is not an attached loop device: %w", dev, unix.ENOENT)
	}
	return l.io, nil
}

func (f *Fake) DetachLoop(dev, backing string) error {
	if err := f.enter(DetachLoop, dev); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.attached(dev)
	if backing == "" || l == nil || l.name() != backing {
		return nil
	}
	if f.sbs[l.n] != nil {
		l.autoclear = true
		return fmt.Errorf("%s (%s) is still held open by another process: it detaches when that process lets go; retry", dev, backing)
	}
	f.detach(l)
	return nil
}

func (f *Fake) LoopDevices() (map[string]string, error) {
	if err := f.enter(LoopDevices, ""); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]string{}
	for n, l := range f.loops {
		out[devName(n)] = l.name()
	}
	return out, nil
}

func (f *Fake) LoopsFor(image string) ([]string, error) {
	if err := f.enter(LoopsFor, image); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, n := range sortedKeys(f.loops) {
		if f.loops[n].name() == image {
			out = append(out, devName(n))
		}
	}
	return out, nil
}

func (f *Fake) LoopBackingFile(dev string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if l := f.attached(dev); l != nil {
		return l.name()
	}
	return ""
}

// LoopServes compares paths: the fake has one mount namespace, where a
// loop's backing path is the image's.
func (f *Fake) LoopServes(dev, image string) bool {
	if f.enter(LoopServes, dev) != nil {
		return false
	}
	return f.LoopBackingFile(dev) == filepath.Clean(image)
}

func (f *Fake) LoopSetCapacity(dev string) error {
	if err := f.enter(LoopSetCapacity, dev); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.attached(dev)
	if l == nil {
		return fmt.Errorf("refresh size of %s: %w", dev, unix.ENXIO)
	}
	fi, err := l.file.Stat()
	if err != nil {
		return err
	}
	l.size = fi.Size() &^ 511
	return nil
}

func (f *Fake) DeviceSize(dev string) (int64, error) {
	if err := f.enter(DeviceSize, dev); err != nil {
		return 0, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	n, ok := loopNumber(dev)
	if !ok || !f.created[n] {
		return 0, &os.PathError{Op: "open", Path: dev, Err: unix.ENOENT}
	}
	if l := f.loops[n]; l != nil {
		return l.size, nil
	}
	return 0, nil // a free loop device is 0 bytes long
}

func (f *Fake) DeviceNodeOf(path, dev string) error {
	if err := f.enter(DeviceNodeOf, path); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	n, ok := loopNumber(dev)
	if !ok || !f.created[n] {
		return &os.PathError{Op: "stat", Path: dev, Err: unix.ENOENT}
	}
	// A device node is the device itself or a device bound onto a file.
	path = filepath.Clean(path)
	if path == devName(n) {
		return nil
	}
	if m := f.top(path); m != nil && m.fsType == "devtmpfs" && m.root == "/loop"+strconv.Itoa(n) {
		return nil
	}
	return fmt.Errorf("%s is not a device node of %s: %w", path, dev, device.ErrNotMounted)
}

func (f *Fake) SyncDevice(dev string) error {
	if err := f.enter(SyncDevice, dev); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if n, ok := loopNumber(dev); !ok || !f.created[n] {
		return &os.PathError{Op: "open", Path: dev, Err: unix.ENOENT}
	}
	return nil
}

// ---- Mounts ----

func (f *Fake) Mount(ctx context.Context, source, target, fsType string, options []string) error {
	if err := f.enter(Mount, target); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	source, target = filepath.Clean(source), filepath.Clean(target)
	fail := func(format string, a ...any) error {
		return fmt.Errorf("mount %s on %s: "+format, append([]any{source, target}, a...)...)
	}
	tfi, err := os.Stat(target)
	if err != nil {
		return fail("mount point does not exist: %w", err)
	}
	var opts []string
	bind := false
	for _, o := range options {
		switch o {
		case "bind":
			bind = true
		case "remount", "rbind", "move":
			return fail("devicetest does not model %q", o)
		default:
			opts = append(opts, o)
		}
	}
	perMount := mountOptions(opts)
	m := &mount{target: target, options: perMount}
	switch {
	case bind:
		if n, isDev := loopNumber(source); isDev {
			if !f.created[n] {
				return fail("special device %s does not exist", source)
			}
			if !tfi.Mode().IsRegular() {
				return fail("a device node binds onto a file: %w", unix.ENOTDIR)
			}
			m.source, m.fsType, m.root = "devtmpfs", "devtmpfs", "/loop"+strconv.Itoa(n)
			break
		}
		// A device node bound onto a file binds on again, as kubelet
		// does from a block volume's publish path to its map path.
		if under := f.top(source); under != nil && under.fsType == "devtmpfs" {
			if !tfi.Mode().IsRegular() {
				return fail("a device node binds onto a file: %w", unix.ENOTDIR)
			}
			m.source, m.fsType, m.root = under.source, under.fsType, under.root
			break
		}
		sfi, err := os.Stat(source)
		if err != nil {
			return fail("%w", err)
		}
		if !sfi.IsDir() || !tfi.IsDir() {
			return fail("devicetest binds directories onto directories only")
		}
		// A bind shows the filesystem the source lies in, and the
		// source's place in it; outside any fake mount, that is the
		// host's own filesystem.
		under, rel := f.covering(source)
		switch {
		case under == nil:
			m.source, m.fsType, m.root = hostSource, "hostfs", source
		case under.fsType == "devtmpfs":
			return fail("%w", unix.ENOTDIR)
		default:
			m.source, m.fsType, m.sb = under.source, under.fsType, under.sb
			m.root = filepath.Join(under.root, rel)
		}
	default:
		l := f.attached(source)
		if l == nil {
			return fail("special device %s does not exist", source)
		}
		if !tfi.IsDir() {
			return fail("%w", unix.ENOTDIR)
		}
		if fsType != "ext4" && fsType != "xfs" {
			return fail("unknown filesystem type %q", fsType)
		}
		sb := f.sbs[l.n]
		if sb == nil {
			sig, err := f.sig(l)
			if err != nil {
				return fail("%w", err)
			}
			if sig == nil || sig.Type != fsType {
				return fail("wrong fs type, bad option, bad superblock on %s, missing codepage or helper program, or other error", source)
			}
			if sig.Size > l.size {
				return fail("bad geometry: the filesystem is %d bytes, the device %d", sig.Size, l.size)
			}
			if sig.sector() < l.io.BlockSize {
				return fail("device supports %d byte sectors (not %d): %w", l.io.BlockSize, sig.sector(), unix.ENOSYS)
			}
			if fsType == "xfs" && !slices.Contains(opts, "nouuid") {
				for _, other := range f.sbs {
					if other.fsType == "xfs" && other.uuid == sig.UUID {
						return fail("Filesystem has duplicate UUID %s - can't mount", sig.UUID)
					}
				}
			}
			sb = &superblock{loop: l, fsType: fsType, uuid: sig.UUID, size: sig.Size}
			f.sbs[l.n] = sb
		} else if sb.fsType != fsType {
			return fail("%s is already mounted as %s", source, sb.fsType)
		}
		m.source, m.fsType, m.root, m.sb = source, fsType, "/", sb
	}
	f.nextID++
	m.id = f.nextID
	f.mounts = append(f.mounts, m)
	return nil
}

// mountOptions is what /proc/self/mountinfo shows of a mount's own flags.
func mountOptions(opts []string) []string {
	out := []string{"rw"}
	if slices.Contains(opts, "ro") {
		out[0] = "ro"
	}
	for _, o := range []string{"nosuid", "nodev", "noexec", "noatime", "nodiratime", "strictatime", "lazytime"} {
		if slices.Contains(opts, o) {
			out = append(out, o)
		}
	}
	if !slices.Contains(out, "noatime") && !slices.Contains(out, "strictatime") {
		out = append(out, "relatime")
	}
	return out
}

func (f *Fake) Unmount(target string) error {
	if err := f.enter(Unmount, target); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	target = filepath.Clean(target)
	for {
		m := f.top(target)
		if m == nil {
			return nil // EINVAL or ENOENT: not mounted, which is done
		}
		for _, o := range f.mounts {
			if o.id > m.id && within(o.target, target) {
				return fmt.Errorf("unmount %s: %w (%s is mounted beneath it)", target, unix.EBUSY, o.target)
			}
		}
		for _, h := range f.handles {
			if h.mountID == m.id {
				return fmt.Errorf("unmount %s: %w (a descriptor is open on it)", target, unix.EBUSY)
			}
		}
		f.mounts = slices.DeleteFunc(f.mounts, func(o *mount) bool { return o == m })
		f.release(m.sb)
	}
}

func (f *Fake) MountedAt(path string) (*device.MountAt, error) {
	if err := f.enter(MountedAt, path); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	m := f.top(filepath.Clean(path))
	if m == nil {
		return nil, nil
	}
	super := "rw"
	if m.sb != nil && m.sb.ro {
		super = "ro"
	}
	return &device.MountAt{Source: m.source, Root: m.root, FsType: m.fsType, Options: strings.Join(m.options, ","), Super: super}, nil
}

func (f *Fake) MountsOf(dev string) ([]string, error) {
	if err := f.enter(MountsOf, dev); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, m := range f.mounts {
		if m.source == dev {
			out = append(out, m.target)
		}
	}
	return out, nil
}

// onDevice finds the mount at path if it is the root of a mount of dev's
// filesystem, with the errors device.OpenFilesystemOn gives.
func (f *Fake) onDevice(path, dev string) (*mount, error) {
	path = filepath.Clean(path)
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		return nil, fmt.Errorf("open %s: %w", path, unix.ELOOP)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("open %s: %w", path, unix.ENOTDIR)
	}
	n, ok := loopNumber(dev)
	if !ok || !f.created[n] {
		return nil, fmt.Errorf("stat %s: %w", dev, unix.ENOENT)
	}
	sb := f.sbs[n]
	m, rel := f.covering(path)
	switch {
	case m == nil || m.sb == nil || m.sb != sb:
		return nil, fmt.Errorf("%s is not on %s: %w", path, dev, device.ErrNotMounted)
	case rel != ".":
		return nil, fmt.Errorf("%s is a directory inside the filesystem on %s, not its mount: %w", path, dev, device.ErrNotMounted)
	}
	return m, nil
}

func (f *Fake) MountedFrom(path, dev string) error {
	if err := f.enter(MountedFrom, path); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	_, err := f.onDevice(path, dev)
	return err
}

func (f *Fake) OpenFilesystemOn(path, dev string) (device.Filesystem, error) {
	if err := f.enter(OpenFilesystemOn, path); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	m, err := f.onDevice(path, dev)
	if err != nil {
		return nil, err
	}
	f.nextID++
	h := &handle{f: f, id: f.nextID, sb: m.sb, mountID: m.id, dev: dev}
	f.handles[h.id] = h
	return h, nil
}

// handle is an open descriptor of a mount's root.
type handle struct {
	f       *Fake
	id      int
	sb      *superblock
	mountID int
	dev     string
	closed  bool
}

func (h *handle) Freeze() error {
	f := h.f
	if err := f.enter(Freeze, h.dev); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if h.closed {
		return fmt.Errorf("freeze: %w", unix.EBADF)
	}
	if h.sb.frozen {
		return fmt.Errorf("freeze %s: %w", h.dev, unix.EBUSY)
	}
	h.sb.frozen, h.sb.frozenBy = true, h.id
	f.freezeLog = append(f.freezeLog, FreezeEvent{Dev: devName(h.sb.loop.n), Handle: h.id})
	return nil
}

func (h *handle) Thaw() error {
	f := h.f
	if err := f.enter(Thaw, h.dev); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if h.closed {
		return fmt.Errorf("thaw: %w", unix.EBADF)
	}
	if !h.sb.frozen {
		return nil // EINVAL, which device.Thaw takes as done
	}
	h.sb.frozen = false
	f.freezeLog = append(f.freezeLog, FreezeEvent{Thaw: true, Dev: devName(h.sb.loop.n), Handle: h.id})
	return nil
}

// Trim discards nothing the fake could show (it does not model which
// blocks a filesystem uses): it checks the handle and counts the call.
func (h *handle) Trim() (int64, error) {
	f := h.f
	if err := f.enter(Trim, h.dev); err != nil {
		return 0, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if h.closed {
		return 0, fmt.Errorf("trim: %w", unix.EBADF)
	}
	return 0, nil
}

func (h *handle) Close() error {
	f := h.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if h.closed {
		return os.ErrClosed
	}
	h.closed = true
	delete(f.handles, h.id)
	f.release(h.sb)
	return nil
}

func (f *Fake) Statfs(path string) (device.FSStats, error) {
	if err := f.enter(Statfs, path); err != nil {
		return device.FSStats{}, err
	}
	f.mu.Lock()
	m, _ := f.covering(filepath.Clean(path))
	if m == nil || m.fsType == "hostfs" {
		f.mu.Unlock()
		return device.Statfs(path)
	}
	defer f.mu.Unlock()
	if m.sb == nil {
		return device.FSStats{}, nil // devtmpfs
	}
	if m.sb.shutdown {
		return device.FSStats{}, fmt.Errorf("statfs %s: %w", path, unix.EIO)
	}
	inodes := m.sb.size / 16384
	return device.FSStats{TotalBytes: m.sb.size, AvailableBytes: m.sb.size, TotalInodes: inodes, FreeInodes: inodes}, nil
}

func (f *Fake) ReadableRoot(path string) error {
	if err := f.enter(ReadableRoot, path); err != nil {
		return err
	}
	f.mu.Lock()
	m, _ := f.covering(filepath.Clean(path))
	if m == nil || m.sb == nil {
		f.mu.Unlock()
		return device.ReadableRoot(path)
	}
	defer f.mu.Unlock()
	if m.sb.shutdown {
		return fmt.Errorf("readdir %s: %w", path, unix.EIO)
	}
	return nil
}

func (f *Fake) SetGroup(root string, gid int, onRootMismatch bool) error {
	if err := f.enter(SetGroup, root); err != nil {
		return err
	}
	f.mu.Lock()
	m, _ := f.covering(filepath.Clean(root))
	if m == nil || m.sb == nil {
		f.mu.Unlock()
		return device.SetGroup(root, gid, onRootMismatch)
	}
	defer f.mu.Unlock()
	switch {
	case m.sb.frozen:
		return fmt.Errorf("chown %s: %w", root, ErrWouldBlock)
	case m.options[0] == "ro" || m.sb.ro:
		return fmt.Errorf("chown %s: %w", root, unix.EROFS)
	}
	sig, err := f.sig(m.sb.loop)
	if err != nil || sig == nil {
		return fmt.Errorf("chown %s: %w", root, unix.EIO)
	}
	if onRootMismatch && sig.Group == gid && sig.Setgid {
		return nil
	}
	sig.Group, sig.Setgid = gid, true
	return writeSig(m.sb.loop.file, sig)
}

// ---- Tools ----

func (f *Fake) Probe(ctx context.Context, dev string) (string, error) {
	if err := f.enter(Probe, dev); err != nil {
		return "", err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var sig *Signature
	var err error
	if _, isDev := loopNumber(dev); isDev {
		l := f.attached(dev)
		if l == nil {
			return "", fmt.Errorf("blkid -p -o export %s: %w", dev, unix.ENXIO)
		}
		sig, err = f.sig(l)
	} else {
		sig, err = ReadSignature(dev)
	}
	if err != nil {
		return "", fmt.Errorf("blkid -p -o export %s: %w", dev, err)
	}
	if sig == nil {
		return "", nil
	}
	return sig.Type, nil
}

// tool finds the attached, unmounted device a disk tool works on.
func (f *Fake) tool(name, dev string) (*loop, error) {
	l := f.attached(dev)
	if l == nil {
		return nil, fmt.Errorf("%s %s: %w", name, dev, unix.ENXIO)
	}
	if f.sbs[l.n] != nil {
		return nil, fmt.Errorf("%s %s: %s is mounted; will not work on it", name, dev, dev)
	}
	return l, nil
}

func (f *Fake) Format(ctx context.Context, dev, fsType string) error {
	if err := f.enter(Format, dev); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if fsType != "ext4" && fsType != "xfs" {
		return fmt.Errorf("unsupported filesystem %q", fsType)
	}
	if _, isDev := loopNumber(dev); !isDev {
		// mkfs on an image file, as the pool does when it creates a volume.
		for _, l := range f.loops {
			if l != nil && l.backing == dev && f.sbs[l.n] != nil {
				return fmt.Errorf("mkfs.%s %s: %s is mounted; will not make a filesystem here", fsType, dev, dev)
			}
		}
		file, err := os.OpenFile(dev, os.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("mkfs.%s %s: %w", fsType, dev, err)
		}
		defer file.Close()
		fi, err := file.Stat()
		if err != nil {
			return err
		}
		if fsType == "xfs" && fi.Size() < 300<<20 {
			return fmt.Errorf("mkfs.xfs %s: Filesystem must be larger than 300MB", dev)
		}
		return writeSig(file, &Signature{Type: fsType, UUID: newUUID(), Size: fi.Size() &^ 511, Sector: sectorFor(fsType, device.PoolBlockSize(dev))})
	}
	l, err := f.tool("mkfs."+fsType, dev)
	if err != nil {
		return err
	}
	if fsType == "xfs" && l.size < 300<<20 {
		return fmt.Errorf("mkfs.xfs %s: Filesystem must be larger than 300MB", dev)
	}
	return writeSig(l.file, &Signature{Type: fsType, UUID: newUUID(), Size: l.size, Sector: sectorFor(fsType, l.io.BlockSize)})
}

// sectorFor is the sector size device.Format gives a filesystem made on a
// device (or for a pool) of logical block size bs.
func sectorFor(fsType string, bs int) int {
	if fsType == "ext4" {
		return 4096
	}
	return bs
}

func (f *Fake) FsckIfNeeded(ctx context.Context, dev, fsType string) error {
	if err := f.enter(FsckIfNeeded, dev); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if fsType != "ext4" {
		return nil
	}
	l, err := f.tool("e2fsck -p", dev)
	if err != nil {
		return err
	}
	if sig, err := f.sig(l); err != nil || sig == nil || sig.Type != "ext4" {
		return fmt.Errorf("e2fsck -p %s: Bad magic number in super-block", dev)
	}
	return nil
}

func (f *Fake) GrowOffline(ctx context.Context, dev string) error {
	if err := f.enter(GrowOffline, dev); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	l, err := f.tool("e2fsck -f -p", dev)
	if err != nil {
		return err
	}
	sig, err := f.sig(l)
	if err != nil || sig == nil || sig.Type != "ext4" {
		return fmt.Errorf("e2fsck -f -p %s: Bad magic number in super-block", dev)
	}
	sig.Size = l.size
	return writeSig(l.file, sig)
}

func (f *Fake) GrowOnline(ctx context.Context, fsType, dev, mountPath string) error {
	if err := f.enter(GrowOnline, dev); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	m, err := f.onDevice(mountPath, dev)
	if err != nil {
		return fmt.Errorf("grow %s at %s: %w", dev, mountPath, err)
	}
	sb := m.sb
	switch {
	case fsType != sb.fsType || (fsType != "xfs" && fsType != "ext4"):
		return fmt.Errorf("cannot grow %s", fsType)
	case sb.frozen:
		return fmt.Errorf("grow %s: %w", mountPath, ErrWouldBlock)
	case fsType == "ext4" && f.noOnlineFs:
		return fmt.Errorf("resize2fs %s: Permission denied to resize filesystem (online growth of a mounted ext4 needs CAP_SYS_RESOURCE, which this process lacks)", dev)
	}
	sig, err := f.sig(sb.loop)
	if err != nil || sig == nil {
		return fmt.Errorf("grow %s: %w", dev, unix.EIO)
	}
	sb.size, sig.Size = sb.loop.size, sb.loop.size
	return writeSig(sb.loop.file, sig)
}

func (f *Fake) Ext4Errors(dev string) (int, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, _ := loopNumber(dev)
	if sb := f.sbs[n]; sb != nil && sb.fsType == "ext4" {
		return sb.errCount, sb.errFunc
	}
	return 0, ""
}

// ---- Images ----

func (f *Fake) CanReflink(dir string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reflink
}

func (f *Fake) CopyImage(src, dst string, size int64, reflink bool) error {
	if err := f.enter(CopyImage, src); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if reflink && !f.reflink {
		return fmt.Errorf("reflink %s: %w", filepath.Base(src), unix.EOPNOTSUPP)
	}
	consistent := true
	var st unix.Stat_t
	if unix.Stat(src, &st) == nil {
		for _, sb := range f.sbs {
			var lst unix.Stat_t
			if unix.Fstat(int(sb.loop.file.Fd()), &lst) == nil && lst.Dev == st.Dev && lst.Ino == st.Ino &&
				!sb.frozen && !sb.ro && f.writable(sb) {
				consistent = false
			}
		}
	}
	// The copy itself is real; a reflink is played by a sparse copy, which
	// gives the same bytes on any filesystem the tests run on.
	if err := device.CopyImage(src, dst, size, false); err != nil {
		return err
	}
	f.copies = append(f.copies, Copy{Src: src, Dst: dst, Consistent: consistent})
	return nil
}

// writable reports whether a superblock has a read-write mount.
func (f *Fake) writable(sb *superblock) bool {
	for _, m := range f.mounts {
		if m.sb == sb && m.options[0] == "rw" {
			return true
		}
	}
	return false
}

func (f *Fake) GrowFile(path string, size int64) error {
	if err := f.enter(GrowFile, path); err != nil {
		return err
	}
	return device.GrowFile(path, size)
}
