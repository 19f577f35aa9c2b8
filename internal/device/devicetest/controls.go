package devicetest

import (
	"fmt"
	"path/filepath"
	"slices"
	"sync"
)

// The test controls: failures to inject, switches, and what the fake
// remembers for tests to inspect.

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
