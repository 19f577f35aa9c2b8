package plugin_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/podvol/podvol/internal/snaphandle"
	"github.com/podvol/podvol/test/plugintest"
)

// Snapshots that are one instant, of raw block volumes (issue 40, items 10
// and 11). Nothing freezes a raw block device: its copy is one instant only
// if it is one atomic step (a reflink), and a group of them, copied one
// after the other, never is.

// pairSize is what the pair writer writes at a time: one 4 KiB block, with
// O_DIRECT (the device's blocks are 512 bytes; the pool's at most 4 KiB).
const pairSize = 4096

// spot is where the pair writer writes one of its values: a file (a raw
// block volume's published device, or a file in a mounted volume) and an
// offset.
type spot struct {
	path string
	off  int64
}

// pairWriter writes an increasing counter n to a header, then the same n to
// a trailer, in a loop, each write O_DIRECT and waited for, as a database
// writes its log and then its data. At any instant, and so in any copy that
// is one instant (which is what a crash leaves), the trailer holds the
// header's value or the one before. A copy read over time shows another
// pair: a trailer ahead of its header (a sparse copy read front to back, the
// header first), or far behind it (two volumes copied one after the other).
type pairWriter struct {
	stop    chan struct{}
	done    chan error
	n       atomic.Int64
	stopped sync.Once
	err     error
}

func startPairWriter(t *testing.T, header, trailer spot) *pairWriter {
	t.Helper()
	open := func(path string) int {
		fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_DIRECT|unix.O_CLOEXEC, 0o644)
		if err != nil {
			t.Fatalf("open %s: %v", path, err)
		}
		return fd
	}
	h, tr := open(header.path), open(trailer.path)
	// O_DIRECT wants an aligned buffer: a page of its own.
	buf, err := unix.Mmap(-1, 0, pairSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	w := &pairWriter{stop: make(chan struct{}), done: make(chan error, 1)}
	// A test that fails stops it too: a device written to cannot be
	// detached by the cleanup.
	t.Cleanup(func() { _ = w.halt() })
	go func() {
		defer func() { _ = unix.Munmap(buf) }()
		defer unix.Close(h)
		defer unix.Close(tr)
		for n := int64(1); ; n++ {
			select {
			case <-w.stop:
				w.done <- nil
				return
			default:
			}
			copy(buf, fmt.Sprintf("%020d", n))
			if _, err := unix.Pwrite(h, buf, header.off); err != nil {
				w.done <- fmt.Errorf("write header %d: %w", n, err)
				return
			}
			if _, err := unix.Pwrite(tr, buf, trailer.off); err != nil {
				w.done <- fmt.Errorf("write trailer %d: %w", n, err)
				return
			}
			w.n.Store(n)
		}
	}()
	// Under way before anything is cut.
	for deadline := time.Now().Add(10 * time.Second); w.n.Load() < 100; {
		if time.Now().After(deadline) {
			t.Fatalf("the pair writer wrote %d pairs in 10 s", w.n.Load())
		}
		time.Sleep(time.Millisecond)
	}
	return w
}

func (w *pairWriter) halt() error {
	w.stopped.Do(func() {
		close(w.stop)
		w.err = <-w.done
	})
	return w.err
}

// Stop stops the writer and returns the last value it wrote whole.
func (w *pairWriter) Stop(t *testing.T) int64 {
	t.Helper()
	if err := w.halt(); err != nil {
		t.Fatal(err)
	}
	return w.n.Load()
}

// counterAt reads the pair writer's value at off in path (0: none written).
func counterAt(t *testing.T, path string, off int64) int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 20)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatalf("read %s at %d: %v", path, off, err)
	}
	return parseCounter(t, b)
}

func parseCounter(t *testing.T, b []byte) int64 {
	t.Helper()
	s := string(bytes.TrimRight(b[:min(len(b), 20)], "\x00"))
	if s == "" {
		return 0
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("counter %q: %v", s, err)
	}
	return n
}

// onePair says whether a copy's header and trailer are of one instant.
func onePair(header, trailer int64) bool {
	return header > 0 && (trailer == header || trailer == header-1)
}

// snapshotImage is the image of a snapshot handle in the env's pool.
func (e *env) snapshotImage(handle string) string {
	id, _ := snaphandle.Parse(handle)
	return filepath.Join(e.p.PoolDir, "snapshots", id+".img")
}

func (e *env) volumeImage(id string) string {
	return filepath.Join(e.p.PoolDir, "volumes", id+".img")
}

// fillDevice writes data over all of a device: a sparse copy then copies
// every block, and takes the time a tear needs.
func fillDevice(t *testing.T, path string, size int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := bytes.Repeat([]byte{0xab}, 1<<20)
	for off := int64(0); off < size; off += int64(len(chunk)) {
		if _, err := f.WriteAt(chunk, off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

// wantRefused fails unless err is FAILED_PRECONDITION saying each of says.
// A copy made instead (cut names it) is read, to say what it holds.
func wantRefused(t *testing.T, what string, err error, cut func() string, says ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s was made, want FAILED_PRECONDITION; the copy holds %s", what, cut())
	}
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("%s: %v, want FAILED_PRECONDITION", what, err)
	}
	for _, s := range says {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("%s: the refusal %q does not say %q", what, status.Convert(err).Message(), s)
		}
	}
}

// On a pool without reflink, a snapshot or a clone of a raw block volume in
// use is refused (FAILED_PRECONDITION, saying why and what to do): its copy
// is read for as long as the data takes while the pod writes on, so it
// would be torn. Once the pod is gone (unstaged), both are cut, one
// instant. About 2 s.
func TestBlockCopiesOnACopyPool(t *testing.T) {
	e := newEnv(t, plugintest.Options{PoolDir: "ext4"})
	c := blockCap()
	const size = 16 << 20
	id := e.create("blk", size, c, nil).GetVolumeId()
	e.up(id, c)
	fillDevice(t, e.target(id), size)
	w := startPairWriter(t, spot{e.target(id), 0}, spot{e.target(id), size - pairSize})
	pair := func(img string) string {
		h, tr := counterAt(t, img, 0), counterAt(t, img, size-pairSize)
		return fmt.Sprintf("header %d, trailer %d (one instant: %v)", h, tr, onePair(h, tr))
	}
	says := []string{id, "raw block volume in use", "no reflink", "stop the pod", "XFS or btrfs"}

	r, err := e.p.Controller().CreateSnapshot(ctx(t), &csi.CreateSnapshotRequest{Name: "live", SourceVolumeId: id})
	wantRefused(t, "a snapshot of a raw block volume in use on a copy pool", err,
		func() string { return pair(e.snapshotImage(r.GetSnapshot().GetSnapshotId())) }, says...)
	clone, err := e.createFrom("clone-live", size, c, fromVolume(id))
	wantRefused(t, "a clone of a raw block volume in use on a copy pool", err,
		func() string { return pair(e.volumeImage(clone.GetVolumeId())) }, says...)
	if files := e.snapshotFiles(); len(files) > 0 {
		t.Fatalf("refused snapshots left images %v", files)
	}
	wrote := w.Stop(t)

	// Unstaged, nothing writes it: both are cut.
	e.must("NodeUnpublishVolume", e.unpublish(id))
	e.must("NodeUnstageVolume", e.unstage(id))
	s := e.snapshot("detached", id)
	cl, err := e.createFrom("clone-detached", size, c, fromVolume(id))
	e.must("clone of the unstaged volume", err)
	for what, img := range map[string]string{"snapshot": e.snapshotImage(s.GetSnapshotId()), "clone": e.volumeImage(cl.GetVolumeId())} {
		if h, tr := counterAt(t, img, 0), counterAt(t, img, size-pairSize); h != wrote || tr != wrote {
			t.Fatalf("%s of the unstaged volume holds header %d, trailer %d, want the last pair written, %d", what, h, tr, wrote)
		}
	}
	_, err = e.p.Controller().DeleteSnapshot(ctx(t), &csi.DeleteSnapshotRequest{SnapshotId: s.GetSnapshotId()})
	e.must("DeleteSnapshot", err)
	e.must("DeleteVolume clone", e.delete(cl.GetVolumeId()))
	e.must("DeleteVolume", e.delete(id))
	e.assertClean()
}

// On a reflink pool a raw block volume's snapshots and clones, cut while a
// pod writes it, are each one instant: FICLONE takes the image's locks and
// waits for the direct I/O in flight (the loop device's writes to the
// image), so a write the pod saw complete is in the copy and none is in it
// half. 20 snapshots and 3 clones; about 3 s.
func TestBlockCopiesOnAReflinkPool(t *testing.T) {
	e := newEnv(t, plugintest.Options{PoolDir: "xfs"})
	c := blockCap()
	const size = 32 << 20
	id := e.create("blk", size, c, nil).GetVolumeId()
	e.up(id, c)
	w := startPairWriter(t, spot{e.target(id), 0}, spot{e.target(id), size - pairSize})
	var imgs, snaps, clones []string
	for i := range 20 {
		s := e.snapshot(fmt.Sprintf("s-%d", i), id)
		snaps = append(snaps, s.GetSnapshotId())
		imgs = append(imgs, e.snapshotImage(s.GetSnapshotId()))
		if i%7 == 0 {
			cl, err := e.createFrom(fmt.Sprintf("clone-%d", i), size, c, fromVolume(id))
			e.must("clone", err)
			clones = append(clones, cl.GetVolumeId())
			imgs = append(imgs, e.volumeImage(cl.GetVolumeId()))
		}
	}
	wrote := w.Stop(t)
	var last int64
	for _, img := range imgs {
		h, tr := counterAt(t, img, 0), counterAt(t, img, size-pairSize)
		if !onePair(h, tr) || h < last {
			t.Fatalf("copy %s holds header %d, trailer %d (the copy before: %d): not one instant", filepath.Base(img), h, tr, last)
		}
		last = h
	}
	t.Logf("%d copies, each one instant; the writer wrote %d pairs meanwhile", len(imgs), wrote)
	for _, s := range snaps {
		_, err := e.p.Controller().DeleteSnapshot(ctx(t), &csi.DeleteSnapshotRequest{SnapshotId: s})
		e.must("DeleteSnapshot", err)
	}
	for _, cl := range clones {
		e.must("DeleteVolume clone", e.delete(cl))
	}
	e.down(id)
	e.assertClean()
}

// debugfsCounter reads the pair writer's file in an ext4 image without
// mounting it (its journal is empty: it was frozen when copied).
func debugfsCounter(t *testing.T, img string) int64 {
	t.Helper()
	out, err := exec.Command("debugfs", "-R", "cat /counter", img).Output()
	if err != nil {
		t.Fatalf("debugfs %s: %v: %s", img, err, out)
	}
	return parseCounter(t, out)
}

// A group snapshot of raw block volumes in use: nothing freezes them, each
// is copied at its own instant, so two of them are refused
// (FAILED_PRECONDITION, naming them and what to do), even on a reflink
// pool. One raw block member with mounted ones is one instant: the
// filesystems stay frozen while every member is reflinked, so the group
// is the instant of the block member's reflink. Unstaged, raw block
// members are cut. About 4 s.
func TestGroupSnapshotsWithBlockMembers(t *testing.T) {
	e := newEnv(t, plugintest.Options{PoolDir: "xfs"})
	c := blockCap()
	fs := mountCap("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	const size = 32 << 20
	a := e.create("a", size, c, nil).GetVolumeId()
	b := e.create("b", size, c, nil).GetVolumeId()
	m := e.create("m", size, fs, nil).GetVolumeId()
	e.up(a, c)
	e.up(b, c)
	e.up(m, fs)
	gc := csi.NewGroupControllerClient(e.p.Conn())
	members := func(g *csi.VolumeGroupSnapshot) map[string]string {
		out := map[string]string{}
		for _, s := range g.GetSnapshots() {
			out[s.GetSourceVolumeId()] = e.snapshotImage(s.GetSnapshotId())
		}
		return out
	}

	// Two raw block members in use: refused.
	w := startPairWriter(t, spot{e.target(a), 0}, spot{e.target(b), 0})
	g, err := e.groupSnapshot("two-block", a, b)
	wantRefused(t, "a group snapshot of two raw block volumes in use", err, func() string {
		imgs := members(g)
		h, tr := counterAt(t, imgs[a], 0), counterAt(t, imgs[b], 0)
		return fmt.Sprintf("header %d, trailer %d (one instant: %v)", h, tr, onePair(h, tr))
	}, a, b, "raw block", "one instant", "stop the pods")
	w.Stop(t)
	if files := e.snapshotFiles(); len(files) > 0 {
		t.Fatalf("the refused group left images %v", files)
	}

	// One raw block member with a mounted one: one instant, each time.
	w = startPairWriter(t, spot{filepath.Join(e.target(m), "counter"), 0}, spot{e.target(b), 0})
	var groups []string
	for i := range 8 {
		g, err := e.groupSnapshot(fmt.Sprintf("mixed-%d", i), m, b)
		e.must("group snapshot of a mounted and a raw block volume", err)
		groups = append(groups, g.GetGroupSnapshotId())
		imgs := members(g)
		h, tr := debugfsCounter(t, imgs[m]), counterAt(t, imgs[b], 0)
		if !onePair(h, tr) {
			t.Fatalf("group %d holds %d in the mounted member, %d in the raw block one: not one instant", i, h, tr)
		}
	}
	w.Stop(t)

	// Unstaged, the raw block members are cut together.
	for _, id := range []string{a, b} {
		e.must("NodeUnpublishVolume", e.unpublish(id))
		e.must("NodeUnstageVolume", e.unstage(id))
	}
	g, err = e.groupSnapshot("two-block-unstaged", a, b)
	e.must("group snapshot of two unstaged raw block volumes", err)
	groups = append(groups, g.GetGroupSnapshotId())

	for _, id := range groups {
		_, err := gc.DeleteVolumeGroupSnapshot(ctx(t), &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: id})
		e.must("DeleteVolumeGroupSnapshot", err)
	}
	for _, id := range []string{a, b} {
		e.must("DeleteVolume", e.delete(id))
	}
	e.down(m)
	e.assertClean()
}
