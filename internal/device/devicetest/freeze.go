package devicetest

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/podvol/podvol/internal/device"
)

// Filesystem handles: freeze, thaw and trim (device.Filesystem).

func (f *Fake) OpenFilesystemOn(path, dev string) (device.Filesystem, error) {
	if err := f.enter(OpenFilesystemOn, path); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	m, err := f.onDevice(path, dev)
	if err != nil {
		return nil, err
	}
	f.nextID++
	h := &handle{f: f, id: f.nextID, sb: m.sb, mountID: m.id, dev: dev}
	f.handles[h.id] = h
	return h, nil
}

// handle is an open descriptor of a mount's root.
type handle struct {
	f       *Fake
	id      int
	sb      *superblock
	mountID int
	dev     string
	closed  bool
}

func (h *handle) Freeze() error {
	f := h.f
	if err := f.enter(Freeze, h.dev); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if h.closed {
		return fmt.Errorf("freeze: %w", unix.EBADF)
	}
	if h.sb.frozen {
		return fmt.Errorf("freeze %s: %w", h.dev, unix.EBUSY)
	}
	h.sb.frozen, h.sb.frozenBy = true, h.id
	f.freezeLog = append(f.freezeLog, FreezeEvent{Dev: devName(h.sb.loop.n), Handle: h.id})
	return nil
}

func (h *handle) Thaw() error {
	f := h.f
	if err := f.enter(Thaw, h.dev); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if h.closed {
		return fmt.Errorf("thaw: %w", unix.EBADF)
	}
	if !h.sb.frozen {
		return nil // EINVAL, which device.Thaw takes as done
	}
	h.sb.frozen = false
	f.freezeLog = append(f.freezeLog, FreezeEvent{Thaw: true, Dev: devName(h.sb.loop.n), Handle: h.id})
	return nil
}

// Trim discards nothing the fake could show (it does not model which
// blocks a filesystem uses): it checks the handle and counts the call.
func (h *handle) Trim() (int64, error) {
	f := h.f
	if err := f.enter(Trim, h.dev); err != nil {
		return 0, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if h.closed {
		return 0, fmt.Errorf("trim: %w", unix.EBADF)
	}
	return 0, nil
}

func (h *handle) Close() error {
	f := h.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if h.closed {
		return os.ErrClosed
	}
	h.closed = true
	delete(f.handles, h.id)
	f.release(h.sb)
	return nil
}
