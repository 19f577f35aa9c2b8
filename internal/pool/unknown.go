package pool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/podvol/podvol/internal/device"
	"github.com/podvol/podvol/internal/errkind"
	"github.com/podvol/podvol/internal/store"
)

// What to do with image files the metadata store has no record of.
//
// Every image podvol makes is recorded (as creating) before the file exists,
// and removed before its record goes, so an image without a record is never
// podvol's own half-made work: it means the store was lost, replaced by a new
// one, or restored from an older backup. Those images hold users' data.
const (
	// UnknownRefuse: do not start; say what happened and what to do.
	UnknownRefuse = "refuse"
	// UnknownAdopt: record the images again, as volumes and snapshots.
	UnknownAdopt = "adopt"
	// UnknownDelete: delete them (the operator has decided they are junk).
	UnknownDelete = "delete"
)

// UnknownImagePolicies lists the valid values of Config.UnknownImages.
var UnknownImagePolicies = []string{UnknownRefuse, UnknownAdopt, UnknownDelete}

// AdoptedPrefix starts the name of a volume or snapshot adopted from an image
// the store did not know: its real name (the CO's) was in the lost store.
const AdoptedPrefix = "adopted:"

// reflinkProbePrefix names the scratch files CanReflink makes in the image
// directory; a crash during the probe leaves them, and they hold nothing.
const reflinkProbePrefix = ".reflink-probe-"

type unknownImage struct {
	path     string
	id       string
	snapshot bool
}

// accountForImages makes sure every image in the pool has a record before
// anything is recovered or served, applying policy to those that have none.
// Files whose names podvol never gives are left alone: they are not ours.
func (p *Pool) accountForImages(ctx context.Context, policy string) error {
	var unknown []unknownImage
	for _, dir := range []string{p.volDir, p.snapDir} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return fmt.Errorf("list %s: %w", dir, err)
		}
		for _, e := range entries {
			path := filepath.Join(dir, e.Name())
			if strings.HasPrefix(e.Name(), reflinkProbePrefix) {
				if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
					return fmt.Errorf("remove scratch file of an interrupted reflink probe: %w", err)
				}
				continue
			}
			id, isImage := strings.CutSuffix(e.Name(), ".img")
			snapshot := dir == p.snapDir
			if !isImage || !e.Type().IsRegular() || !p.Owns(id) || (snapshot && !ValidSnapshotID(id)) || (!snapshot && !ValidID(id)) {
				klog.InfoS("Leaving a file in the pool that podvol did not make", "path", path)
				continue
			}
			var err error
			if snapshot {
				_, err = p.store.Snapshot(id)
			} else {
				_, err = p.store.Volume(id)
			}
			switch {
			case errors.Is(err, store.ErrNotFound):
				unknown = append(unknown, unknownImage{path: path, id: id, snapshot: snapshot})
			case err != nil:
				return err
			}
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	switch policy {
	case UnknownAdopt:
		for _, u := range unknown {
			if err := p.adopt(ctx, u); err != nil {
				return err
			}
		}
		return nil
	case UnknownDelete:
		for _, u := range unknown {
			klog.InfoS("Deleting an image the metadata store does not know, as --unknown-images=delete asks", "path", u.path)
			if err := p.detachUnused(u.path); err != nil {
				return fmt.Errorf("delete unknown image %s: %w", u.path, err)
			}
			if err := os.Remove(u.path); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("delete unknown image: %w", err)
			}
		}
		return nil
	}
	var vols, snaps []string
	for _, u := range unknown {
		if u.snapshot {
			snaps = append(snaps, u.id)
		} else {
			vols = append(vols, u.id)
		}
	}
	return fmt.Errorf("pool %s holds %d volume image(s) %s and %d snapshot image(s) %s that its metadata store %s has no record of: "+
		"the store was lost, replaced by a new one, or restored from an older backup. Nothing was deleted. "+
		"Restore the newest podvol.db and restart; or restart with --unknown-images=adopt to record the images again "+
		"(ids and sizes come from the files; names and StorageClass parameters are lost, so adopted volumes get default parameters); "+
		"or with --unknown-images=delete if they are known to be junk: %w",
		p.dir, len(vols), brief(vols), len(snaps), brief(snaps), filepath.Join(p.dir, "podvol.db"), errkind.ErrUnaccounted)
}

// brief lists at most a few ids, so that the message stays readable.
func brief(ids []string) string {
	const n = 5
	if len(ids) > n {
		return "[" + strings.Join(ids[:n], " ") + fmt.Sprintf(" and %d more]", len(ids)-n)
	}
	return "[" + strings.Join(ids, " ") + "]"
}

// adopt records an unknown image as a ready volume or snapshot. Its size is
// the file's; its filesystem is what blkid finds on it (a blank or raw-block
// image is recorded as ext4, which is only used if it is ever formatted).
func (p *Pool) adopt(ctx context.Context, u unknownImage) error {
	fi, err := os.Lstat(u.path)
	if err != nil {
		return err
	}
	fs, err := p.dev.Probe(ctx, u.path)
	if err != nil {
		return fmt.Errorf("adopt %s: %w", u.path, err)
	}
	if !device.Filesystems[fs] {
		fs = "ext4"
	}
	now := time.Now().UTC()
	var params map[string]string
	if u.snapshot {
		err = p.store.CreateSnapshot(&store.Snapshot{ID: u.id, Name: AdoptedPrefix + u.id, SizeBytes: fi.Size(), FsType: fs, State: store.Ready, Created: now})
	} else {
		var perr error
		if params, perr = readParameters(u.path); perr != nil {
			// The data matters more than its parameters: adopted
			// with the defaults, as an image without them is.
			klog.ErrorS(perr, "Adopting a volume with default parameters: those recorded on its image cannot be read", "id", u.id)
		}
		err = p.store.Create(&store.Volume{ID: u.id, Name: AdoptedPrefix + u.id, SizeBytes: fi.Size(), FsType: fs, Parameters: params, State: store.Ready, Created: now})
	}
	if err != nil {
		return fmt.Errorf("adopt %s: %w", u.path, err)
	}
	klog.InfoS("Adopted an image the metadata store did not know", "id", u.id, "snapshot", u.snapshot, "sizeBytes", fi.Size(), "fsType", fs, "parameters", params)
	return nil
}
