package plugin_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/podvol/podvol/test/plugintest"
)

// TestPublishNeverBindsAStandIn: when the staging mount (or a block volume's
// loop device) went away behind the plugin's back, NodePublishVolume stages
// the volume again and publishes the volume itself, never the empty
// directory (or free loop device) left in its place; when it cannot, it
// fails with FAILED_PRECONDITION and mounts nothing.
func TestPublishNeverBindsAStandIn(t *testing.T) {
	e := newEnv(t, defaultOpts)
	id := e.create("pvc-fs", 64<<20, rwo, nil).GetVolumeId()
	e.up(id, rwo)
	writeFile(t, filepath.Join(e.target(id), "f"), "the volume's data")
	e.must("unpublish", e.unpublish(id))
	run(t, "umount", e.staging(id))
	e.must("publish after the staging mount went", e.publish(id, rwo))
	if got := readFile(t, filepath.Join(e.target(id), "f")); got != "the volume's data" {
		t.Fatalf("published %q: not the volume", got)
	}
	e.must("unpublish", e.unpublish(id))

	// A staging directory that is gone as well cannot be staged again.
	run(t, "umount", e.staging(id))
	if err := os.Remove(e.staging(id)); err != nil {
		t.Fatal(err)
	}
	err := e.publish(id, rwo)
	wantCode(t, "publish with the staging directory gone", err, codes.FailedPrecondition)
	if !strings.Contains(err.Error(), "could not be staged again") {
		t.Fatalf("message does not say what happened: %v", err)
	}
	if _, mounts := plugintest.Leftovers(e.dir); len(mounts) != 0 {
		t.Fatalf("a refused publish mounted %v", mounts)
	}
	e.must("unstage", e.unstage(id))
	e.must("delete", e.delete(id))

	// Block: the loop device was detached by hand.
	c := blockCap()
	bid := e.create("pvc-block", 32<<20, c, nil).GetVolumeId()
	e.must("stage block", e.stage(bid, c))
	run(t, "losetup", "-d", e.loopOf(bid))
	for i := 0; i < 100 && len(strings.TrimSpace(run(t, "losetup", "-j", filepath.Join(e.p.PoolDir, "volumes", bid+".img")))) > 0; i++ {
		time.Sleep(20 * time.Millisecond)
	}
	e.must("publish block after its loop device went", e.publish(bid, c))
	var st unix.Stat_t
	if err := unix.Stat(e.target(bid), &st); err != nil {
		t.Fatal(err)
	}
	backing, _ := os.ReadFile(fmt.Sprintf("/sys/dev/block/%d:%d/loop/backing_file", unix.Major(st.Rdev), unix.Minor(st.Rdev)))
	if !strings.Contains(string(backing), bid+".img") {
		t.Fatalf("the block target is a device backed by %q, not the volume's image", backing)
	}
	e.down(bid)
	e.assertClean()
}

// nodeFS makes an ext4 filesystem on a loop image and mounts it below a test
// directory: the "node's own filesystem" holding the pool, the kubelet
// directories and the Kata directories, as with the default --pool-dir. It
// is thawed (in case a test froze it), unmounted and detached at the end.
func nodeFS(t *testing.T, fsType string) string {
	t.Helper()
	outer := plugintest.TempDir(t)
	img := filepath.Join(outer, "node.img")
	mnt := filepath.Join(outer, "node")
	run(t, "truncate", "-s", "2G", img)
	run(t, "mkfs."+fsType, "-q", img)
	dev := strings.TrimSpace(run(t, "losetup", "--find", "--show", img))
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = exec.Command("fsfreeze", "-u", mnt).Run()
		plugintest.ForceClean(mnt)
		_ = unix.Unmount(mnt, 0)
		_ = exec.Command("losetup", "-d", dev).Run()
	})
	run(t, "mount", dev, mnt)
	return mnt
}

// writable reports whether a file can be written on the filesystem at dir
// within a few seconds (a frozen filesystem holds the write). A frozen one is
// thawed before the test fails: the plugin's writes to it cannot even be
// killed until then, and the test could not stop the plugin.
func writable(dir string) bool {
	done := make(chan error, 1)
	go func() { done <- os.WriteFile(filepath.Join(dir, "probe"), []byte("x"), 0o600) }()
	select {
	case err := <-done:
		return err == nil
	case <-time.After(5 * time.Second):
		_ = exec.Command("fsfreeze", "-u", dir).Run()
		return false
	}
}

// TestCopyOfAssignedVolumeFreezesNothing: a volume assigned to a microVM has
// no staging mount on the host; a snapshot or clone of it never freezes the
// filesystem that holds the (empty) staging directory, the node's own. On a
// pool with reflink it is a crash-consistent copy of the device; without,
// the copy would be torn by the guest's writes, and it is refused.
func TestCopyOfAssignedVolumeFreezesNothing(t *testing.T) {
	for _, fs := range []string{"xfs", "ext4"} {
		t.Run(fs, func(t *testing.T) {
			plugintest.RequireRoot(t)
			dir := nodeFS(t, fs)
			rt := newRuntime(t, dir)
			e := start(t, plugintest.Options{Dir: dir, NodeID: node, Args: rt.args()})
			c := rwop("ext4")
			id := e.create("kata", 64<<20, c, map[string]string{"directAssign": "always"}).GetVolumeId()
			e.must("stage", e.stage(id, c))
			e.must("assign", e.publishReq(id, c, e.target(id)))
			// The guest writes (done on the host, as the guest would).
			dev := e.loopOf(id)
			guest := filepath.Join(dir, "guest")
			_ = os.Mkdir(guest, 0o700)
			run(t, "mount", dev, guest)
			writeFile(t, filepath.Join(guest, "f"), "written in the guest")
			run(t, "umount", guest)

			cctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			r, err := e.p.Controller().CreateSnapshot(cctx, &csi.CreateSnapshotRequest{Name: "snap", SourceVolumeId: id})
			if !writable(dir) {
				t.Fatalf("the node's filesystem is frozen after a snapshot of an assigned volume (snapshot: %v)", err)
			}
			clone, cerr := e.createFrom("clone", 64<<20, rwo, fromVolume(id))
			if !writable(dir) {
				t.Fatalf("the node's filesystem is frozen after a clone of an assigned volume (clone: %v)", cerr)
			}
			if fs == "ext4" {
				wantCode(t, "snapshot of an assigned volume on a pool without reflink", err, codes.FailedPrecondition)
				wantCode(t, "clone of an assigned volume on a pool without reflink", cerr, codes.FailedPrecondition)
				if !strings.Contains(err.Error(), "no reflink") {
					t.Fatalf("message does not say why: %v", err)
				}
			} else {
				e.must("snapshot of an assigned volume", err)
				e.must("clone of an assigned volume", cerr)
				restored, err := e.createFrom("restored", 64<<20, rwo, fromSnapshot(r.GetSnapshot().GetSnapshotId()))
				e.must("restore", err)
				for _, v := range []string{clone.GetVolumeId(), restored.GetVolumeId()} {
					e.up(v, rwo)
					if got := readFile(t, filepath.Join(e.target(v), "f")); got != "written in the guest" {
						t.Fatalf("copy %s holds %q", v, got)
					}
					e.down(v)
				}
				_, err = e.p.Controller().DeleteSnapshot(ctx(t), &csi.DeleteSnapshotRequest{SnapshotId: r.GetSnapshot().GetSnapshotId()})
				e.must("delete snapshot", err)
			}
			e.must("unassign", e.unpublish(id))
			e.must("unstage", e.unstage(id))
			e.must("delete", e.delete(id))
			if loops, mounts := plugintest.Leftovers(filepath.Join(dir, "pool")); len(loops)+len(mounts) > 0 {
				t.Fatalf("leftovers: %v %v", loops, mounts)
			}
		})
	}
}

// TestCloneHoldsTheSourceLock: while a clone copies its frozen source, an
// unstage of the source waits for the copy to end (else the source would be
// unmounted frozen, and its thaw would miss it).
func TestCloneHoldsTheSourceLock(t *testing.T) {
	e := newEnv(t, defaultOpts)
	id := e.create("src", 64<<20, rwo, nil).GetVolumeId()
	e.must("stage", e.stage(id, rwo))
	writeFile(t, filepath.Join(e.staging(id), "f"), "source")
	e.p.Restart("PODVOL_FAILPOINTS=copy-while-quiesced=sleep:3s")

	cloned := make(chan time.Time, 1)
	go func() {
		_, err := e.createFrom("clone", 64<<20, rwo, fromVolume(id))
		if err != nil {
			t.Errorf("clone: %v", err)
		}
		cloned <- time.Now()
	}()
	// Let the clone take its locks and freeze the source.
	for i := 0; i < 100 && !strings.Contains(e.p.Log(), "failpoint copy-while-quiesced"); i++ {
		time.Sleep(50 * time.Millisecond)
	}
	e.must("unstage of the source", e.unstage(id))
	unstaged := time.Now()
	done := <-cloned
	if unstaged.Before(done) {
		t.Fatalf("the source was unstaged at %s, while the clone still copied it (done at %s)", unstaged.Format(time.StampMilli), done.Format(time.StampMilli))
	}
	e.must("stage the source again", e.stage(id, rwo))
	if !writable(e.staging(id)) {
		t.Fatal("the source's filesystem is still frozen")
	}
	e.must("unstage", e.unstage(id))
	e.assertClean()
}

// TestExpandOutlivesItsDeadline: kubelet's deadline expiring in the middle
// of an offline ext4 growth neither kills the disk tools nor leaves the
// volume unmounted: the growth finishes, the staging mount comes back, the
// filesystem is clean, and kubelet's retry finds the work done.
func TestExpandOutlivesItsDeadline(t *testing.T) {
	e := newEnv(t, defaultOpts)
	id := e.create("big", 2<<30, rwo, nil).GetVolumeId()
	e.must("stage", e.stage(id, rwo))
	writeFile(t, filepath.Join(e.staging(id), "f"), "kept")
	// Hold the growth after the unmount long enough for the deadline to pass
	// before the disk tools start.
	e.p.Restart("PODVOL_FAILPOINTS=grow-offline-after-unmount=sleep:2s")
	short, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err := e.p.Node().NodeExpandVolume(short, &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: e.staging(id), CapacityRange: &csi.CapacityRange{RequiredBytes: 20 << 30}})
	wantCode(t, "expand with a 1 s deadline", err, codes.DeadlineExceeded)
	deadline := time.Now().Add(30 * time.Second)
	for !(plugintest.MountedAt(e.staging(id)) && statfs(t, e.staging(id)) > 10<<30) {
		if time.Now().After(deadline) {
			t.Fatalf("30 s after the deadline the staging mount is %v and its filesystem %d bytes: the growth did not finish\n%s", plugintest.MountedAt(e.staging(id)), statfs(t, e.staging(id)), e.p.Log())
		}
		time.Sleep(100 * time.Millisecond)
	}
	got, err := e.expand(id, e.staging(id), 20<<30)
	e.must("kubelet's retry", err)
	if got != 20<<30 {
		t.Fatalf("capacity %d after the retry", got)
	}
	e.must("unstage", e.unstage(id))
	img := filepath.Join(e.p.PoolDir, "volumes", id+".img")
	if out, err := exec.Command("e2fsck", "-fn", img).CombinedOutput(); err != nil {
		t.Fatalf("e2fsck -fn after the interrupted growth: %v\n%s", err, out)
	}
	e.must("stage", e.stage(id, rwo))
	if got := readFile(t, filepath.Join(e.staging(id), "f")); got != "kept" {
		t.Fatalf("data %q", got)
	}
	e.must("unstage", e.unstage(id))
	e.must("delete", e.delete(id))
	e.assertClean()
}
