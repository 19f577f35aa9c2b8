package device

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// maxGroupDepth bounds the directory descriptors one walk holds open at a
// time. A path-based walk could not name anything deeper than PATH_MAX
// allows (about 2048 levels), so no tree that worked before is refused.
const maxGroupDepth = 2048

// SetGroup gives a volume's files to group gid the way kubelet applies a
// pod's fsGroup: group ownership, group read/write (execute where the owner
// has it) and setgid on directories so that new files inherit the group.
// With onRootMismatch, a root that already has the group and setgid is taken
// to mean the whole tree has them, so large volumes are not walked again.
//
// The tree belongs to a tenant whose other pods may be rewriting it while we
// run as root, so nothing below root is ever reached by path: each entry is
// pinned by a descriptor opened without following links, and every change
// is made through that descriptor. A name swapped for a symlink halfway
// through therefore costs the attacker only the link's own group.
func SetGroup(root string, gid int, onRootMismatch bool) error {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &fs.PathError{Op: "open", Path: root, Err: err}
	}
	dir := os.NewFile(uintptr(fd), root)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		dir.Close()
		return &fs.PathError{Op: "fstat", Path: root, Err: err}
	}
	if onRootMismatch && int(st.Gid) == gid && st.Mode&unix.S_ISGID != 0 {
		dir.Close()
		return nil
	}
	if err := groupDir(fd, &st, root, gid); err != nil {
		dir.Close()
		return err
	}
	return walkGroup(&groupFrame{dir: dir, fd: fd, path: root}, gid)
}

// groupFrame is one open directory of the walk and the names of it that are
// read but not yet handled; listing in batches keeps huge directories from
// being held in memory whole.
type groupFrame struct {
	dir   *os.File
	fd    int
	path  string
	names []string
}

func walkGroup(root *groupFrame, gid int) error {
	stack := []*groupFrame{root}
	defer func() {
		for _, f := range stack {
			f.dir.Close()
		}
	}()
	for len(stack) > 0 {
		top := stack[len(stack)-1]
		if len(top.names) == 0 {
			names, err := top.dir.Readdirnames(512)
			if err != nil && !errors.Is(err, io.EOF) {
				return &fs.PathError{Op: "readdir", Path: top.path, Err: err}
			}
			if len(names) == 0 {
				top.dir.Close()
				stack = stack[:len(stack)-1]
				continue
			}
			top.names = names
		}
		name := top.names[0]
		top.names = top.names[1:]
		sub, err := groupEntry(top.fd, top.path, name, gid)
		if err != nil {
			return err
		}
		if sub == nil {
			continue
		}
		if len(stack) >= maxGroupDepth {
			sub.dir.Close()
			return fmt.Errorf("%s: directories nested deeper than %d", sub.path, maxGroupDepth)
		}
		stack = append(stack, sub)
	}
	return nil
}

// groupEntry applies the group to name in the directory dirfd and, if it is
// a directory, returns it opened for the walk to descend into.
func groupEntry(dirfd int, dirPath, name string, gid int) (*groupFrame, error) {
	path := filepath.Join(dirPath, name)
	// Only a corrupt or crafted filesystem lists such names, and openat
	// would take them somewhere other than this directory's child.
	if name == "" || name == "." || name == ".." || strings.Contains(name, "/") {
		return nil, fmt.Errorf("directory %s lists an entry named %q", dirPath, name)
	}
	// O_PATH pins the inode without opening it for I/O: opening a device
	// node runs its driver, and opening a FIFO can block.
	fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil // deleted by the pod since it was listed
	}
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	// What the name was when listed says nothing about what fd holds now.
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, &fs.PathError{Op: "fstat", Path: path, Err: err}
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		// Reopening "." of the pinned directory rather than name again
		// means a swap after the fstat cannot hand us a different inode,
		// nor make us fail on a link that appeared in its place.
		dfd, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) {
			return nil, nil // removed since it was pinned
		}
		if err != nil {
			return nil, &fs.PathError{Op: "open", Path: path, Err: err}
		}
		dir := os.NewFile(uintptr(dfd), path)
		if err := unix.Fstat(dfd, &st); err != nil {
			dir.Close()
			return nil, &fs.PathError{Op: "fstat", Path: path, Err: err}
		}
		if err := groupDir(dfd, &st, path, gid); err != nil {
			dir.Close()
			return nil, err
		}
		return &groupFrame{dir: dir, fd: dfd, path: path}, nil
	case unix.S_IFREG:
		if err := chownEmpty(fd, path, gid); err != nil {
			return nil, err
		}
		// The mode comes from the fstat before the chown: the kernel drops
		// setuid on a chown, and kubelet puts it back.
		mode := groupPerm(st.Mode) | st.Mode&(unix.S_ISUID|unix.S_ISVTX)
		if err := fchmodPinned(fd, mode); err != nil {
			return nil, &fs.PathError{Op: "chmod", Path: path, Err: err}
		}
		return nil, nil
	default:
		// A symlink's mode means nothing and chmod would reach its target;
		// devices, FIFOs and sockets get the group, as with kubelet, and
		// are never opened.
		return nil, chownEmpty(fd, path, gid)
	}
}

func groupDir(fd int, st *unix.Stat_t, path string, gid int) error {
	if err := unix.Fchown(fd, -1, gid); err != nil {
		return &fs.PathError{Op: "chown", Path: path, Err: err}
	}
	if err := unix.Fchmod(fd, groupPerm(st.Mode)|unix.S_ISGID); err != nil {
		return &fs.PathError{Op: "chmod", Path: path, Err: err}
	}
	return nil
}

// groupPerm is mode's permission bits with group read/write, and group
// execute where the owner may execute.
func groupPerm(mode uint32) uint32 {
	perm := mode&0o777 | 0o060
	if mode&0o100 != 0 {
		perm |= 0o010
	}
	return perm
}

// chownEmpty changes the group of what the O_PATH descriptor fd itself is;
// with an empty path fchownat acts on fd and, for a symlink, on the link.
func chownEmpty(fd int, path string, gid int) error {
	if err := unix.Fchownat(fd, "", -1, gid, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &fs.PathError{Op: "chown", Path: path, Err: err}
	}
	return nil
}

// fchmodPinned sets the mode of the inode an O_PATH descriptor holds;
// fchmod(2) refuses O_PATH descriptors. fchmodat2 with AT_EMPTY_PATH needs
// Linux 6.6 and may be refused by a seccomp profile that predates it (with
// EPERM, hence the retry on that too: a real EPERM simply comes back again).
func fchmodPinned(fd int, mode uint32) error {
	err := unix.Fchmodat(fd, "", mode, unix.AT_EMPTY_PATH)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EOPNOTSUPP),
		errors.Is(err, unix.EINVAL), errors.Is(err, unix.EPERM):
		return fchmodProcFd(fd, mode)
	default:
		return err
	}
}

// fchmodProcFd goes through /proc/self/fd/N, a magic link that resolves to
// exactly the descriptor's inode whatever has since become of its name.
func fchmodProcFd(fd int, mode uint32) error {
	return unix.Fchmodat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(fd), mode, 0)
}
