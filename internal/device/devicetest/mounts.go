package devicetest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/podvol/podvol/internal/device"
)

// Mounts (device.Mounts, but for the freeze handle: freeze.go).

func (f *Fake) Mount(ctx context.Context, source, target, fsType string, options []string) error {
	if err := f.enter(Mount, target); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	source, target = filepath.Clean(source), filepath.Clean(target)
	fail := func(err error) error { return fmt.Errorf("mount %s on %s: %w", source, target, err) }
	tfi, err := os.Stat(target)
	if err != nil {
		return fail(fmt.Errorf("mount point does not exist: %w", err))
	}
	var opts []string
	bind := false
	for _, o := range options {
		switch o {
		case "bind":
			bind = true
		case "remount", "rbind", "move":
			return fail(fmt.Errorf("devicetest does not model %q", o))
		default:
			opts = append(opts, o)
		}
	}
	perMount := mountOptions(opts)
	m := &mount{target: target, options: perMount}
	if bind {
		err = f.bindOnto(m, source, tfi)
	} else {
		err = f.mountDevice(m, source, fsType, opts, tfi)
	}
	if err != nil {
		return fail(err)
	}
	f.nextID++
	m.id = f.nextID
	f.mounts = append(f.mounts, m)
	return nil
}

// bindOnto fills in m, a bind mount of source onto a target whose FileInfo
// is tfi: a loop device node, a device node already bound, or a directory.
func (f *Fake) bindOnto(m *mount, source string, tfi os.FileInfo) error {
	if n, isDev := loopNumber(source); isDev {
		if !f.created[n] {
			return fmt.Errorf("special device %s does not exist", source)
		}
		if !tfi.Mode().IsRegular() {
			return fmt.Errorf("a device node binds onto a file: %w", unix.ENOTDIR)
		}
		m.source, m.fsType, m.root = "devtmpfs", "devtmpfs", "/loop"+strconv.Itoa(n)
		return nil
	}
	// A device node bound onto a file binds on again, as kubelet
	// does from a block volume's publish path to its map path.
	if under := f.top(source); under != nil && under.fsType == "devtmpfs" {
		if !tfi.Mode().IsRegular() {
			return fmt.Errorf("a device node binds onto a file: %w", unix.ENOTDIR)
		}
		m.source, m.fsType, m.root = under.source, under.fsType, under.root
		return nil
	}
	sfi, err := os.Stat(source)
	if err != nil {
		return err
	}
	if !sfi.IsDir() || !tfi.IsDir() {
		return errors.New("devicetest binds directories onto directories only")
	}
	// A bind shows the filesystem the source lies in, and the
	// source's place in it; outside any fake mount, that is the
	// host's own filesystem.
	under, rel := f.covering(source)
	switch {
	case under == nil:
		m.source, m.fsType, m.root = hostSource, "hostfs", source
	case under.fsType == "devtmpfs":
		return unix.ENOTDIR
	default:
		m.source, m.fsType, m.sb = under.source, under.fsType, under.sb
		m.root = filepath.Join(under.root, rel)
	}
	return nil
}

// mountDevice fills in m, a mount of the filesystem on loop device source,
// sharing the superblock of any other mount of that device.
func (f *Fake) mountDevice(m *mount, source, fsType string, opts []string, tfi os.FileInfo) error {
	l := f.attached(source)
	if l == nil {
		return fmt.Errorf("special device %s does not exist", source)
	}
	if !tfi.IsDir() {
		return unix.ENOTDIR
	}
	if fsType != "ext4" && fsType != "xfs" {
		return fmt.Errorf("unknown filesystem type %q", fsType)
	}
	sb := f.sbs[l.n]
	if sb == nil {
		sig, err := f.sig(l)
		if err != nil {
			return err
		}
		if sig == nil || sig.Type != fsType {
			return fmt.Errorf("wrong fs type, bad option, bad superblock on %s, missing codepage or helper program, or other error", source)
		}
		if sig.Size > l.size {
			return fmt.Errorf("bad geometry: the filesystem is %d bytes, the device %d", sig.Size, l.size)
		}
		if sig.sector() < l.io.BlockSize {
			return fmt.Errorf("device supports %d byte sectors (not %d): %w", l.io.BlockSize, sig.sector(), unix.ENOSYS)
		}
		if fsType == "xfs" && !slices.Contains(opts, "nouuid") {
			for _, other := range f.sbs {
				if other.fsType == "xfs" && other.uuid == sig.UUID {
					// xfs's own words, capital and all.
					return errors.New("Filesystem has duplicate UUID " + sig.UUID + " - can't mount")
				}
			}
		}
		sb = &superblock{loop: l, fsType: fsType, uuid: sig.UUID, size: sig.Size}
		f.sbs[l.n] = sb
	} else if sb.fsType != fsType {
		return fmt.Errorf("%s is already mounted as %s", source, sb.fsType)
	}
	m.source, m.fsType, m.root, m.sb = source, fsType, "/", sb
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
