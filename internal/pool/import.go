package pool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/podvol/podvol/internal/errkind"
	"github.com/podvol/podvol/internal/store"
)

// createImport records a volume whose data another node's pool holds: an
// Importing volume with an empty image, which the pull fills (through
// ImportImage, RecordImport) and FinishImport makes Ready. Its size is
// admitted now, as any new volume's.
func (p *Pool) createImport(r CreateRequest) (*store.Volume, error) {
	if r.Import == nil || r.Import.ClaimNamespace == "" || r.Import.ClaimName == "" || r.Import.ClaimUID == "" {
		return nil, fmt.Errorf("a volume made from node %s's %s %s needs the claim it is for: %w", r.Source.Node, r.Source.Kind, r.Source.ID, errkind.ErrInvalid)
	}
	imp := *r.Import
	v := &store.Volume{
		ID:         p.newID(kindVolume),
		Name:       r.Name,
		SizeBytes:  r.SizeBytes,
		FsType:     r.FsType,
		Parameters: r.Parameters,
		State:      store.Importing,
		Created:    time.Now().UTC(),
		Namespace:  r.Namespace,
		Source:     r.Source,
		Import:     &imp,
	}
	if err := p.record(v); err != nil {
		return nil, err
	}
	if err := makeImage(p.ImagePath(v.ID), 0); err != nil {
		if rerr := p.removeVolume(v.ID); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return nil, err
	}
	return v, nil
}

// Importing lists the volumes whose pull has not finished (to resume them).
func (p *Pool) Importing() ([]*store.Volume, error) {
	return p.volumesWhere(func(v *store.Volume) bool { return v.State == store.Importing })
}

// ImportImage opens an Importing volume's image for its pull to write.
func (p *Pool) ImportImage(id string) (*os.File, *store.Volume, error) {
	v, err := p.importing(id)
	if err != nil {
		return nil, nil, err
	}
	f, err := os.OpenFile(p.ImagePath(id), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, nil, fmt.Errorf("open the image of importing volume %s: %w", id, err)
	}
	return f, v, nil
}

// RecordImport keeps a pull's checkpoint, so that a restart resumes it:
// the image being pulled, its size, how far it is verified, and the image
// the copy held whole before, if the pull brings only its changes.
func (p *Pool) RecordImport(id, identity, base string, size, verified int64) error {
	if size > 0 {
		if v, err := p.importing(id); err == nil && size > v.SizeBytes {
			return fmt.Errorf("the source's image is %d bytes, more than volume %s's %d: %w", size, id, v.SizeBytes, errkind.ErrOutOfRange)
		}
	}
	_, err := p.store.Update(id, func(v *store.Volume) error {
		if v.State != store.Importing || v.Import == nil {
			return fmt.Errorf("volume %s is %s, not importing: %w", id, v.State, errkind.ErrConflict)
		}
		v.Import.Identity, v.Import.Base, v.Import.Size, v.Import.Verified = identity, base, size, verified
		return nil
	})
	return err
}

// FinishImport makes an Importing volume whose image is complete and
// verified Ready: grown to the volume's size (its filesystem at first
// stage), its filesystem checked against the class's.
func (p *Pool) FinishImport(ctx context.Context, id string) (*store.Volume, error) {
	v, err := p.importing(id)
	if err != nil {
		return nil, err
	}
	img := p.ImagePath(id)
	if v.Import.Size == 0 || v.Import.Verified != v.Import.Size {
		return nil, fmt.Errorf("volume %s's pull is at %d of %d bytes: %w", id, v.Import.Verified, v.Import.Size, errkind.ErrInUse)
	}
	if v.Import.Size > v.SizeBytes {
		return nil, fmt.Errorf("the source's image is %d bytes, more than volume %s's %d: %w", v.Import.Size, id, v.SizeBytes, errkind.ErrOutOfRange)
	}
	if v.FsType != "" {
		got, err := p.dev.Probe(ctx, img)
		if err != nil {
			return nil, fmt.Errorf("probe the filesystem pulled into volume %s: %w", id, err)
		}
		if got != "" && got != v.FsType {
			return nil, fmt.Errorf("node %s's %s %s holds %s, the new volume asks for %s: %w", v.Source.Node, v.Source.Kind, v.Source.ID, got, v.FsType, errkind.ErrInvalid)
		}
		if got == "" {
			// Kept, not given up: the copy is what the source held, and
			// the stage refuses it (node.formattable) rather than format
			// it, unless it holds nothing at all.
			if holds, err := p.HoldsData(id); err != nil || holds {
				klog.InfoS("The image pulled holds no filesystem: it will not be formatted, and a stage of it for a filesystem is refused",
					"volume", id, "fsType", v.FsType, "sourceNode", v.Source.Node, "source", v.Source.ID, "err", err)
			}
		}
	}
	if v.SizeBytes > v.Import.Size {
		if err := p.dev.GrowFile(img, v.SizeBytes); err != nil {
			return nil, fmt.Errorf("grow volume %s to %d bytes: %w", id, v.SizeBytes, err)
		}
	}
	if err := writeParameters(img, v.Parameters); err != nil {
		return nil, fmt.Errorf("volume %s: %w", id, err)
	}
	return p.store.Update(id, func(v *store.Volume) error {
		if v.State != store.Importing {
			return fmt.Errorf("volume %s is %s, not importing: %w", id, v.State, errkind.ErrConflict)
		}
		v.GrowFs = v.SizeBytes > v.Import.Size
		v.PulledFor = &store.Claim{Namespace: v.Import.ClaimNamespace, Name: v.Import.ClaimName, UID: v.Import.ClaimUID}
		v.State, v.Import = store.Ready, nil
		return nil
	})
}

// HoldsData tells whether volume id's image holds any data (SEEK_DATA finds
// some; where the filesystem cannot tell, yes).
func (p *Pool) HoldsData(id string) (bool, error) {
	f, err := os.Open(p.ImagePath(id))
	if err != nil {
		return false, fmt.Errorf("open the image of volume %s: %w", id, err)
	}
	defer f.Close()
	_, err = unix.Seek(int(f.Fd()), 0, unix.SEEK_DATA)
	if errors.Is(err, unix.ENXIO) {
		return false, nil
	}
	if err != nil && !errors.Is(err, unix.EINVAL) {
		return false, fmt.Errorf("look for data in the image of volume %s: %w", id, err)
	}
	return true, nil
}

// AbandonImport deletes an Importing volume and its image: its pull was
// refused for good, or its claim is gone.
func (p *Pool) AbandonImport(id string) error {
	if _, err := p.importing(id); err != nil {
		return err
	}
	return p.removeVolume(id)
}

func (p *Pool) importing(id string) (*store.Volume, error) {
	v, err := p.store.Volume(id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("volume %s: %w", id, errkind.ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	if v.State != store.Importing || v.Import == nil {
		return nil, fmt.Errorf("volume %s is %s, not importing: %w", id, v.State, errkind.ErrConflict)
	}
	return v, nil
}

// MarkMoving records that volume id's last data is being taken for claim
// by a migration (the same claim again is a no-op): from then on the
// volume is not staged here until ClearMoving. A volume staged or published
// is in use (errkind.ErrInUse): a pod may still write it.
//
// A volume moving for another claim is handed over to this one: the caller
// asks only for the claim the volume's PV names as its migration's copy now
// (mobility.ClaimAuthorizer), so the earlier one is a copy given up (a
// migration cancelled and started again, its copy's claim deleted or made
// again at a new size), whose mark would otherwise refuse the new copy for
// ever. The volume has not been staged since it was marked, so what the
// new claim reads is what the earlier one read; its Since changes, and with
// it the identity a pull of the earlier claim resumes from.
func (p *Pool) MarkMoving(id string, claim store.Claim) (*store.Volume, error) {
	return p.store.Update(id, func(v *store.Volume) error {
		switch {
		case v.State != store.Ready:
			return fmt.Errorf("volume %s is %s: %w", id, v.State, errkind.ErrNotFound)
		case v.Moving != nil && v.Moving.Claim.UID == claim.UID:
			return nil
		case v.Stage != nil || len(v.Publications) > 0:
			return fmt.Errorf("volume %s is staged: %w", id, errkind.ErrInUse)
		}
		v.Moving = &store.Moving{Claim: claim, Since: time.Now().UTC()}
		return nil
	})
}

// ClearMoving lets volume id be staged again (its migration was cancelled),
// if the mark is still the one of the copy claimUID: one a new copy took
// over since the caller read the volume stays (its last copy may be under
// way, and a write staged meanwhile would not follow it).
func (p *Pool) ClearMoving(id, claimUID string) error {
	_, err := p.store.Update(id, func(v *store.Volume) error {
		if v.Moving != nil && v.Moving.Claim.UID == claimUID {
			v.Moving = nil
		}
		return nil
	})
	return err
}

// Pulled returns the ready volumes a pull made whose claims no PV was
// yet seen to name (store.Volume.PulledFor).
func (p *Pool) Pulled() ([]*store.Volume, error) {
	return p.volumesWhere(func(v *store.Volume) bool { return v.State == store.Ready && v.PulledFor != nil })
}

// Claimed records that a PV names volume id: from then on it is the PV's,
// and never swept as pulled for nothing.
func (p *Pool) Claimed(id string) error {
	_, err := p.store.Update(id, func(v *store.Volume) error {
		v.PulledFor = nil
		return nil
	})
	return err
}

// MovingVolumes lists the volumes a migration took the last data of.
func (p *Pool) MovingVolumes() ([]*store.Volume, error) {
	return p.volumesWhere(func(v *store.Volume) bool { return v.Moving != nil })
}

// volumesWhere lists the volumes of the pool that match.
func (p *Pool) volumesWhere(match func(*store.Volume) bool) ([]*store.Volume, error) {
	vols, err := p.store.Volumes()
	if err != nil {
		return nil, err
	}
	var out []*store.Volume
	for _, v := range vols {
		if match(v) {
			out = append(out, v)
		}
	}
	return out, nil
}
