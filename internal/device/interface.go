package device

import (
	"context"
	"os"
)

// Interface is everything the packages above ask of the machine: the kernel's
// loop driver, its mount table, the filesystem tools, and the image files
// those act on. Host is the machine itself; internal/device/devicetest is a
// faithful in-memory stand-in, so that the logic above can be tested without
// root. The parts are separate so that a consumer can ask for only what it
// uses (the inline package needs Mounts alone).
//
// The method names are those of this package's functions, and each method of
// Host is exactly that function: their documentation is the contract.
type Interface interface {
	Loops
	Mounts
	Tools
	Images
}

// Loops is the kernel's loop driver: block devices backed by image files.
type Loops interface {
	AttachLoop(image string, opts LoopOptions) (dev string, err error)
	LoopStatus(dev string) (LoopIO, error)
	DetachLoop(dev, backing string) error
	LoopDevices() (map[string]string, error)
	LoopsFor(image string) ([]string, error)
	LoopBackingFile(dev string) string
	LoopServes(dev, image string) bool
	LoopTag(dev string) string
	LoopSetCapacity(dev string) error
	DeviceSize(dev string) (int64, error)
	DeviceNodeOf(path, dev string) error
	SyncDevice(dev string) error
}

// Mounts is the mount table, and what can be asked of or done to the
// filesystem mounted at a path.
type Mounts interface {
	Mount(ctx context.Context, source, target, fsType string, options []string) error
	Unmount(target string) error
	MountedAt(path string) (*MountAt, error)
	MountsOf(dev string) ([]string, error)
	MountedFrom(path, dev string) error
	// OpenFilesystemOn returns a handle on the filesystem of block device
	// dev mounted at path, or an error if path is not such a mount (see
	// the function of that name). A freeze and its thaw go through one
	// handle, so they reach that filesystem and no other.
	OpenFilesystemOn(path, dev string) (Filesystem, error)
	Statfs(path string) (FSStats, error)
	ReadableRoot(path string) error
	// SetGroup applies a pod's fsGroup to the filesystem at root.
	SetGroup(root string, gid int, onRootMismatch bool) error
}

// Filesystem is an open handle on one mounted filesystem.
type Filesystem interface {
	Freeze() error
	Thaw() error
	// Trim discards the filesystem's free space (Trim) and returns the
	// bytes discarded.
	Trim() (int64, error)
	Close() error
}

// Tools are the programs and kernel reports about a volume's filesystem:
// blkid, mkfs, e2fsck, resize2fs, xfs_growfs, ext4's error counter.
type Tools interface {
	Probe(ctx context.Context, dev string) (string, error)
	Format(ctx context.Context, dev, fsType string) error
	FsckIfNeeded(ctx context.Context, dev, fsType string) error
	GrowOffline(ctx context.Context, dev string) error
	GrowOnline(ctx context.Context, fsType, dev, mountPath string) error
	Ext4Errors(dev string) (count int, lastFunc string)
}

// Images are the pool's image files: reflink support, copies, growth.
type Images interface {
	CanReflink(dir string) bool
	CopyImage(src, dst string, size int64, reflink bool) error
	GrowFile(path string, size int64) error
}

// Host is the machine podvol runs on: each method calls this package's
// function of the same name.
type Host struct{}

var _ Interface = Host{}

func (Host) AttachLoop(image string, opts LoopOptions) (string, error) {
	return AttachLoop(image, opts)
}

func (Host) LoopStatus(dev string) (LoopIO, error)                 { return LoopStatus(dev) }
func (Host) DetachLoop(dev, backing string) error                  { return DetachLoop(dev, backing) }
func (Host) LoopDevices() (map[string]string, error)               { return LoopDevices() }
func (Host) LoopsFor(image string) ([]string, error)               { return LoopsFor(image) }
func (Host) LoopBackingFile(dev string) string                     { return LoopBackingFile(dev) }
func (Host) LoopServes(dev, image string) bool                     { return LoopServes(dev, image) }
func (Host) LoopTag(dev string) string                             { return LoopTag(dev) }
func (Host) LoopSetCapacity(dev string) error                      { return LoopSetCapacity(dev) }
func (Host) DeviceSize(dev string) (int64, error)                  { return DeviceSize(dev) }
func (Host) SyncDevice(dev string) error                           { return SyncDevice(dev) }
func (Host) DeviceNodeOf(path, dev string) error                   { return DeviceNodeOf(path, dev) }
func (Host) Unmount(target string) error                           { return Unmount(target) }
func (Host) MountedAt(path string) (*MountAt, error)               { return MountedAt(path) }
func (Host) MountsOf(dev string) ([]string, error)                 { return MountsOf(dev) }
func (Host) MountedFrom(path, dev string) error                    { return MountedFrom(path, dev) }
func (Host) Statfs(path string) (FSStats, error)                   { return Statfs(path) }
func (Host) ReadableRoot(path string) error                        { return ReadableRoot(path) }
func (Host) Probe(ctx context.Context, dev string) (string, error) { return Probe(ctx, dev) }
func (Host) Format(ctx context.Context, dev, fsType string) error  { return Format(ctx, dev, fsType) }
func (Host) GrowOffline(ctx context.Context, dev string) error     { return GrowOffline(ctx, dev) }
func (Host) Ext4Errors(dev string) (int, string)                   { return Ext4Errors(dev) }
func (Host) CanReflink(dir string) bool                            { return CanReflink(dir) }
func (Host) GrowFile(path string, size int64) error                { return GrowFile(path, size) }

func (Host) Mount(ctx context.Context, source, target, fsType string, options []string) error {
	return Mount(ctx, source, target, fsType, options)
}

func (Host) SetGroup(root string, gid int, onRootMismatch bool) error {
	return SetGroup(root, gid, onRootMismatch)
}

func (Host) FsckIfNeeded(ctx context.Context, dev, fsType string) error {
	return FsckIfNeeded(ctx, dev, fsType)
}

func (Host) GrowOnline(ctx context.Context, fsType, dev, mountPath string) error {
	return GrowOnline(ctx, fsType, dev, mountPath)
}

func (Host) CopyImage(src, dst string, size int64, reflink bool) error {
	return CopyImage(src, dst, size, reflink)
}

func (Host) OpenFilesystemOn(path, dev string) (Filesystem, error) {
	f, err := OpenFilesystemOn(path, dev)
	if err != nil {
		return nil, err
	}
	return hostFilesystem{f}, nil
}

// hostFilesystem is a descriptor of a mount's root directory.
type hostFilesystem struct{ f *os.File }

func (h hostFilesystem) Freeze() error { return Freeze(h.f) }
func (h hostFilesystem) Thaw() error   { return Thaw(h.f) }

func (h hostFilesystem) Trim() (int64, error) { return Trim(h.f) }
func (h hostFilesystem) Close() error         { return h.f.Close() }
