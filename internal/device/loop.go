// Package device acts on the machine: loop devices, filesystems and mounts.
// It is the only podvol package that issues syscalls with side effects or runs
// external commands, so that everything above it can be reasoned about as
// bookkeeping. The packages above take it as an Interface (Host is this
// machine), so that their tests can run against the in-memory fake in
// internal/device/devicetest, without root.
package device

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

const loopControl = "/dev/loop-control"

// LoopOptions say how AttachLoop sets a loop device up.
type LoopOptions struct {
	// DirectIO makes the device read and write its image with direct I/O
	// (LO_FLAGS_DIRECT_IO), bypassing the host's page cache: the volume's
	// filesystem caches its data once, charged to the pod that uses it,
	// instead of a second time in the host's cache of the image, charged
	// to nobody. Where the pool's filesystem refuses direct I/O (ramfs, a
	// FUSE filesystem, a block size below what the pool's filesystem
	// aligns direct I/O to), the device is attached buffered instead:
	// LoopStatus tells which it got.
	DirectIO bool
	// BlockSize is the device's logical block size: 512, 1024, 2048 or
	// 4096. 0 chooses (ChooseBlockSize): the pool's block size, lowered to
	// what a filesystem already on the image was made for.
	BlockSize int
	// Tag is the name the kernel keeps with the device for as long as it
	// is attached (lo_file_name, at most LoopTagMax bytes), read back by
	// LoopTag; empty: the image's path, cut to fit, as losetup does. It is
	// what identifies the owner of a device whose backing file was
	// deleted: that file's path and inode are gone, and the path the
	// kernel reports for it is the same for every mount namespace that
	// had a file there. /sys reports the backing file from the file
	// itself, not from this name.
	Tag string
}

// LoopTagMax is the longest LoopOptions.Tag: lo_file_name's 64 bytes, less
// the NUL the kernel keeps at its end.
const LoopTagMax = unix.LO_NAME_SIZE - 1

// LoopIO is how an attached loop device does its I/O.
type LoopIO struct {
	DirectIO  bool
	BlockSize int
}

// LegacyBlockSize is the logical block size loop devices have by default,
// and had in podvol before it chose one: what a raw block volume's consumer
// has seen and may depend on (a partition table addresses 512-byte sectors).
const LegacyBlockSize = 512

// maxBlockSize is the largest logical block size a loop device takes on
// every kernel podvol runs on (a page).
const maxBlockSize = 4096

// PoolBlockSize returns the logical block size that suits a loop device over
// the file (or directory) at path: its filesystem's block size, so that the
// device's I/O is never a fraction of a block of the pool's filesystem (a
// sub-block direct write is serialised and zero-filled there), capped at a
// page, and at least the alignment that filesystem requires of direct I/O
// (a 4Kn disk's). 512 when the filesystem tells neither.
func PoolBlockSize(path string) int {
	bs := LegacyBlockSize
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err == nil && validBlockSize(int(fs.Bsize)) {
		bs = int(fs.Bsize)
	} else if err == nil && fs.Bsize > maxBlockSize {
		bs = maxBlockSize
	}
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, 0, unix.STATX_DIOALIGN, &stx); err == nil && stx.Mask&unix.STATX_DIOALIGN != 0 {
		if a := int(stx.Dio_offset_align); a > bs && validBlockSize(a) {
			bs = a
		}
	}
	return bs
}

func validBlockSize(bs int) bool {
	return bs >= 512 && bs <= maxBlockSize && bs&(bs-1) == 0
}

// ChooseBlockSize returns the logical block size for a loop device over
// image: the pool's (PoolBlockSize), unless a filesystem on the image was
// made for smaller sectors. Such a filesystem cannot be mounted on a device
// with larger ones: xfs refuses a device whose logical block size exceeds
// its sector size ("device supports 4096 byte sectors (not 512)"), ext4 one
// that exceeds its block size. podvol made xfs with 512-byte sectors and
// small ext4 with 1 KiB blocks before it chose a block size, and a snapshot,
// clone or restore carries its source's filesystem.
func ChooseBlockSize(image string) (int, error) {
	bs := PoolBlockSize(image)
	fsMax, err := FilesystemBlockLimit(image)
	if err != nil {
		return 0, err
	}
	if fsMax != 0 && fsMax < bs {
		bs = fsMax
	}
	return bs, nil
}

// FilesystemBlockLimit reads the superblock at the start of image (or of a
// block device) and returns the largest logical block size a device may
// have for that filesystem to mount: an xfs's sector size, an ext4's block
// size. 0 when it finds neither: no filesystem (yet), or one podvol does not
// make.
func FilesystemBlockLimit(image string) (int, error) {
	f, err := os.OpenFile(image, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("read the superblock of %s: %w", image, err)
	}
	defer f.Close()
	var sb [2048]byte
	n, err := f.ReadAt(sb[:], 0)
	if n < len(sb) {
		if n == 0 && err != nil && !errors.Is(err, io.EOF) {
			return 0, fmt.Errorf("read the superblock of %s: %w", image, err)
		}
		return 0, nil
	}
	// xfs: "XFSB" at 0, sb_sectsize (big endian) at 102.
	if string(sb[0:4]) == "XFSB" {
		if ss := int(binary.BigEndian.Uint16(sb[102:104])); validBlockSize(ss) || ss > maxBlockSize {
			return min(ss, maxBlockSize), nil
		}
		return 0, nil
	}
	// ext2/3/4: the superblock at 1024, s_magic 0xEF53 at 56 in it,
	// s_log_block_size at 24 (block size = 1024 << it).
	if binary.LittleEndian.Uint16(sb[1024+56:]) == 0xEF53 {
		if lg := binary.LittleEndian.Uint32(sb[1024+24:]); lg <= 6 {
			return min(1024<<lg, maxBlockSize), nil
		}
	}
	return 0, nil
}

// AttachLoop attaches image to a free loop device, set up as opts say, and
// returns the device path. The image is opened without following symlinks
// so that a link planted in the pool cannot redirect I/O to a file outside
// it. A refusal of direct I/O is not an error: the device is attached
// buffered, as LoopStatus then shows.
func AttachLoop(image string, opts LoopOptions) (string, error) {
	bs := opts.BlockSize
	if bs == 0 {
		var err error
		if bs, err = ChooseBlockSize(image); err != nil {
			return "", err
		}
	}
	if !validBlockSize(bs) {
		return "", fmt.Errorf("attach %s: logical block size %d: want 512, 1024, 2048 or 4096", image, bs)
	}
	if len(opts.Tag) > LoopTagMax {
		return "", fmt.Errorf("attach %s: tag %q is longer than %d bytes", image, opts.Tag, LoopTagMax)
	}
	img, err := os.OpenFile(image, os.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("open image: %w", err)
	}
	defer img.Close()

	ctl, err := os.OpenFile(loopControl, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("open %s (is the loop module loaded?): %w", loopControl, err)
	}
	defer ctl.Close()

	// LOOP_CTL_GET_FREE and LOOP_CONFIGURE are two steps: another process
	// (losetup, a second plugin) may take the device in between, which shows
	// as EBUSY. Retry with a fresh device.
	var lastErr error
	for attempt := 0; attempt < 20; attempt++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", fmt.Errorf("find a free loop device: %w", err)
		}
		dev := fmt.Sprintf("/dev/loop%d", n)
		lf, err := openLoopNode(dev, n)
		if err != nil {
			return "", err
		}
		err = configureLoop(lf, img, image, opts.Tag, bs, opts.DirectIO)
		lf.Close()
		if err == nil {
			return dev, nil
		}
		if !errors.Is(err, unix.EBUSY) {
			return "", fmt.Errorf("configure %s for %s: %w", dev, image, err)
		}
		lastErr = err
		time.Sleep(time.Duration(attempt+1) * 5 * time.Millisecond)
	}
	return "", fmt.Errorf("attach %s: every free loop device was taken concurrently: %w", image, lastErr)
}

// loopConfigure is LOOP_CONFIGURE; tests replace it to take the path of a
// kernel that lacks it.
var loopConfigure = unix.IoctlLoopConfigure

// configureLoop binds img to the loop device lf in one LOOP_CONFIGURE
// (Linux 5.8), with direct I/O if asked and the kernel grants it, else
// buffered. Kernels before 5.8 answer LOOP_CONFIGURE with EINVAL or ENOTTY;
// there the older ioctls do the same in steps.
func configureLoop(lf, img *os.File, name, tag string, bs int, directIO bool) error {
	cfg := unix.LoopConfig{Fd: uint32(img.Fd()), Size: uint32(bs)}
	copy(cfg.Info.File_name[:LoopTagMax], cmp.Or(tag, name))
	if directIO {
		cfg.Info.Flags = unix.LO_FLAGS_DIRECT_IO
		// A kernel that cannot do direct I/O on this file refuses the
		// whole configuration (EINVAL; older ones attach buffered and
		// say so in the flags): try again without.
		err := loopConfigure(int(lf.Fd()), &cfg)
		if err == nil || !(errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOTTY)) {
			return err
		}
		cfg.Info.Flags = 0
	}
	err := loopConfigure(int(lf.Fd()), &cfg)
	if err == nil || !(errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOTTY)) {
		return err
	}
	return configureLoopLegacy(lf, img, name, tag, bs, directIO)
}

// configureLoopLegacy is configureLoop for kernels without LOOP_CONFIGURE:
// bind, name, block size, then direct I/O, whose refusal leaves the device
// buffered. A failure after the bind unbinds again, so that no half-set-up
// device is left.
func configureLoopLegacy(lf, img *os.File, name, tag string, bs int, directIO bool) error {
	fd := int(lf.Fd())
	if err := unix.IoctlSetInt(fd, unix.LOOP_SET_FD, int(img.Fd())); err != nil {
		return fmt.Errorf("LOOP_SET_FD: %w", err)
	}
	undo := func(err error) error {
		_ = unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0)
		return err
	}
	info := unix.LoopInfo64{}
	copy(info.File_name[:LoopTagMax], cmp.Or(tag, name))
	if err := unix.IoctlLoopSetStatus64(fd, &info); err != nil {
		return undo(fmt.Errorf("LOOP_SET_STATUS64: %w", err))
	}
	if bs != LegacyBlockSize {
		if err := unix.IoctlSetInt(fd, unix.LOOP_SET_BLOCK_SIZE, bs); err != nil {
			return undo(fmt.Errorf("LOOP_SET_BLOCK_SIZE %d: %w", bs, err))
		}
	}
	if directIO {
		// EINVAL: the backing file cannot do direct I/O at this block
		// size; the device stays buffered.
		_ = unix.IoctlSetInt(fd, unix.LOOP_SET_DIRECT_IO, 1)
	}
	return nil
}

// LoopStatus returns how an attached loop device does its I/O.
func LoopStatus(dev string) (LoopIO, error) {
	name := filepath.Base(dev)
	dio, err := os.ReadFile(filepath.Join("/sys/block", name, "loop", "dio"))
	if err != nil {
		return LoopIO{}, fmt.Errorf("%s is not an attached loop device: %w", dev, err)
	}
	b, err := os.ReadFile(filepath.Join("/sys/block", name, "queue", "logical_block_size"))
	if err != nil {
		return LoopIO{}, fmt.Errorf("logical block size of %s: %w", dev, err)
	}
	bs, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return LoopIO{}, fmt.Errorf("logical block size of %s: %q", dev, b)
	}
	return LoopIO{DirectIO: strings.TrimSpace(string(dio)) == "1", BlockSize: bs}, nil
}

// openLoopNode opens the device node, creating it when /dev is not a devtmpfs
// (some container setups), where a new loop device has no node of its own.
func openLoopNode(dev string, n int) (*os.File, error) {
	f, err := os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0)
	if errors.Is(err, os.ErrNotExist) {
		if err := unix.Mknod(dev, unix.S_IFBLK|0o660, int(unix.Mkdev(7, uint32(n)))); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("create device node %s: %w", dev, err)
		}
		f, err = os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", dev, err)
	}
	return f, nil
}

// DetachLoop detaches dev if it still serves backing, the image it was
// found for: the kernel hands a loop number out again as soon as it is free,
// so a number listed a moment ago may now serve another process's file,
// which must be left alone. "Serves" is decided by the file's device and
// inode (LoopServes), never by the path the kernel reports: that path is the
// one in the mount namespace that attached the device, and another
// namespace (another node's plugin on the same kernel, as on the dev
// cluster) may have its own, different file at the very same path. Only a
// backing file that is gone, listed by LoopDevices with the suffix
// " (deleted)", has nothing left to compare but that report, which must
// then match exactly. A device that is free, or serves something else, is
// not an error, so that retries converge. A device that is still held
// (mounted) is detached by the kernel when its last user goes.
func DetachLoop(dev, backing string) error {
	if backing == "" {
		return nil
	}
	f, err := os.OpenFile(dev, os.O_RDONLY|unix.O_CLOEXEC, 0)
	// ENXIO: the device is being torn down by someone else right now.
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ENXIO) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open %s: %w", dev, err)
	}
	// While this descriptor is open, a device bound to backing stays bound
	// to it: a detach by anyone else only marks it to detach on the last
	// close, and a bound device cannot be attached again. So the check
	// below holds for the ioctl after it.
	serves := func() bool { return LoopServes(dev, backing) }
	if strings.HasSuffix(backing, deletedSuffix) {
		serves = func() bool { return LoopBackingFile(dev) == backing }
	}
	if !serves() {
		f.Close()
		return nil
	}
	err = unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0)
	f.Close()
	if err != nil && !errors.Is(err, unix.ENXIO) {
		return fmt.Errorf("detach %s from %s: %w", dev, backing, err)
	}
	// While anyone else holds the device open, the kernel only marks it
	// to detach on the last close. Wait for that, so that the caller does
	// not delete the image of a device that is still attached. Tools that
	// scan every loop device (a kubelet's losetup, blkid) open each for a
	// moment, which on a loaded machine has lasted over 2 s.
	for i := 0; i < 500 && serves(); i++ {
		time.Sleep(20 * time.Millisecond)
	}
	if serves() {
		return fmt.Errorf("%s (%s) is still held open by another process: it detaches when that process lets go; retry", dev, backing)
	}
	return nil
}

// deletedSuffix ends the path the kernel reports for a backing file that
// was deleted.
const deletedSuffix = " (deleted)"

// LoopDevices maps each attached loop device to its backing file, as the
// kernel reports it: the path in the mount namespace that attached it. A
// backing file that was deleted carries the suffix " (deleted)".
func LoopDevices() (map[string]string, error) {
	entries, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(entries))
	for _, e := range entries {
		b, err := os.ReadFile(e)
		if err != nil {
			continue // detached between the glob and the read
		}
		// Empty while the device is being torn down.
		if file := strings.TrimSuffix(string(b), "\n"); file != "" {
			out["/dev/"+filepath.Base(filepath.Dir(filepath.Dir(e)))] = file
		}
	}
	return out, nil
}

// LoopsFor returns the loop devices whose backing file is image, sorted. It
// compares device and inode numbers, not paths: the kernel reports a loop's
// backing file as a path in the mount namespace that attached it, and a
// plugin restarted in a new container sees the loops its predecessor
// attached under paths that are not its own (e.g. "/volumes/pv-….img").
func LoopsFor(image string) ([]string, error) {
	var st unix.Stat_t
	if err := unix.Stat(image, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, nil
		}
		return nil, fmt.Errorf("stat %s: %w", image, err)
	}
	all, err := LoopDevices()
	if err != nil {
		return nil, err
	}
	var devs []string
	base := filepath.Base(image)
	for dev, file := range all {
		// Whatever the namespace, the reported path ends in the image's
		// name: only those devices are opened and asked.
		if filepath.Base(file) != base {
			continue
		}
		if d, ino, err := LoopInode(dev); err == nil && d == st.Dev && ino == st.Ino {
			devs = append(devs, dev)
		}
	}
	sortDevs(devs)
	return devs, nil
}

// LoopServes tells whether loop device dev is backed by image (the same
// file, whatever path the kernel reports for it: see LoopsFor).
func LoopServes(dev, image string) bool {
	var st unix.Stat_t
	if err := unix.Stat(image, &st); err != nil {
		return false
	}
	d, ino, err := LoopInode(dev)
	return err == nil && d == st.Dev && ino == st.Ino
}

func sortDevs(devs []string) {
	num := func(d string) int {
		n, _ := strconv.Atoi(strings.TrimPrefix(d, "/dev/loop"))
		return n
	}
	for i := 1; i < len(devs); i++ {
		for j := i; j > 0 && num(devs[j]) < num(devs[j-1]); j-- {
			devs[j], devs[j-1] = devs[j-1], devs[j]
		}
	}
}

// LoopBackingFile returns the backing file of dev, or "" if dev is not an
// attached loop device.
func LoopBackingFile(dev string) string {
	name := filepath.Base(dev)
	b, err := os.ReadFile(filepath.Join("/sys/block", name, "loop", "backing_file"))
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(string(b), "\n")
}

// DeviceSize returns the size in bytes of a block device.
func DeviceSize(dev string) (int64, error) {
	f, err := os.OpenFile(dev, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var size uint64
	if err := ioctlPtr(f.Fd(), unix.BLKGETSIZE64, &size); err != nil {
		return 0, fmt.Errorf("size of %s: %w", dev, err)
	}
	return int64(size), nil
}

// DeviceNodeOf returns nil if path is a block device node of dev: the same
// device number, whatever the node's name. Kubelet asks for a raw block
// volume's stats at a device file of its own (the volume's global map path
// joined with the pod's UID), not at a path podvol published.
func DeviceNodeOf(path, dev string) error {
	var want, got unix.Stat_t
	if err := unix.Stat(dev, &want); err != nil {
		return fmt.Errorf("stat %s: %w", dev, err)
	}
	if err := unix.Stat(path, &got); err != nil {
		return fmt.Errorf("stat %s: %w", path, err)
	}
	if want.Mode&unix.S_IFMT != unix.S_IFBLK || got.Mode&unix.S_IFMT != unix.S_IFBLK || got.Rdev != want.Rdev {
		return fmt.Errorf("%s is not a device node of %s: %w", path, dev, ErrNotMounted)
	}
	return nil
}

// LoopTag returns the name dev was attached with (LoopOptions.Tag; the path
// a device attached without one was given, as by losetup), or "" if dev is
// not attached.
func LoopTag(dev string) string {
	f, err := os.OpenFile(dev, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return ""
	}
	defer f.Close()
	info, err := unix.IoctlLoopGetStatus64(int(f.Fd()))
	if err != nil {
		return ""
	}
	tag, _, _ := strings.Cut(string(info.File_name[:]), "\x00")
	return tag
}

// LoopInode returns the device and inode numbers of a loop device's backing
// file: unlike the path in /sys, they do not depend on the mount namespace
// that attached it.
func LoopInode(dev string) (device, inode uint64, err error) {
	f, err := os.OpenFile(dev, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	info, err := unix.IoctlLoopGetStatus64(int(f.Fd()))
	if err != nil {
		return 0, 0, err
	}
	return info.Device, info.Inode, nil
}
