package device

import (
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// SetGroup gives a volume's files to group gid the way kubelet applies a
// pod's fsGroup: group ownership, group read/write (execute where the owner
// has it) and setgid on directories so that new files inherit the group.
// With onRootMismatch, a root that already has the group and setgid is taken
// to mean the whole tree has them, so large volumes are not walked again.
func SetGroup(root string, gid int, onRootMismatch bool) error {
	if onRootMismatch {
		var st unix.Stat_t
		if err := unix.Lstat(root, &st); err == nil && int(st.Gid) == gid && st.Mode&unix.S_ISGID != 0 {
			return nil
		}
	}
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return unix.Lchown(path, -1, gid)
		}
		if err := os.Lchown(path, -1, gid); err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		mode := fi.Mode()
		perm := mode.Perm() | 0o060
		if mode&0o100 != 0 {
			perm |= 0o010
		}
		if d.IsDir() {
			return os.Chmod(path, perm|os.ModeSetgid)
		}
		if mode.IsRegular() {
			return os.Chmod(path, perm|(mode&(os.ModeSetuid|os.ModeSticky)))
		}
		return nil
	})
}
