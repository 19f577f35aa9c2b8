package datapath

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Resident is how many bytes of the file at path are in the page cache,
// page by page from mincore(2) over a shared read-only mapping (what
// util-linux's fincore counts). Mapping a file reads nothing into the
// cache.
func Resident(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	size := fi.Size()
	if size == 0 {
		return 0, nil
	}
	page := int64(os.Getpagesize())
	var resident int64
	// In windows of 1 GiB, so that a large image needs no large mapping.
	const window = 1 << 30
	for off := int64(0); off < size; off += window {
		n := min(window, size-off)
		m, err := unix.Mmap(int(f.Fd()), off, int(n), unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			return 0, fmt.Errorf("mmap %s at %d: %w", path, off, err)
		}
		vec := make([]byte, (n+page-1)/page)
		// #nosec G103 -- mincore(2) fills vec; x/sys has no wrapper for it.
		_, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0])))
		_ = unix.Munmap(m) // a mapping only read through mincore: nothing to lose
		if errno != 0 {
			return 0, fmt.Errorf("mincore %s at %d: %w", path, off, errno)
		}
		for i, v := range vec {
			if v&1 != 0 {
				resident += min(page, n-int64(i)*page)
			}
		}
	}
	return resident, nil
}

// DropCaches writes dirty pages back and drops the host's clean page cache,
// dentries and inodes, so that the next job starts from the disk.
func DropCaches() error {
	unix.Sync()
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0o200)
}

// LoopOf finds the loop device whose backing file is the file at path, and
// what sysfs says of its direct I/O and logical block size. It matches the
// file's device and inode (LOOP_GET_STATUS64), not its name: a loop device
// that a dev cluster node's plugin attached names the image as the node's
// mount namespace sees it.
func LoopOf(path string) (Loop, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return Loop{}, fmt.Errorf("stat %s: %w", path, err)
	}
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, bf := range files {
		sys := filepath.Dir(filepath.Dir(bf))
		dev := "/dev/" + filepath.Base(sys)
		fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		info, err := unix.IoctlLoopGetStatus64(fd)
		_ = unix.Close(fd) // opened read-only for the ioctl
		if err != nil || info.Inode != st.Ino || info.Device != st.Dev {
			continue
		}
		l := Loop{Device: dev}
		dio, err := os.ReadFile(filepath.Join(sys, "loop", "dio"))
		if err != nil {
			return l, err
		}
		l.DirectIO = strings.TrimSpace(string(dio)) == "1"
		lbs, err := os.ReadFile(filepath.Join(sys, "queue", "logical_block_size"))
		if err != nil {
			return l, err
		}
		l.LogicalBlock, err = strconv.Atoi(strings.TrimSpace(string(lbs)))
		return l, err
	}
	return Loop{}, fmt.Errorf("no loop device is backed by %s", path)
}

// FSType is the filesystem type holding path, as findmnt names it.
func FSType(path string) string {
	out, err := exec.Command("findmnt", // #nosec G204 -- an argv, no shell
		"-n", "-o", "FSTYPE", "--target", path).Output()
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(out))
}
