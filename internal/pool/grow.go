package pool

import (
	"fmt"

	"github.com/podvol/podvol/internal/errkind"
	"github.com/podvol/podvol/internal/failpoint"
	"github.com/podvol/podvol/internal/store"
)

// GrowVolume records and makes a volume's image size bytes long. Shrinking
// is refused; the same size again is done already.
func (p *Pool) GrowVolume(id string, size int64) (*store.Volume, error) {
	v, err := p.ReadyVolume(id)
	if err != nil {
		return nil, err
	}
	if size < v.SizeBytes {
		return nil, fmt.Errorf("volume %s is %d bytes, cannot shrink it to %d: %w", id, v.SizeBytes, size, errkind.ErrOutOfRange)
	}
	if size > v.SizeBytes {
		p.mu.Lock()
		err = p.admit(size - v.SizeBytes)
		if err == nil {
			v, err = p.store.Update(id, func(v *store.Volume) error {
				v.SizeBytes = size
				v.GrowFs = true
				return nil
			})
		}
		p.mu.Unlock()
		if err != nil {
			return nil, fmt.Errorf("grow volume %s: %w", id, err)
		}
	}
	failpoint.Hit("grow-after-record")
	if err := p.dev.GrowFile(p.ImagePath(id), v.SizeBytes); err != nil {
		return nil, err
	}
	return v, nil
}

// FsGrown clears the volume's pending filesystem growth.
func (p *Pool) FsGrown(id string) error {
	_, err := p.store.Update(id, func(v *store.Volume) error {
		v.GrowFs = false
		return nil
	})
	return err
}
