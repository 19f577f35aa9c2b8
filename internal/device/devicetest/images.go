package devicetest

import (
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/podvol/podvol/internal/device"
)

// Image files: reflink, copies, growth (device.Images).

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
