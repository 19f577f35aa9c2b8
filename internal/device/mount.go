package device

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// Mount mounts source at target. options are mount(8) -o options; fsType may be
// empty for bind mounts.
func Mount(ctx context.Context, source, target, fsType string, options []string) error {
	args := []string{}
	if fsType != "" {
		args = append(args, "-t", fsType)
	}
	if len(options) > 0 {
		args = append(args, "-o", strings.Join(options, ","))
	}
	args = append(args, "--", source, target)
	_, err := run(ctx, "mount", args...)
	return err
}

// Unmount unmounts target; a target that is not mounted (or does not exist)
// is not an error, so that retries converge.
func Unmount(target string) error {
	for {
		err := unix.Unmount(target, unix.UMOUNT_NOFOLLOW)
		switch {
		case err == nil:
			// Stacked mounts (a retried publish that mounted twice) need
			// one unmount each.
			continue
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil
		default:
			return fmt.Errorf("unmount %s: %w", target, err)
		}
	}
}

// MountAt describes what is mounted at a path.
type MountAt struct {
	Source  string // device or filesystem source
	Root    string // path inside the source filesystem (bind mounts of device nodes show /loopN)
	FsType  string
	Options string // per-mount options, e.g. "ro,relatime"
	Super   string // superblock options, e.g. "rw,errors=remount-ro"
}

// ReadOnly reports whether the mount or its superblock is read-only.
func (m *MountAt) ReadOnly() bool {
	return hasOpt(m.Options, "ro") || hasOpt(m.Super, "ro")
}

func hasOpt(opts, o string) bool {
	for _, x := range strings.Split(opts, ",") {
		if x == o {
			return true
		}
	}
	return false
}

// MountedAt returns the topmost mount at path, or nil when path is not a
// mount point.
func MountedAt(path string) (*MountAt, error) {
	ms, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(path))
	if err != nil {
		return nil, fmt.Errorf("read mount table: %w", err)
	}
	if len(ms) == 0 {
		return nil, nil
	}
	m := ms[len(ms)-1]
	return &MountAt{Source: m.Source, Root: m.Root, FsType: m.FSType, Options: m.Options, Super: m.VFSOptions}, nil
}

// MountsOf lists the mount points whose source is dev.
func MountsOf(dev string) ([]string, error) {
	ms, err := mountinfo.GetMounts(func(m *mountinfo.Info) (bool, bool) { return m.Source != dev, false })
	if err != nil {
		return nil, fmt.Errorf("read mount table: %w", err)
	}
	var out []string
	for _, m := range ms {
		out = append(out, m.Mountpoint)
	}
	return out, nil
}

// FSStats is what statfs tells about a mounted filesystem.
type FSStats struct {
	TotalBytes, AvailableBytes, UsedBytes int64
	TotalInodes, FreeInodes, UsedInodes   int64
	// BlockSize is the filesystem's block (its allocation unit); 0 if
	// not known.
	BlockSize int64
}

// Statfs returns usage of the filesystem mounted at path.
func Statfs(path string) (FSStats, error) {
	var s unix.Statfs_t
	if err := unix.Statfs(path, &s); err != nil {
		return FSStats{}, fmt.Errorf("statfs %s: %w", path, err)
	}
	bs := int64(s.Bsize)
	return FSStats{
		TotalBytes:     int64(s.Blocks) * bs,
		AvailableBytes: int64(s.Bavail) * bs,
		UsedBytes:      int64(s.Blocks-s.Bfree) * bs,
		TotalInodes:    int64(s.Files),
		FreeInodes:     int64(s.Ffree),
		UsedInodes:     int64(s.Files - s.Ffree),
		BlockSize:      bs,
	}, nil
}

// IsBlockDevice reports whether path is a block device node.
func IsBlockDevice(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode()&os.ModeDevice != 0 && fi.Mode()&os.ModeCharDevice == 0
}
