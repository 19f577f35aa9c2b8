package devicetest

import (
	"errors"
	"os"
	"path/filepath"
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
	tag     string
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
