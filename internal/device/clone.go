package device

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// CanReflink reports whether files in dir can share extents (XFS with reflink,
// btrfs): a copy then costs the same whatever the size or data.
func CanReflink(dir string) bool {
	src, err := os.CreateTemp(dir, ".reflink-probe-")
	if err != nil {
		return false
	}
	defer os.Remove(src.Name())
	defer src.Close()
	if _, err := src.Write(make([]byte, 4096)); err != nil {
		return false
	}
	dst, err := os.CreateTemp(dir, ".reflink-probe-")
	if err != nil {
		return false
	}
	defer os.Remove(dst.Name())
	defer dst.Close()
	return unix.IoctlFileClone(int(dst.Fd()), int(src.Fd())) == nil
}

// CopyImage makes dst a copy of src, size bytes long (at least src's size).
// With reflink the copy shares src's extents; without, only src's data
// extents are copied, so holes stay holes. dst must not exist; on failure it
// is removed. Neither path is followed if it is a symlink.
func CopyImage(src, dst string, size int64, reflink bool) (err error) {
	in, err := os.OpenFile(src, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open source image: %w", err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("create image: %w", err)
	}
	defer func() {
		out.Close()
		if err != nil {
			os.Remove(dst)
		}
	}()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	if reflink {
		if err := unix.IoctlFileClone(int(out.Fd()), int(in.Fd())); err != nil {
			return fmt.Errorf("reflink %s: %w", filepath.Base(src), err)
		}
	} else if err := sparseCopy(in, out, fi.Size()); err != nil {
		return fmt.Errorf("copy %s: %w", filepath.Base(src), err)
	}
	if size > fi.Size() {
		if err := out.Truncate(size); err != nil {
			return err
		}
	}
	if err := out.Sync(); err != nil {
		return err
	}
	return SyncDir(filepath.Dir(dst))
}

// sparseCopy copies the data extents of in (found with SEEK_DATA/SEEK_HOLE)
// with copy_file_range, leaving holes as holes.
func sparseCopy(in, out *os.File, size int64) error {
	if err := out.Truncate(size); err != nil {
		return err
	}
	var off int64
	for off < size {
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // only a hole is left
		}
		if err != nil {
			return err
		}
		hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		for pos := data; pos < hole; {
			r, w := pos, pos
			n, err := unix.CopyFileRange(int(in.Fd()), &r, int(out.Fd()), &w, int(min(hole-pos, 1<<30)), 0)
			if err != nil {
				return err
			}
			if n == 0 {
				return io.ErrUnexpectedEOF
			}
			pos += int64(n)
		}
		off = hole
	}
	return nil
}

// SyncDir makes a directory's entries (a file created or renamed in it)
// durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Ioctl numbers of FIFREEZE/FITHAW (_IOWR('X', 119/120, int)).
const (
	fifreeze = 0xC0045877
	fithaw   = 0xC0045878
)

// OpenFilesystemOn opens the directory at path only if it is the root of a
// mount of the filesystem on block device dev, and returns it. Whatever is
// done through the descriptor (a freeze, a thaw) then reaches that
// filesystem and no other, even if the path is unmounted or remounted
// meanwhile: a freeze aimed at a staging directory whose mount is gone would
// otherwise freeze the filesystem beneath it (the node's own).
func OpenFilesystemOn(path, dev string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	if err := onDevice(f, path, dev); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// MountedFrom reports why the filesystem mounted at path is not the one on
// block device dev, or nil if it is.
func MountedFrom(path, dev string) error {
	f, err := OpenFilesystemOn(path, dev)
	if err != nil {
		return err
	}
	return f.Close()
}

func onDevice(f *os.File, path, dev string) error {
	var dst unix.Stat_t
	if err := unix.Stat(dev, &dst); err != nil {
		return fmt.Errorf("stat %s: %w", dev, err)
	}
	if dst.Mode&unix.S_IFMT != unix.S_IFBLK {
		return fmt.Errorf("%s is not a block device", dev)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("stat %s: %w", path, err)
	}
	if st.Dev != dst.Rdev {
		return fmt.Errorf("%s is not on %s (device %d:%d, want %d:%d): %w", path, dev,
			unix.Major(st.Dev), unix.Minor(st.Dev), unix.Major(dst.Rdev), unix.Minor(dst.Rdev), ErrNotMounted)
	}
	// The root of a mount is its own parent's child on another device, or
	// "/" of the filesystem: a subdirectory would share its parent's.
	var parent unix.Stat_t
	if err := unix.Fstatat(int(f.Fd()), "..", &parent, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("stat %s/..: %w", path, err)
	}
	if parent.Dev == st.Dev && parent.Ino != st.Ino {
		return fmt.Errorf("%s is a directory inside the filesystem on %s, not its mount: %w", path, dev, ErrNotMounted)
	}
	return nil
}

// ErrNotMounted: the expected filesystem is not mounted at a path.
var ErrNotMounted = errors.New("not mounted there")

// Freeze blocks writes to the filesystem f was opened on (OpenFilesystemOn)
// and flushes it to its device, until Thaw through the same descriptor.
func Freeze(f *os.File) error {
	return fsIoctl(f, fifreeze, "freeze")
}

// fitrim is FITRIM (_IOWR('X', 121, struct fstrim_range)).
const fitrim = 0xC0185879

// Trim discards the free space of the filesystem open as f (FITRIM, what
// fstrim(8) does) and returns how many bytes the filesystem discarded. On a
// loop device a discard punches a hole in the image, so the space a
// volume's deleted files held goes back to the pool.
//
// A filesystem skips extents freed since its last commit (xfs frees a
// deleted file's blocks in the background, then keeps them busy until the
// log is written): a syncfs first makes them free on disk, and trimmable.
func Trim(f *os.File) (int64, error) {
	// A free extent whose freeing is not yet committed is busy, and xfs's
	// trim skips it: under load some still are after the sync (make test
	// saw half of a deleted GiB left). Each pass trims every free extent
	// again (ext4 skips groups it trimmed already), so passes go on, a
	// moment apart, while one trims more than the one before.
	var last uint64
	for pass := 0; pass < 4; pass++ {
		if pass > 0 {
			time.Sleep(100 * time.Millisecond)
		}
		// statfs has xfs finish freeing deleted files' blocks (its inode
		// garbage collection), the sync commits the frees.
		var st unix.Statfs_t
		if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
			return 0, fmt.Errorf("statfs %s: %w", f.Name(), err)
		}
		if err := unix.Syncfs(int(f.Fd())); err != nil {
			return 0, fmt.Errorf("sync the filesystem at %s before trimming it: %w", f.Name(), err)
		}
		n, err := fitrimAll(f.Fd())
		if err != nil {
			return 0, fmt.Errorf("trim %s: %w", f.Name(), err)
		}
		if pass > 0 && n <= last {
			break
		}
		last = max(last, n)
	}
	return int64(last), nil
}

// Thaw undoes Freeze. A filesystem that is not frozen is left as it is.
func Thaw(f *os.File) error {
	err := fsIoctl(f, fithaw, "thaw")
	if errors.Is(err, unix.EINVAL) {
		return nil
	}
	return err
}

func fsIoctl(f *os.File, req uint, what string) error {
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), uintptr(req), 0); errno != 0 {
		return fmt.Errorf("%s %s: %w", what, f.Name(), errno)
	}
	return nil
}

// SyncDevice flushes what was written through a block device's page cache
// down to its backing file.
func SyncDevice(dev string) error {
	f, err := os.OpenFile(dev, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
