package devicetest

import (
	"context"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/podvol/podvol/internal/device"
)

// Disk tools: blkid, mkfs, fsck, resize (device.Tools).

func (f *Fake) Probe(ctx context.Context, dev string) (string, error) {
	if err := f.enter(Probe, dev); err != nil {
		return "", err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var sig *Signature
	var err error
	if _, isDev := loopNumber(dev); isDev {
		l := f.attached(dev)
		if l == nil {
			return "", fmt.Errorf("blkid -p -o export %s: %w", dev, unix.ENXIO)
		}
		sig, err = f.sig(l)
	} else {
		sig, err = ReadSignature(dev)
	}
	if err != nil {
		return "", fmt.Errorf("blkid -p -o export %s: %w", dev, err)
	}
	if sig == nil {
		return "", nil
	}
	return sig.Type, nil
}

// tool finds the attached, unmounted device a disk tool works on.
func (f *Fake) tool(name, dev string) (*loop, error) {
	l := f.attached(dev)
	if l == nil {
		return nil, fmt.Errorf("%s %s: %w", name, dev, unix.ENXIO)
	}
	if f.sbs[l.n] != nil {
		return nil, fmt.Errorf("%s %s: %s is mounted; will not work on it", name, dev, dev)
	}
	return l, nil
}

func (f *Fake) Format(ctx context.Context, dev, fsType string) error {
	if err := f.enter(Format, dev); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if fsType != "ext4" && fsType != "xfs" {
		return fmt.Errorf("unsupported filesystem %q", fsType)
	}
	if _, isDev := loopNumber(dev); !isDev {
		// mkfs on an image file, as the pool does when it creates a volume.
		for _, l := range f.loops {
			if l != nil && l.backing == dev && f.sbs[l.n] != nil {
				return fmt.Errorf("mkfs.%s %s: %s is mounted; will not make a filesystem here", fsType, dev, dev)
			}
		}
		file, err := os.OpenFile(dev, os.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("mkfs.%s %s: %w", fsType, dev, err)
		}
		defer file.Close()
		fi, err := file.Stat()
		if err != nil {
			return err
		}
		if fsType == "xfs" && fi.Size() < 300<<20 {
			return fmt.Errorf("mkfs.xfs %s: Filesystem must be larger than 300MB", dev)
		}
		return writeSig(file, &Signature{Type: fsType, UUID: newUUID(), Size: fi.Size() &^ 511, Sector: sectorFor(fsType, device.PoolBlockSize(dev))})
	}
	l, err := f.tool("mkfs."+fsType, dev)
	if err != nil {
		return err
	}
	if fsType == "xfs" && l.size < 300<<20 {
		return fmt.Errorf("mkfs.xfs %s: Filesystem must be larger than 300MB", dev)
	}
	return writeSig(l.file, &Signature{Type: fsType, UUID: newUUID(), Size: l.size, Sector: sectorFor(fsType, l.io.BlockSize)})
}

// sectorFor is the sector size device.Format gives a filesystem made on a
// device (or for a pool) of logical block size bs.
func sectorFor(fsType string, bs int) int {
	if fsType == "ext4" {
		return 4096
	}
	return bs
}

func (f *Fake) FsckIfNeeded(ctx context.Context, dev, fsType string) error {
	if err := f.enter(FsckIfNeeded, dev); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if fsType != "ext4" {
		return nil
	}
	l, err := f.tool("e2fsck -p", dev)
	if err != nil {
		return err
	}
	if sig, err := f.sig(l); err != nil || sig == nil || sig.Type != "ext4" {
		return fmt.Errorf("e2fsck -p %s: Bad magic number in super-block", dev)
	}
	return nil
}

func (f *Fake) GrowOffline(ctx context.Context, dev string) error {
	if err := f.enter(GrowOffline, dev); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	l, err := f.tool("e2fsck -f -p", dev)
	if err != nil {
		return err
	}
	sig, err := f.sig(l)
	if err != nil || sig == nil || sig.Type != "ext4" {
		return fmt.Errorf("e2fsck -f -p %s: Bad magic number in super-block", dev)
	}
	sig.Size = l.size
	return writeSig(l.file, sig)
}

func (f *Fake) GrowOnline(ctx context.Context, fsType, dev, mountPath string) error {
	if err := f.enter(GrowOnline, dev); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	m, err := f.onDevice(mountPath, dev)
	if err != nil {
		return fmt.Errorf("grow %s at %s: %w", dev, mountPath, err)
	}
	sb := m.sb
	switch {
	case fsType != sb.fsType || (fsType != "xfs" && fsType != "ext4"):
		return fmt.Errorf("cannot grow %s", fsType)
	case sb.frozen:
		return fmt.Errorf("grow %s: %w", mountPath, ErrWouldBlock)
	case fsType == "ext4" && f.noOnlineFs:
		return fmt.Errorf("resize2fs %s: Permission denied to resize filesystem (online growth of a mounted ext4 needs CAP_SYS_RESOURCE, which this process lacks)", dev)
	}
	sig, err := f.sig(sb.loop)
	if err != nil || sig == nil {
		return fmt.Errorf("grow %s: %w", dev, unix.EIO)
	}
	sb.size, sig.Size = sb.loop.size, sb.loop.size
	return writeSig(sb.loop.file, sig)
}

func (f *Fake) Ext4Errors(dev string) (int, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, _ := loopNumber(dev)
	if sb := f.sbs[n]; sb != nil && sb.fsType == "ext4" {
		return sb.errCount, sb.errFunc
	}
	return 0, ""
}
