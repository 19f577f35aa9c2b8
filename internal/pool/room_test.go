package pool_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/podvol/podvol/internal/device/devicetest"
	"github.com/podvol/podvol/internal/errkind"
	"github.com/podvol/podvol/internal/pool"
)

// What a filesystem can give a pool's images: its free space less its
// reserves, plus what the images hold already, less the store's keep and
// the block maps of images written whole, whatever their block size.
func TestRoom(t *testing.T) {
	for _, c := range []struct {
		what       string
		room       pool.Room
		kept, want int64 // MiB, kept rounded down
	}{
		// 900 MiB: 7 MiB for the maps of 225 Ki blocks of 4 KiB.
		{"empty", pool.Room{Free: 900 * MiB, Store: 16 * MiB, BlockSize: 4096}, 23, 876},
		{"its images count", pool.Room{Free: 400 * MiB, Images: 500 * MiB, Store: 16 * MiB, BlockSize: 4096}, 23, 876},
		{"block size unknown: 4 KiB", pool.Room{Free: 900 * MiB, Store: 16 * MiB}, 23, 876},
		{"1 KiB blocks: four times the maps", pool.Room{Free: 900 * MiB, Store: 16 * MiB, BlockSize: 1024}, 44, 855},
		{"a large store", pool.Room{Free: 900 * MiB, Store: 16*MiB + 100*MiB, BlockSize: 4096}, 123, 776},
		{"100 GiB: 0.8% for the maps", pool.Room{Free: 100 * GiB, Store: 16 * MiB, BlockSize: 4096}, 816, 101583},
		{"less than it keeps", pool.Room{Free: 10 * MiB, Store: 16 * MiB, BlockSize: 4096}, 16, 0},
	} {
		if kept, got := c.room.Kept()/MiB, c.room.Bytes(); kept != c.kept || got != c.want*MiB {
			t.Errorf("%s: %+v keeps %d MiB and gives %d bytes; want %d MiB and %d MiB", c.what, c.room, kept, got, c.kept, c.want)
		}
	}
	// Two pools on one filesystem: its free space once, both images and
	// both stores.
	a := pool.Room{Free: 900 * MiB, Images: 100 * MiB, Store: 16 * MiB, BlockSize: 4096}
	b := pool.Room{Free: 899 * MiB, Images: 50 * MiB, Store: 17 * MiB, BlockSize: 4096}
	if got, want := a.Plus(b), (pool.Room{Free: 899 * MiB, Images: 150 * MiB, Store: 33 * MiB, BlockSize: 4096}); got != want {
		t.Errorf("%+v plus %+v: %+v, want %+v", a, b, got, want)
	}
}

// A pool given no capacity takes its room, measured at open: the images'
// blocks count in it, the store's keep is kept.
func TestDefaultCapacityIsTheRoom(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pool")
	dev := devicetest.New()
	p, err := pool.Open(pool.Config{Dir: dir, Device: dev})
	must(t, err)
	total, _ := p.Capacity()
	room := p.Room()
	if total != room.Bytes() || total <= 0 || room.Free <= 0 || room.Images != 0 || room.Store < 16*MiB {
		t.Fatalf("capacity %d, room %+v", total, room)
	}
	v, err := p.CreateVolume(ctx, pool.CreateRequest{Name: "v", SizeBytes: 64 * MiB})
	must(t, err)
	f, err := os.OpenFile(p.ImagePath(v.ID), os.O_WRONLY, 0)
	must(t, err)
	_, err = f.WriteAt(make([]byte, 4*MiB), 8*MiB)
	must(t, err)
	must(t, f.Sync())
	must(t, f.Close())
	must(t, p.Close())
	p, err = pool.Open(pool.Config{Dir: dir, Device: dev})
	must(t, err)
	t.Cleanup(func() { must(t, p.Close()) })
	if got := p.Room().Images; got < 4*MiB || got > 5*MiB {
		t.Errorf("the pool's images hold %d bytes; 4 MiB were written", got)
	}
	if total, _ := p.Capacity(); total != p.Room().Bytes() {
		t.Errorf("capacity %d, room %d", total, p.Room().Bytes())
	}
}

// A pool whose volumes were promised more than its room (a capacity lowered
// or dropped, a filesystem others filled) still opens: its volumes stay,
// and it admits nothing more until enough of them go.
func TestPoolPromisedBeyondItsRoomOpens(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pool")
	dev := devicetest.New()
	p, err := pool.Open(pool.Config{Dir: dir, Device: dev})
	must(t, err)
	big := p.Room().Bytes() + GiB
	must(t, p.Close())
	p, err = pool.Open(pool.Config{Dir: dir, Device: dev, Capacity: 2 * big})
	must(t, err)
	v, err := p.CreateVolume(ctx, pool.CreateRequest{Name: "big", SizeBytes: big})
	must(t, err)
	must(t, p.Close())

	p, err = pool.Open(pool.Config{Dir: dir, Device: dev})
	must(t, err)
	t.Cleanup(func() { must(t, p.Close()) })
	if total, allocated := p.Capacity(); total >= allocated || allocated != big {
		t.Fatalf("capacity %d, allocated %d: want the room, below the %d promised", total, allocated, big)
	}
	if _, err := p.ReadyVolume(v.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := p.CreateVolume(ctx, pool.CreateRequest{Name: "small", SizeBytes: MiB}); !errors.Is(err, errkind.ErrNoSpace) {
		t.Fatalf("a volume in a pool promised beyond its room: %v, want ErrNoSpace", err)
	}
	must(t, p.DeleteVolume(ctx, v.ID))
	if _, err := p.CreateVolume(ctx, pool.CreateRequest{Name: "small", SizeBytes: MiB}); err != nil {
		t.Fatalf("once the volume is deleted: %v", err)
	}
}

// A capacity the start reduces (cmd/podvol-plugin: a filesystem others
// filled below it) admits up to the reduced figure, keeps the one given,
// and says so in what it refuses.
func TestReducedCapacity(t *testing.T) {
	dev := devicetest.New()
	p, err := pool.Open(pool.Config{Dir: filepath.Join(t.TempDir(), "pool"), Device: dev, Capacity: 10 * GiB})
	must(t, err)
	t.Cleanup(func() { must(t, p.Close()) })
	p.ReduceCapacity(100 * MiB)
	p.ReduceCapacity(200 * MiB) // never raised
	if total, _ := p.Capacity(); total != 100*MiB || p.ConfiguredCapacity() != 10*GiB {
		t.Fatalf("capacity %d, configured %d", total, p.ConfiguredCapacity())
	}
	_, err = p.CreateVolume(ctx, pool.CreateRequest{Name: "big", SizeBytes: 101 * MiB})
	if !errors.Is(err, errkind.ErrNoSpace) || !strings.Contains(err.Error(), "was reduced to 104857600 at the plugin's start") {
		t.Fatalf("a volume beyond the reduced capacity: %v", err)
	}
	if _, err := p.CreateVolume(ctx, pool.CreateRequest{Name: "fits", SizeBytes: 100 * MiB}); err != nil {
		t.Fatalf("a volume within the reduced capacity: %v", err)
	}
}
