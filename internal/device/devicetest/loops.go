package devicetest

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/podvol/podvol/internal/device"
)

// Loop devices (device.Loops).

func (f *Fake) AttachLoop(image string, opts device.LoopOptions) (string, error) {
	if err := f.enter(AttachLoop, image); err != nil {
		return "", err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	file, err := os.OpenFile(image, os.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("open image: %w", err)
	}
	fi, err := file.Stat()
	if err != nil {
		file.Close()
		return "", err
	}
	bs := opts.BlockSize
	if bs == 0 {
		bs = device.PoolBlockSize(image)
		if sig, err := readSig(file); err == nil && sig != nil && (sig.Type == "ext4" || sig.Type == "xfs") && sig.sector() < bs {
			bs = sig.sector()
		}
	}
	if bs < 512 || bs > 4096 || bs&(bs-1) != 0 {
		file.Close()
		return "", fmt.Errorf("attach %s: logical block size %d: want 512, 1024, 2048 or 4096", image, bs)
	}
	if len(opts.Tag) > device.LoopTagMax {
		file.Close()
		return "", fmt.Errorf("attach %s: tag %q is longer than %d bytes", image, opts.Tag, device.LoopTagMax)
	}
	abs, _ := filepath.Abs(image)
	dio := opts.DirectIO && !f.noDirect[filepath.Dir(abs)]
	n := 0
	for f.loops[n] != nil {
		n++
	}
	f.loops[n] = &loop{n: n, backing: abs, file: file, tag: cmp.Or(opts.Tag, abs[:min(len(abs), device.LoopTagMax)]), size: fi.Size() &^ 511, io: device.LoopIO{DirectIO: dio, BlockSize: bs}}
	f.created[n] = true
	return devName(n), nil
}

func (f *Fake) LoopStatus(dev string) (device.LoopIO, error) {
	if err := f.enter(LoopStatus, dev); err != nil {
		return device.LoopIO{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.attached(dev)
	if l == nil {
		return device.LoopIO{}, fmt.Errorf("%s is not an attached loop device: %w", dev, unix.ENOENT)
	}
	return l.io, nil
}

func (f *Fake) DetachLoop(dev, backing string) error {
	if err := f.enter(DetachLoop, dev); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.attached(dev)
	if backing == "" || l == nil || l.name() != backing {
		return nil
	}
	if f.sbs[l.n] != nil {
		l.autoclear = true
		return fmt.Errorf("%s (%s) is still held open by another process: it detaches when that process lets go; retry", dev, backing)
	}
	f.detach(l)
	return nil
}

func (f *Fake) LoopDevices() (map[string]string, error) {
	if err := f.enter(LoopDevices, ""); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]string{}
	for n, l := range f.loops {
		out[devName(n)] = l.name()
	}
	return out, nil
}

func (f *Fake) LoopsFor(image string) ([]string, error) {
	if err := f.enter(LoopsFor, image); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, n := range sortedKeys(f.loops) {
		if f.loops[n].name() == image {
			out = append(out, devName(n))
		}
	}
	return out, nil
}

func (f *Fake) LoopBackingFile(dev string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if l := f.attached(dev); l != nil {
		return l.name()
	}
	return ""
}

// LoopServes compares paths: the fake has one mount namespace, where a
// loop's backing path is the image's.
func (f *Fake) LoopServes(dev, image string) bool {
	if f.enter(LoopServes, dev) != nil {
		return false
	}
	return f.LoopBackingFile(dev) == filepath.Clean(image)
}

func (f *Fake) LoopTag(dev string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if l := f.attached(dev); l != nil {
		return l.tag
	}
	return ""
}

func (f *Fake) LoopSetCapacity(dev string) error {
	if err := f.enter(LoopSetCapacity, dev); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.attached(dev)
	if l == nil {
		return fmt.Errorf("refresh size of %s: %w", dev, unix.ENXIO)
	}
	fi, err := l.file.Stat()
	if err != nil {
		return err
	}
	l.size = fi.Size() &^ 511
	return nil
}

func (f *Fake) DeviceSize(dev string) (int64, error) {
	if err := f.enter(DeviceSize, dev); err != nil {
		return 0, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	n, ok := loopNumber(dev)
	if !ok || !f.created[n] {
		return 0, &os.PathError{Op: "open", Path: dev, Err: unix.ENOENT}
	}
	if l := f.loops[n]; l != nil {
		return l.size, nil
	}
	return 0, nil // a free loop device is 0 bytes long
}

func (f *Fake) DeviceNodeOf(path, dev string) error {
	if err := f.enter(DeviceNodeOf, path); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	n, ok := loopNumber(dev)
	if !ok || !f.created[n] {
		return &os.PathError{Op: "stat", Path: dev, Err: unix.ENOENT}
	}
	// A device node is the device itself or a device bound onto a file.
	path = filepath.Clean(path)
	if path == devName(n) {
		return nil
	}
	if m := f.top(path); m != nil && m.fsType == "devtmpfs" && m.root == "/loop"+strconv.Itoa(n) {
		return nil
	}
	return fmt.Errorf("%s is not a device node of %s: %w", path, dev, device.ErrNotMounted)
}

func (f *Fake) SyncDevice(dev string) error {
	if err := f.enter(SyncDevice, dev); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if n, ok := loopNumber(dev); !ok || !f.created[n] {
		return &os.PathError{Op: "open", Path: dev, Err: unix.ENOENT}
	}
	return nil
}
