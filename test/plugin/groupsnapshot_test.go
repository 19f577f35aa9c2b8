package plugin_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/podvol/podvol/test/plugintest"
)

func (e *env) groupSnapshot(name string, ids ...string) (*csi.VolumeGroupSnapshot, error) {
	r, err := csi.NewGroupControllerClient(e.p.Conn()).CreateVolumeGroupSnapshot(ctx(e.t), &csi.CreateVolumeGroupSnapshotRequest{Name: name, SourceVolumeIds: ids})
	return r.GetGroupSnapshot(), err
}

// snapshotFiles lists the pool's snapshot images.
func (e *env) snapshotFiles() []string {
	ents, _ := os.ReadDir(filepath.Join(e.p.PoolDir, "snapshots"))
	var out []string
	for _, en := range ents {
		out = append(out, en.Name())
	}
	return out
}

// writableWithin fails the test unless a file can be written in dir within d:
// a frozen filesystem holds the write.
func (e *env) writableWithin(dir string, d time.Duration) {
	e.t.Helper()
	done := make(chan error, 1)
	go func() { done <- os.WriteFile(filepath.Join(dir, "after-restart"), []byte("x"), 0o644) }()
	select {
	case err := <-done:
		e.must("write after restart", err)
	case <-time.After(d):
		// Thaw before failing: the cleanup cannot unmount a frozen
		// filesystem, and the write above would hang for ever.
		out, err := exec.Command("fsfreeze", "-u", dir).CombinedOutput()
		e.t.Fatalf("%s is still frozen after the restart (thawed by the test: %v %s)", dir, err, out)
	}
}

// A group snapshot of two mounted volumes on a reflink pool, killed at each
// of its steps: after the restart no member is frozen, the half-made group
// is gone (no snapshot, no image, no loop device), and the CO's retry cuts
// it whole; its members restore with their data, and its delete (killed
// half-way too) removes every member.
func TestCrashDuringGroupSnapshot(t *testing.T) {
	for _, fp := range []string{"group-after-record", "group-while-frozen"} {
		t.Run(fp, func(t *testing.T) {
			e := newEnv(t, plugintest.Options{PoolDir: "xfs"})
			a := e.create("a", 64<<20, rwo, nil).GetVolumeId()
			b := e.create("b", 64<<20, rwo, nil).GetVolumeId()
			e.up(a, rwo)
			e.up(b, rwo)
			// Whatever fails below, nothing stays frozen: the env's
			// cleanup (which runs after this) cannot unmount a frozen
			// filesystem, and a write into one hangs for ever.
			t.Cleanup(func() {
				for _, dir := range []string{e.target(a), e.target(b)} {
					_ = exec.Command("fsfreeze", "-u", dir).Run() // fails unless frozen
				}
			})
			writeFile(t, filepath.Join(e.target(a), "f"), "A")
			writeFile(t, filepath.Join(e.target(b), "f"), "B")
			e.crash(fp, func() error {
				_, err := e.groupSnapshot("group", a, b)
				return err
			})
			e.writableWithin(e.target(a), 20*time.Second)
			e.writableWithin(e.target(b), 20*time.Second)
			r, err := e.p.Controller().ListSnapshots(ctx(t), &csi.ListSnapshotsRequest{})
			e.must("ListSnapshots", err)
			if files := e.snapshotFiles(); len(r.GetEntries())+len(files) > 0 {
				t.Fatalf("half-made group left snapshots %v, images %v", r.GetEntries(), files)
			}

			// The CO's retry.
			g, err := e.groupSnapshot("group", a, b)
			e.must("CreateVolumeGroupSnapshot after the restart", err)
			if len(g.GetSnapshots()) != 2 || !g.GetReadyToUse() {
				t.Fatalf("group after retry: %v", g)
			}
			var ids []string
			for _, s := range g.GetSnapshots() {
				ids = append(ids, s.GetSnapshotId())
				v, err := e.createFrom("restored-"+s.GetSourceVolumeId(), 64<<20, rwo, fromSnapshot(s.GetSnapshotId()))
				e.must("restore a member", err)
				e.up(v.GetVolumeId(), rwo)
				want := map[string]string{a: "A", b: "B"}[s.GetSourceVolumeId()]
				if got := readFile(t, filepath.Join(e.target(v.GetVolumeId()), "f")); got != want {
					t.Fatalf("member of %s restored %q, want %q", s.GetSourceVolumeId(), got, want)
				}
				e.down(v.GetVolumeId())
			}

			e.crash("group-delete-after-members", func() error {
				_, err := csi.NewGroupControllerClient(e.p.Conn()).DeleteVolumeGroupSnapshot(ctx(t), &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: g.GetGroupSnapshotId(), SnapshotIds: ids})
				return err
			})
			_, err = csi.NewGroupControllerClient(e.p.Conn()).DeleteVolumeGroupSnapshot(ctx(t), &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: g.GetGroupSnapshotId(), SnapshotIds: ids})
			e.must("DeleteVolumeGroupSnapshot after the restart", err)
			if files := e.snapshotFiles(); len(files) > 0 {
				t.Fatalf("deleted group left images %v", files)
			}
			e.down(a)
			e.down(b)
			e.assertClean()
			if imgs := e.images(); len(imgs) > 0 {
				t.Fatalf("images left: %v", imgs)
			}
		})
	}
}

// counterWriter writes an increasing counter to a file in volume A, then the
// same value to one in volume B, in a loop, as a database writes its log and
// then its data: at any instant B is A or one behind, never ahead. Each value
// is one pwrite of a fixed width at offset 0, which a freeze holds whole.
type counterWriter struct {
	stop chan struct{}
	done chan error
}

func startCounter(t *testing.T, dirA, dirB string) *counterWriter {
	t.Helper()
	open := func(dir string) *os.File {
		f, err := os.OpenFile(filepath.Join(dir, "counter"), os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	a, b := open(dirA), open(dirB)
	w := &counterWriter{stop: make(chan struct{}), done: make(chan error, 1)}
	go func() {
		defer a.Close()
		defer b.Close()
		for n := 1; ; n++ {
			select {
			case <-w.stop:
				w.done <- nil
				return
			default:
			}
			v := []byte(fmt.Sprintf("%020d", n))
			if _, err := a.WriteAt(v, 0); err != nil {
				w.done <- err
				return
			}
			if _, err := b.WriteAt(v, 0); err != nil {
				w.done <- err
				return
			}
		}
	}()
	return w
}

func (w *counterWriter) Stop(t *testing.T) {
	t.Helper()
	close(w.stop)
	if err := <-w.done; err != nil {
		t.Fatal(err)
	}
}

// restoredCounter restores a snapshot into a new volume and reads its counter.
func (e *env) restoredCounter(name, snapshot string) int {
	e.t.Helper()
	v, err := e.createFrom(name, 64<<20, rwo, fromSnapshot(snapshot))
	e.must("restore "+name, err)
	e.up(v.GetVolumeId(), rwo)
	s := strings.TrimSpace(readFile(e.t, filepath.Join(e.target(v.GetVolumeId()), "counter")))
	e.down(v.GetVolumeId())
	n, err := strconv.Atoi(s)
	if err != nil {
		e.t.Fatalf("restored counter of %s: %q: %v", name, s, err)
	}
	return n
}

// The property a group snapshot exists for: a pod writes A then B in a loop
// while group snapshots are taken; in every restored pair B is never ahead of
// A. The same writer with two single snapshots (A, then B a little later)
// does show B ahead: the workload can expose a torn pair.
func TestGroupSnapshotIsConsistent(t *testing.T) {
	e := newEnv(t, plugintest.Options{PoolDir: "xfs"})
	a := e.create("a", 64<<20, rwo, nil).GetVolumeId()
	b := e.create("b", 64<<20, rwo, nil).GetVolumeId()
	e.up(a, rwo)
	e.up(b, rwo)
	t.Cleanup(func() {
		for _, dir := range []string{e.target(a), e.target(b)} {
			_ = exec.Command("fsfreeze", "-u", dir).Run() // fails unless frozen
		}
	})
	w := startCounter(t, e.target(a), e.target(b))
	gc := csi.NewGroupControllerClient(e.p.Conn())
	type pair struct{ a, b string }
	var groups []pair
	var groupIDs []string
	for i := range 2 {
		time.Sleep(200 * time.Millisecond)
		g, err := e.groupSnapshot(fmt.Sprintf("group-%d", i), a, b)
		e.must("CreateVolumeGroupSnapshot", err)
		var p pair
		for _, s := range g.GetSnapshots() {
			if s.GetSourceVolumeId() == a {
				p.a = s.GetSnapshotId()
			} else {
				p.b = s.GetSnapshotId()
			}
		}
		groups = append(groups, p)
		groupIDs = append(groupIDs, g.GetGroupSnapshotId())
	}
	singleA := e.snapshot("single-a", a).GetSnapshotId()
	time.Sleep(200 * time.Millisecond)
	singleB := e.snapshot("single-b", b).GetSnapshotId()
	w.Stop(t)

	for i, p := range groups {
		na, nb := e.restoredCounter(fmt.Sprintf("ra-%d", i), p.a), e.restoredCounter(fmt.Sprintf("rb-%d", i), p.b)
		t.Logf("group %d: A=%d B=%d", i, na, nb)
		if na == 0 || nb > na || nb < na-1 {
			t.Fatalf("group %d restored A=%d, B=%d: want B equal to A or one behind", i, na, nb)
		}
	}
	na, nb := e.restoredCounter("single-ra", singleA), e.restoredCounter("single-rb", singleB)
	t.Logf("two single snapshots: A=%d B=%d", na, nb)
	if nb <= na {
		t.Fatalf("single snapshots of A then B restored A=%d, B=%d: the writer did not advance between them, so this workload could not expose a torn group", na, nb)
	}

	for _, id := range groupIDs {
		_, err := gc.DeleteVolumeGroupSnapshot(ctx(t), &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: id})
		e.must("DeleteVolumeGroupSnapshot", err)
	}
	for _, id := range []string{singleA, singleB} {
		_, err := e.p.Controller().DeleteSnapshot(ctx(t), &csi.DeleteSnapshotRequest{SnapshotId: id})
		e.must("DeleteSnapshot", err)
	}
	if files := e.snapshotFiles(); len(files) > 0 {
		t.Fatalf("images left: %v", files)
	}
	e.down(a)
	e.down(b)
	e.assertClean()
}
