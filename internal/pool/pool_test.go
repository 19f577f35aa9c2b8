package pool_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/podvol/podvol/internal/device"
	"github.com/podvol/podvol/internal/device/devicetest"
	"github.com/podvol/podvol/internal/errkind"
	"github.com/podvol/podvol/internal/pool"
	"github.com/podvol/podvol/internal/size"
	"github.com/podvol/podvol/internal/store"
)

var ctx = context.Background()

const (
	MiB = size.MiB
	GiB = size.GiB
)

type env struct {
	t   *testing.T
	dir string
	dev *devicetest.Fake
	p   *pool.Pool
}

func newEnv(t *testing.T, capacity int64) *env {
	t.Helper()
	dir, err := filepath.EvalSymlinks(t.TempDir())
	must(t, err)
	e := &env{t: t, dir: filepath.Join(dir, "pool"), dev: devicetest.New()}
	p, err := e.open(capacity, "")
	must(t, err)
	e.p = p
	t.Cleanup(func() {
		if e.p != nil {
			if err := e.p.Close(); err != nil {
				t.Error(err)
			}
		}
	})
	return e
}

func (e *env) open(capacity int64, unknown string) (*pool.Pool, error) {
	return pool.Open(pool.Config{Dir: e.dir, Capacity: capacity, UnknownImages: unknown, Device: e.dev})
}

// reopen closes the pool and opens it again with policy for unknown images.
func (e *env) reopen(policy string) error {
	e.t.Helper()
	if e.p != nil {
		must(e.t, e.p.Close())
		e.p = nil
	}
	p, err := e.open(10*GiB, policy)
	if err == nil {
		e.p = p
	}
	return err
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func wantErr(t *testing.T, err, kind error, what string) {
	t.Helper()
	if !errors.Is(err, kind) {
		t.Fatalf("%s: %v, want %v", what, err, kind)
	}
}

func (e *env) create(name string, size int64) *store.Volume {
	e.t.Helper()
	v, err := e.p.CreateVolume(ctx, pool.CreateRequest{Name: name, SizeBytes: size, FsType: "ext4"})
	must(e.t, err)
	return v
}

// writeAt writes b into the file at path at off, as a volume's writes reach
// its image.
func writeAt(t *testing.T, path string, off int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	must(t, err)
	defer f.Close()
	_, err = f.WriteAt(b, off)
	must(t, err)
	must(t, f.Sync())
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	must(t, err)
	return fi.Size()
}

func gone(t *testing.T, path string) {
	t.Helper()
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Fatalf("%s is still there (%v)", path, err)
	}
}

func TestCreateVolumeIdempotent(t *testing.T) {
	e := newEnv(t, 10*GiB)
	r := pool.CreateRequest{Name: "pvc-1", SizeBytes: 64 * MiB, FsType: "ext4", Parameters: map[string]string{"fsType": "ext4"}}
	v, err := e.p.CreateVolume(ctx, r)
	must(t, err)
	if v.State != store.Ready || fileSize(t, e.p.ImagePath(v.ID)) != 64*MiB {
		t.Fatalf("volume %+v, image %d bytes", v, fileSize(t, e.p.ImagePath(v.ID)))
	}
	again, err := e.p.CreateVolume(ctx, r)
	if err != nil || again.ID != v.ID {
		t.Fatalf("repeated create: %v, %v (first %s)", again, err, v.ID)
	}
	for what, mod := range map[string]func(*pool.CreateRequest){
		"size":       func(r *pool.CreateRequest) { r.SizeBytes *= 2 },
		"filesystem": func(r *pool.CreateRequest) { r.FsType = "xfs" },
		"parameters": func(r *pool.CreateRequest) { r.Parameters = map[string]string{"fsType": "xfs"} },
	} {
		r2 := r
		mod(&r2)
		_, err := e.p.CreateVolume(ctx, r2)
		wantErr(t, err, errkind.ErrConflict, "create of the same name with another "+what)
	}
	if vols, _ := e.p.Store().Volumes(); len(vols) != 1 {
		t.Fatalf("%d volumes", len(vols))
	}
}

func TestDeleteVolumeIdempotent(t *testing.T) {
	e := newEnv(t, 10*GiB)
	v := e.create("pvc-1", 64*MiB)
	img := e.p.ImagePath(v.ID)
	// A loop device a crash left on the image goes with it.
	_, err := e.dev.AttachLoop(img, device.LoopOptions{})
	must(t, err)
	must(t, e.p.DeleteVolume(ctx, v.ID))
	gone(t, img)
	if left := e.dev.Leftovers(); len(left) != 0 {
		t.Fatalf("left: %v", left)
	}
	if _, err := e.p.Store().Volume(v.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("record after delete: %v", err)
	}
	for _, id := range []string{v.ID, "pv-000000000000000000000000", "../../etc/passwd", ""} {
		must(t, e.p.DeleteVolume(ctx, id))
	}
	// The name can be used again.
	if w := e.create("pvc-1", 64*MiB); w.ID == v.ID {
		t.Fatal("a new volume got the deleted one's id")
	}
}

func TestDeleteVolumeInUse(t *testing.T) {
	e := newEnv(t, 10*GiB)
	staged, mounted := e.create("staged", 64*MiB), e.create("mounted", 64*MiB)
	_, err := e.p.Store().Update(staged.ID, func(v *store.Volume) error {
		v.Stage = &store.Stage{Path: "/staging", State: store.Staged}
		return nil
	})
	must(t, err)
	wantErr(t, e.p.DeleteVolume(ctx, staged.ID), errkind.ErrInUse, "delete of a staged volume")

	// No record says so, but its filesystem is mounted: still in use.
	dev, err := e.dev.AttachLoop(e.p.ImagePath(mounted.ID), device.LoopOptions{})
	must(t, err)
	must(t, e.dev.Format(ctx, dev, "ext4"))
	mnt := t.TempDir()
	must(t, e.dev.Mount(ctx, dev, mnt, "ext4", nil))
	wantErr(t, e.p.DeleteVolume(ctx, mounted.ID), errkind.ErrInUse, "delete of a mounted volume")
	if fileSize(t, e.p.ImagePath(mounted.ID)) != 64*MiB || e.dev.LoopBackingFile(dev) != e.p.ImagePath(mounted.ID) {
		t.Fatal("the mounted volume's image or loop device went")
	}
	// Its record says deleting: a retry, or the next start, finishes.
	must(t, e.dev.Unmount(mnt))
	must(t, e.p.DeleteVolume(ctx, mounted.ID))
	gone(t, e.p.ImagePath(mounted.ID))
}

// However many volumes, snapshots and growths race for the last bytes, the
// pool never promises more than its capacity.
func TestCapacityNeverOversubscribed(t *testing.T) {
	for round := range 16 {
		t.Run(fmt.Sprint(round), raceForCapacity)
	}
}

func raceForCapacity(t *testing.T) {
	e := newEnv(t, 10*GiB)
	src := e.create("source", 1*GiB)
	grown := e.create("grown", 1*GiB)
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := 0
	var unexpected []error
	start := make(chan struct{}) // all at once
	try := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case err == nil:
			admitted++
		case !errors.Is(err, errkind.ErrNoSpace):
			unexpected = append(unexpected, err)
		}
	}
	for i := range 48 {
		wg.Add(3)
		go func() {
			defer wg.Done()
			<-start
			_, err := e.p.CreateVolume(ctx, pool.CreateRequest{Name: fmt.Sprint("v", i), SizeBytes: 1 * GiB, FsType: "ext4"})
			try(err)
		}()
		go func() {
			defer wg.Done()
			<-start
			_, err := e.p.CreateSnapshot(pool.SnapshotRequest{Name: fmt.Sprint("s", i), SourceID: src.ID})
			try(err)
		}()
		go func() {
			defer wg.Done()
			<-start
			// Growths to sizes from 2 to 9 GiB, in any order: one
			// smaller than the size reached meanwhile is a shrink.
			_, err := e.p.GrowVolume(grown.ID, int64(2+i%8)*GiB)
			if err == nil || errors.Is(err, errkind.ErrOutOfRange) {
				return // counted below from the record
			}
			try(err)
		}()
	}
	close(start)
	wg.Wait()
	if len(unexpected) > 0 {
		t.Fatalf("unexpected errors: %v", unexpected)
	}
	total, allocated := e.p.Capacity()
	if allocated > total {
		t.Fatalf("oversubscribed: %d of %d bytes promised", allocated, total)
	}
	g, err := e.p.Store().Volume(grown.ID)
	must(t, err)
	if want := 2*GiB + int64(admitted)*GiB + (g.SizeBytes - GiB); allocated != want {
		t.Fatalf("allocated %d, but the records add up to %d", allocated, want)
	}
	if allocated != total {
		t.Fatalf("%d of %d bytes allocated: the pool refused what it had room for", allocated, total)
	}
	// A volume that does not fit says by how much.
	_, err = e.p.CreateVolume(ctx, pool.CreateRequest{Name: "one-more", SizeBytes: MiB, FsType: "ext4"})
	wantErr(t, err, errkind.ErrNoSpace, "create in a full pool")
	if !strings.Contains(err.Error(), "0 of 10737418240 free") {
		t.Fatalf("message: %v", err)
	}
}

// A snapshot cut for a transfer takes of its pool what its volume's image
// holds when it is cut, not the volume's size: that is all its image can
// ever pin. A pool with less room than a volume's size can still cut one
// for a volume's pre-copy (where a VolumeSnapshot's, counted at its full
// size as kubectl podvol status adds it up, is refused), and refuses one
// whose source grew past the room while it was cut.
func TestTransferSnapshotTakesWhatItsVolumeHolds(t *testing.T) {
	e := newEnv(t, 80*MiB)
	v := e.create("v", 64*MiB)
	w := e.create("w", 8*MiB)
	writeAt(t, e.p.ImagePath(v.ID), 0, bytes.Repeat([]byte{1}, int(4*MiB)))
	writeAt(t, e.p.ImagePath(w.ID), 0, bytes.Repeat([]byte{2}, int(MiB)))
	claim := func(uid string) *store.Claim { return &store.Claim{Namespace: "team-a", Name: "copy-" + uid, UID: uid} }

	_, err := e.p.CreateSnapshot(pool.SnapshotRequest{Name: "vs", SourceID: v.ID})
	wantErr(t, err, errkind.ErrNoSpace, "a VolumeSnapshot's snapshot, counted at its full 64 MiB, with 8 MiB free")
	s, err := e.p.CreateSnapshot(pool.SnapshotRequest{Name: pool.TransferSnapshotName("u1"), SourceID: v.ID, For: claim("u1")})
	must(t, err) // before, counted at 64 MiB: refused as the one above
	if s.Held() != 4*MiB || s.SizeBytes != 64*MiB {
		t.Fatalf("snapshot holds %d bytes of the pool and restores to %d, want 4 MiB and 64 MiB", s.Held(), s.SizeBytes)
	}
	if _, allocated := e.p.Capacity(); allocated != 76*MiB {
		t.Fatalf("%d bytes allocated, want 76 MiB", allocated)
	}

	// Written after the measure and before the cut (a raw block volume is
	// not frozen): w held 1 MiB, which fits the 4 MiB left, and its
	// snapshot 5 MiB, which does not.
	e.dev.Inject(devicetest.CopyImage, func(string) error {
		writeAt(t, e.p.ImagePath(w.ID), 2*MiB, bytes.Repeat([]byte{3}, int(4*MiB)))
		return nil
	})
	_, err = e.p.CreateSnapshot(pool.SnapshotRequest{Name: pool.TransferSnapshotName("u2"), SourceID: w.ID, For: claim("u2")})
	e.dev.Inject(devicetest.CopyImage, nil)
	wantErr(t, err, errkind.ErrNoSpace, "snapshot that grew past the room left while cut")
	if _, err := e.p.Store().SnapshotByName(pool.TransferSnapshotName("u2")); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the refused snapshot's record: %v", err)
	}
	if imgs, _ := filepath.Glob(filepath.Join(filepath.Dir(e.p.SnapshotPath(s.ID)), "*.img")); len(imgs) != 1 {
		t.Fatalf("snapshot images %v, want the first one's only", imgs)
	}
	if _, allocated := e.p.Capacity(); allocated != 76*MiB {
		t.Fatalf("%d bytes allocated after the refusal, want 76 MiB", allocated)
	}
	// The ledger is the records' sum after a restart too.
	must(t, e.reopen(""))
	if _, allocated := e.p.Capacity(); allocated != 76*MiB {
		t.Fatalf("%d bytes allocated after a restart, want 76 MiB", allocated)
	}
}

func TestGrowVolume(t *testing.T) {
	e := newEnv(t, 2*GiB)
	v := e.create("v", 1*GiB)
	_, err := e.p.GrowVolume(v.ID, 512*MiB)
	wantErr(t, err, errkind.ErrOutOfRange, "shrink")
	_, err = e.p.GrowVolume(v.ID, 3*GiB)
	wantErr(t, err, errkind.ErrNoSpace, "grow beyond the pool")
	if fileSize(t, e.p.ImagePath(v.ID)) != GiB {
		t.Fatal("the image grew although the growth was refused")
	}
	w, err := e.p.GrowVolume(v.ID, 2*GiB)
	must(t, err)
	if w.SizeBytes != 2*GiB || !w.GrowFs || fileSize(t, e.p.ImagePath(v.ID)) != 2*GiB {
		t.Fatalf("after growth: %+v, image %d", w, fileSize(t, e.p.ImagePath(v.ID)))
	}
	_, err = e.p.GrowVolume(v.ID, 2*GiB) // again: done
	must(t, err)
}

// Operations a crash interrupted are finished at start: half-made volumes
// and snapshots are rolled back, half-deleted ones deleted, half-grown
// images grown.
func TestRecoverInterruptedOperations(t *testing.T) {
	e := newEnv(t, 10*GiB)
	creating := e.create("creating", 64*MiB)
	deleting := e.create("deleting", 64*MiB)
	growing := e.create("growing", 64*MiB)
	noImage := &store.Volume{ID: "pv-0123456789abcdef01234567", Name: "no-image", SizeBytes: 64 * MiB, FsType: "ext4", State: store.Creating}
	must(t, e.p.Store().Create(noImage))
	snap, err := e.p.CreateSnapshot(pool.SnapshotRequest{Name: "snap", SourceID: growing.ID})
	must(t, err)
	set := func(id, state string) {
		_, err := e.p.Store().Update(id, func(v *store.Volume) error { v.State = state; return nil })
		must(t, err)
	}
	set(creating.ID, store.Creating)
	set(deleting.ID, store.Deleting)
	_, err = e.p.Store().UpdateSnapshot(snap.ID, func(s *store.Snapshot) { s.State = store.Creating })
	must(t, err)
	_, err = e.p.Store().Update(growing.ID, func(v *store.Volume) error { v.SizeBytes = 96 * MiB; return nil })
	must(t, err)
	// A crash left a loop device on the image being deleted.
	_, err = e.dev.AttachLoop(e.p.ImagePath(deleting.ID), device.LoopOptions{})
	must(t, err)

	must(t, e.reopen(""))
	must(t, e.p.Recover(ctx))
	for _, v := range []*store.Volume{creating, deleting, noImage} {
		gone(t, e.p.ImagePath(v.ID))
		if _, err := e.p.Store().Volume(v.ID); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("record of %s: %v", v.Name, err)
		}
	}
	gone(t, e.p.SnapshotPath(snap.ID))
	if _, err := e.p.Store().Snapshot(snap.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("snapshot record: %v", err)
	}
	if got := fileSize(t, e.p.ImagePath(growing.ID)); got != 96*MiB {
		t.Fatalf("interrupted growth: image is %d bytes", got)
	}
	if left := e.dev.Leftovers(); len(left) != 0 {
		t.Fatalf("left: %v", left)
	}
	// The provisioner's retry creates the volume afresh.
	if v := e.create("creating", 64*MiB); v.ID == creating.ID {
		t.Fatal("the rolled-back volume came back")
	}
}

func TestSnapshotRestoreAndClone(t *testing.T) {
	e := newEnv(t, 10*GiB)
	src := e.create("src", 64*MiB)
	dev, err := e.dev.AttachLoop(e.p.ImagePath(src.ID), device.LoopOptions{})
	must(t, err)
	must(t, e.dev.Format(ctx, dev, "ext4"))
	must(t, e.dev.DetachLoop(dev, e.p.ImagePath(src.ID)))

	quiesced, undone := 0, 0
	quiesce := func(id string) (func(), error) {
		if id != src.ID {
			t.Errorf("quiesced %s, not the source", id)
		}
		quiesced++
		return func() { undone++ }, nil
	}
	snap, err := e.p.CreateSnapshot(pool.SnapshotRequest{Name: "s", SourceID: src.ID, Quiesce: quiesce})
	must(t, err)
	again, err := e.p.CreateSnapshot(pool.SnapshotRequest{Name: "s", SourceID: src.ID, Quiesce: quiesce})
	if err != nil || again.ID != snap.ID || quiesced != 1 {
		t.Fatalf("repeated snapshot: %v, %v; quiesced %d times", again, err, quiesced)
	}
	restored, err := e.p.CreateVolume(ctx, pool.CreateRequest{Name: "restored", SizeBytes: 128 * MiB, FsType: "ext4", Source: &store.Source{Kind: store.FromSnapshot, ID: snap.ID}})
	must(t, err)
	clone, err := e.p.CreateVolume(ctx, pool.CreateRequest{Name: "clone", SizeBytes: 64 * MiB, FsType: "ext4", Source: &store.Source{Kind: store.FromVolume, ID: src.ID}, Quiesce: quiesce})
	must(t, err)
	if quiesced != 2 || undone != 2 {
		t.Fatalf("quiesced %d, undone %d", quiesced, undone)
	}
	for _, v := range []*store.Volume{restored, clone} {
		if sig, _ := devicetest.ReadSignature(e.p.ImagePath(v.ID)); sig == nil || sig.Type != "ext4" {
			t.Fatalf("%s holds %+v", v.Name, sig)
		}
	}
	if !restored.GrowFs || clone.GrowFs {
		t.Fatalf("pending growth: restored (larger) %v, clone (same size) %v", restored.GrowFs, clone.GrowFs)
	}
	if got := fileSize(t, e.p.ImagePath(restored.ID)); got != 128*MiB {
		t.Fatalf("restored image is %d bytes", got)
	}
	_, err = e.p.CreateVolume(ctx, pool.CreateRequest{Name: "small", SizeBytes: 32 * MiB, FsType: "ext4", Source: &store.Source{Kind: store.FromSnapshot, ID: snap.ID}})
	wantErr(t, err, errkind.ErrOutOfRange, "restore into a smaller volume")
	_, err = e.p.CreateVolume(ctx, pool.CreateRequest{Name: "xfs", SizeBytes: 512 * MiB, FsType: "xfs", Source: &store.Source{Kind: store.FromSnapshot, ID: snap.ID}})
	wantErr(t, err, errkind.ErrInvalid, "restore of ext4 as xfs")
	// The source can go; its snapshot stays.
	must(t, e.p.DeleteVolume(ctx, src.ID))
	if _, err := e.p.ReadySnapshot(snap.ID); err != nil {
		t.Fatalf("snapshot after its source went: %v", err)
	}
	must(t, e.p.DeleteSnapshot(snap.ID))
	must(t, e.p.DeleteSnapshot(snap.ID))
	gone(t, e.p.SnapshotPath(snap.ID))
}

// A copy that fails leaves nothing: no record, no image, no capacity taken,
// and the source is thawed.
func TestFailedCopiesLeaveNothing(t *testing.T) {
	e := newEnv(t, 10*GiB)
	src := e.create("src", 1*GiB)
	boom := errors.New("copy_file_range: no space left on device")
	e.dev.Inject(devicetest.CopyImage, func(string) error { return boom })
	undone := 0
	quiesce := func(string) (func(), error) { return func() { undone++ }, nil }
	_, err := e.p.CreateSnapshot(pool.SnapshotRequest{Name: "s", SourceID: src.ID, Quiesce: quiesce})
	if !errors.Is(err, boom) {
		t.Fatalf("snapshot: %v", err)
	}
	_, err = e.p.CreateVolume(ctx, pool.CreateRequest{Name: "clone", SizeBytes: GiB, FsType: "ext4", Source: &store.Source{Kind: store.FromVolume, ID: src.ID}, Quiesce: quiesce})
	if !errors.Is(err, boom) {
		t.Fatalf("clone: %v", err)
	}
	if undone != 2 {
		t.Fatalf("undone %d times, want 2", undone)
	}
	if _, allocated := e.p.Capacity(); allocated != GiB {
		t.Fatalf("allocated %d after failed copies", allocated)
	}
	for _, d := range []string{"volumes", "snapshots"} {
		ents, _ := os.ReadDir(filepath.Join(e.dir, d))
		for _, ent := range ents {
			if d == "snapshots" || !strings.HasPrefix(ent.Name(), src.ID) {
				t.Fatalf("left in %s: %s", d, ent.Name())
			}
		}
	}
	// A quiesce that fails stops the copy before it starts.
	e.dev.Inject(devicetest.CopyImage, nil)
	_, err = e.p.CreateSnapshot(pool.SnapshotRequest{Name: "s", SourceID: src.ID, Quiesce: func(string) (func(), error) { return nil, errkind.ErrInUse }})
	wantErr(t, err, errkind.ErrInUse, "snapshot whose quiesce failed")
	if n := len(e.dev.Copies()); n != 0 {
		t.Fatalf("%d copies made", n)
	}
}

func TestUnknownImages(t *testing.T) {
	// makePool leaves a pool with two volumes (one xfs, one blank), a
	// snapshot, and files podvol did not make, then loses its store.
	makePool := func(t *testing.T, lose func(db string)) (*env, []string, []string) {
		e := newEnv(t, 10*GiB)
		xfs := e.create("xfs", 512*MiB)
		dev, err := e.dev.AttachLoop(e.p.ImagePath(xfs.ID), device.LoopOptions{})
		must(t, err)
		must(t, e.dev.Format(ctx, dev, "xfs"))
		must(t, e.dev.DetachLoop(dev, e.p.ImagePath(xfs.ID)))
		blank := e.create("blank", 64*MiB)
		snap, err := e.p.CreateSnapshot(pool.SnapshotRequest{Name: "s", SourceID: blank.ID})
		must(t, err)
		images := []string{e.p.ImagePath(xfs.ID), e.p.ImagePath(blank.ID), e.p.SnapshotPath(snap.ID)}
		var foreign []string
		for _, name := range []string{"volumes/notes.txt", "volumes/pv-short.img", "snapshots/pv-0123456789abcdef01234567.img", "keep"} {
			p := filepath.Join(e.dir, name)
			must(t, os.WriteFile(p, []byte("not podvol's"), 0o600))
			foreign = append(foreign, p)
		}
		must(t, e.p.Close())
		e.p = nil
		lose(filepath.Join(e.dir, "podvol.db"))
		return e, images, foreign
	}
	missing := func(db string) { must(t, os.Remove(db)) }
	empty := func(db string) {
		must(t, os.Remove(db))
		s, err := store.Open(db)
		must(t, err)
		must(t, s.Close())
	}
	for name, lose := range map[string]func(string){"missing store": missing, "empty store": empty} {
		t.Run(name, func(t *testing.T) {
			e, images, foreign := makePool(t, lose)
			for range 2 {
				err := e.reopen("")
				wantErr(t, err, errkind.ErrUnaccounted, "open with the store lost")
				if !strings.Contains(err.Error(), "2 volume image(s)") || !strings.Contains(err.Error(), "1 snapshot image(s)") || !strings.Contains(err.Error(), "--unknown-images=adopt") {
					t.Fatalf("message: %v", err)
				}
			}
			for _, p := range append(images, foreign...) {
				fileSize(t, p)
			}
		})
	}
	t.Run("adopt", func(t *testing.T) {
		e, images, foreign := makePool(t, missing)
		// A crash in the reflink probe left its scratch file.
		probe := filepath.Join(e.dir, "volumes", ".reflink-probe-123")
		must(t, os.WriteFile(probe, nil, 0o600))
		must(t, e.reopen(pool.UnknownAdopt))
		gone(t, probe)
		vols, _ := e.p.Store().Volumes()
		snaps, _ := e.p.Store().Snapshots()
		if len(vols) != 2 || len(snaps) != 1 {
			t.Fatalf("adopted %d volumes, %d snapshots", len(vols), len(snaps))
		}
		fs := map[string]string{}
		for _, v := range vols {
			fs[e.p.ImagePath(v.ID)] = v.FsType
			if v.State != store.Ready || !strings.HasPrefix(v.Name, pool.AdoptedPrefix) || v.SizeBytes != fileSize(t, e.p.ImagePath(v.ID)) {
				t.Fatalf("adopted volume %+v", v)
			}
		}
		if fs[images[0]] != "xfs" || fs[images[1]] != "ext4" {
			t.Fatalf("adopted filesystems: %v", fs)
		}
		if _, allocated := e.p.Capacity(); allocated != 512*MiB+2*64*MiB {
			t.Fatalf("capacity does not count the adopted images: %d", allocated)
		}
		for _, p := range append(images, foreign...) {
			fileSize(t, p)
		}
		// Adopted, they are ordinary volumes: the next start is clean.
		must(t, e.reopen(""))
	})
	t.Run("delete", func(t *testing.T) {
		e, images, foreign := makePool(t, empty)
		dev, err := e.dev.AttachLoop(images[1], device.LoopOptions{})
		must(t, err)
		must(t, e.reopen(pool.UnknownDelete))
		for _, p := range images {
			gone(t, p)
		}
		for _, p := range foreign {
			fileSize(t, p)
		}
		if e.dev.LoopBackingFile(dev) != "" {
			t.Fatal("the deleted image's loop device is still attached")
		}
	})
	t.Run("delete refuses a mounted image", func(t *testing.T) {
		e, images, _ := makePool(t, missing)
		dev, err := e.dev.AttachLoop(images[0], device.LoopOptions{})
		must(t, err)
		mnt := t.TempDir()
		must(t, e.dev.Mount(ctx, dev, mnt, "xfs", nil))
		wantErr(t, e.reopen(pool.UnknownDelete), errkind.ErrInUse, "delete of a mounted unknown image")
		fileSize(t, images[0])
	})
}

// Opening is quick whatever the fake's state: no wait, no retry loop.
func TestOpenIsQuick(t *testing.T) {
	start := time.Now()
	newEnv(t, 0) // capacity from the real statfs of the pool's directory
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("open took %v", d)
	}
}

// A volume adopted after its store was lost keeps the StorageClass
// parameters it was created with (issue 25, item 8): a direct-assigned
// volume adopted as directAssign=never would be mounted on the host, with a
// filesystem a guest wrote, instead of being handed to its microVM. A clone
// carries its own request's parameters.
func TestAdoptKeepsParameters(t *testing.T) {
	e := newEnv(t, 10*GiB)
	params := map[string]string{"directAssign": "always", "fsGroupChangePolicy": "OnRootMismatch"}
	v, err := e.p.CreateVolume(ctx, pool.CreateRequest{Name: "kata", SizeBytes: 64 * MiB, FsType: "ext4", Parameters: params})
	must(t, err)
	clone, err := e.p.CreateVolume(ctx, pool.CreateRequest{Name: "clone", SizeBytes: 64 * MiB, FsType: "ext4",
		Parameters: map[string]string{"directAssign": "auto"}, Source: &store.Source{Kind: store.FromVolume, ID: v.ID}})
	must(t, err)
	plain := e.create("plain", 64*MiB)
	must(t, e.p.Close())
	e.p = nil
	must(t, os.Remove(filepath.Join(e.dir, "podvol.db")))
	must(t, e.reopen(pool.UnknownAdopt))
	for id, want := range map[string]map[string]string{v.ID: params, clone.ID: {"directAssign": "auto"}, plain.ID: nil} {
		got, err := e.p.Store().Volume(id)
		must(t, err)
		if !maps.Equal(got.Parameters, want) {
			t.Fatalf("adopted volume %s has parameters %v, want %v", id, got.Parameters, want)
		}
	}
}

// A pool opened without a machine is refused before it touches anything:
// a test that forgets the fake must fail, not attach loop devices and take
// the host's capacity.
func TestOpenWithoutDeviceIsRefused(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pool")
	p, err := pool.Open(pool.Config{Dir: dir, Capacity: 10 * GiB})
	if err == nil {
		_ = p.Close()
		t.Fatal("pool.Open with no Device succeeded: it acts on the host")
	}
	if !strings.Contains(err.Error(), "Device") {
		t.Fatalf("the error does not say what is missing: %v", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the refused pool made its directory: %v", err)
	}
}

// A plugin replaced by another DaemonSet's pod may start before the old
// one has let go of the pool: Open waits for it (LockWait) instead of
// failing, and fails naming the wait once it is over.
func TestOpenWaitsForTheLock(t *testing.T) {
	e := newEnv(t, 10*GiB)
	if _, err := pool.Open(pool.Config{Dir: e.dir, Device: e.dev}); !errors.Is(err, store.ErrLocked) {
		t.Fatalf("a second Open of a pool in use: %v, want ErrLocked", err)
	}
	if _, err := pool.Open(pool.Config{Dir: e.dir, Device: e.dev, LockWait: 3 * time.Second}); !errors.Is(err, store.ErrLocked) || !strings.Contains(err.Error(), "waited 3s") {
		t.Fatalf("Open after its wait: %v, want ErrLocked naming the wait", err)
	}
	go func() {
		time.Sleep(time.Second)
		if err := e.p.Close(); err != nil {
			t.Error(err)
		}
	}()
	p, err := pool.Open(pool.Config{Dir: e.dir, Device: e.dev, LockWait: time.Minute})
	if err != nil {
		t.Fatalf("Open while the holder lets go within the wait: %v", err)
	}
	e.p = p
}
