package pool

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/podvol/podvol/internal/device"
)

// Room is what the filesystem holding a pool can give the pool's images, as
// measured when the pool opened: the pool's capacity when none is given, and
// the most a given capacity may be without --force-capacity. Volumes are
// sparse images, so capacity is a promise that each may be written whole;
// the filesystem's size is not that promise: its metadata, its reserves,
// the images' own mapping blocks, the metadata store and whatever else it
// holds take part of it.
type Room struct {
	// Free is the filesystem's free space less its reserves (statfs
	// f_bavail: ext4's blocks for root and for itself, XFS's reserve
	// pool and per-AG reservations): what it still gives a writer.
	Free int64
	// Images is what the pool's images take now: their data, a block
	// several share (reflink) once, and the blocks that map it. They are
	// the pool's own promise, so they count as room.
	Images int64
	// Store is kept back for the metadata store and the pool's inodes and
	// directories: as much again as the store is, and storeKeep.
	Store int64
	// BlockSize is the filesystem's allocation unit (0: not known).
	BlockSize int64
}

// storeKeep is kept back for each pool's metadata store (bbolt grows its
// file 16 MiB at a time once past 16 MiB), the images' inodes (XFS
// allocates them from free space) and the transient reservation each
// allocation of an image block makes.
const storeKeep = 16 << 20

// mapRecordBytes is what one extent takes in an image's block map, kept
// back per block of the filesystem: an XFS bmbt record is 16 bytes (ext4's
// extent 12). Twice that, because a B-tree block may be half full: the
// worst case is an image whose every block is an extent of its own (random
// 4 KiB writes into many sparse images at once measured 0.5% on XFS).
const mapRecordBytes = 2 * 16

// Kept is what the room keeps back from Free+Images: the stores' keep, and
// the block maps of images written whole in the worst case.
func (r Room) Kept() int64 {
	bs := r.BlockSize
	if bs < 512 {
		bs = 4096
	}
	all := max(r.Free+r.Images, 0)
	return r.Store + (all/bs+1)*mapRecordBytes
}

// Bytes is what the images may be promised: Free + Images - Kept, in whole
// MiB, never below 0.
func (r Room) Bytes() int64 {
	return max(r.Free+r.Images-r.Kept(), 0) &^ (1<<20 - 1)
}

// Plus is the room of two pools on one filesystem: the filesystem's free
// space once (the smaller measure, as later), both pools' images and
// stores.
func (r Room) Plus(o Room) Room {
	return Room{Free: min(r.Free, o.Free), Images: r.Images + o.Images, Store: r.Store + o.Store, BlockSize: max(r.BlockSize, o.BlockSize)}
}

// String says where the figure comes from, for a person.
func (r Room) String() string {
	return fmt.Sprintf("%s: %s free less the filesystem's reserves, plus %s the pool's images hold, less %s kept back for their block maps and the metadata store",
		mib(r.Bytes()), mib(r.Free), mib(r.Images), mib(r.Kept()))
}

// mib is n bytes for a person, in MiB.
func mib(n int64) string { return fmt.Sprintf("%d MiB", n>>20) }

// Room is the pool's room as measured when it opened.
func (p *Pool) Room() Room { return p.room }

// measureRoom measures the pool's room. The images are measured before the
// filesystem: what is written to them meanwhile then counts in neither
// rather than in both, and the figure errs low.
func (p *Pool) measureRoom() (Room, error) {
	var files []string
	for _, dir := range []string{p.volDir, p.snapDir} {
		ents, err := os.ReadDir(dir)
		if err != nil {
			return Room{}, fmt.Errorf("measure the pool's images: %w", err)
		}
		for _, e := range ents {
			if e.Type().IsRegular() {
				files = append(files, filepath.Join(dir, e.Name()))
			}
		}
	}
	images, err := device.Occupied(files, p.reflink)
	if err != nil {
		return Room{}, fmt.Errorf("measure the pool's images: %w", err)
	}
	var store int64
	if fi, err := os.Stat(filepath.Join(p.dir, "podvol.db")); err == nil {
		store = fi.Size()
	} else if !errors.Is(err, os.ErrNotExist) {
		return Room{}, err
	}
	fs, err := p.dev.Statfs(p.dir)
	if err != nil {
		return Room{}, err
	}
	return Room{Free: fs.AvailableBytes, Images: images, Store: storeKeep + store, BlockSize: fs.BlockSize}, nil
}
