package plugin_test

import (
	"os"
	"os/exec"
	"path/filepath"
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
