package device

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// GrowFile extends a file to size bytes; it never shrinks one.
func GrowFile(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open image: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.Size() >= size {
		return nil
	}
	if err := f.Truncate(size); err != nil {
		return fmt.Errorf("grow image to %d bytes: %w", size, err)
	}
	return f.Sync()
}

// LoopSetCapacity makes a loop device see its backing file's new size.
func LoopSetCapacity(dev string) error {
	f, err := os.OpenFile(dev, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_SET_CAPACITY, 0); err != nil {
		return fmt.Errorf("refresh size of %s: %w", dev, err)
	}
	return nil
}

// GrowOffline grows the (unmounted) ext4 filesystem on dev to fill it.
// resize2fs insists on a fresh forced check first.
func GrowOffline(ctx context.Context, dev string) error {
	if _, err := run(ctx, "e2fsck", "-f", "-p", dev); err != nil {
		var ee interface{ ExitCode() int }
		if !errors.As(err, &ee) || ee.ExitCode() > 1 {
			return err
		}
	}
	_, err := run(ctx, "resize2fs", dev)
	return err
}

// GrowOnline grows the filesystem mounted at mountPath on dev to fill dev.
func GrowOnline(ctx context.Context, fsType, dev, mountPath string) error {
	switch fsType {
	case "xfs":
		_, err := run(ctx, "xfs_growfs", mountPath)
		return err
	case "ext4":
		_, err := run(ctx, "resize2fs", dev)
		if err != nil && !HasCapability(CapSysResource) {
			return fmt.Errorf("%w (online growth of a mounted ext4 needs CAP_SYS_RESOURCE, which this process lacks)", err)
		}
		return err
	}
	return fmt.Errorf("cannot grow %s", fsType)
}

// CapSysResource is the capability online ext4 growth needs.
const CapSysResource = 24

// HasCapability reports whether the process has capability bit c in its
// effective set.
func HasCapability(c uint) bool {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "CapEff:"); ok {
			bits, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && bits&(1<<c) != 0
		}
	}
	return false
}
