package plugin_test

import (
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/podvol/podvol/test/plugintest"
)

// The data path: a volume's loop device does direct I/O on its image, so
// that the host keeps no second copy of the volume's data in its page cache,
// and space freed inside a volume goes back to the pool.

// dataCases are the three kinds of volume the data path serves.
var dataCases = []struct {
	name string
	c    *csi.VolumeCapability
}{
	{"xfs", mountCap("xfs", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)},
	{"ext4", mountCap("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)},
	{"block", blockCap()},
}

func (e *env) image(id string) string { return filepath.Join(e.p.PoolDir, "volumes", id+".img") }

// loopOf returns the loop device whose backing file is image.
func loopOf(t *testing.T, image string) string {
	t.Helper()
	ents, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, en := range ents {
		if b, err := os.ReadFile(en); err == nil && strings.TrimSpace(string(b)) == image {
			return filepath.Base(filepath.Dir(filepath.Dir(en)))
		}
	}
	t.Fatalf("no loop device serves %s", image)
	return ""
}

func sysLoop(t *testing.T, loop, attr string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/sys/block", loop, attr))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// writeGiB writes 1 GiB (buffered, as a pod does by default) to path, a file
// in a published filesystem or a published block device, and syncs it.
func writeGiB(t *testing.T, path string, flag int) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|flag, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i*7 + 1)
	}
	for i := 0; i < 1024; i++ {
		buf[0] = byte(i)
		if _, err := f.Write(buf); err != nil {
			t.Fatalf("write %s: %v", path, err)
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

// cachedBytes is how much of file the host's page cache holds (fincore,
// util-linux: mincore(2) over a mapping of the file).
func cachedBytes(t *testing.T, file string) int64 {
	t.Helper()
	out, err := exec.Command("fincore", "--bytes", "--noheadings", "--output", "RES", file).CombinedOutput()
	if err != nil {
		t.Fatalf("fincore %s: %v: %s", file, err, out)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	if err != nil {
		t.Fatalf("fincore %s: %q", file, out)
	}
	return n
}

func allocated(t *testing.T, file string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(file, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// TestLoopDevicesDoDirectIO: a published volume's loop device reads and
// writes its image with direct I/O, at the pool filesystem's block size,
// for xfs, ext4 and raw block volumes.
func TestLoopDevicesDoDirectIO(t *testing.T) {
	e := newEnv(t, defaultOpts)
	for _, tc := range dataCases {
		t.Run(tc.name, func(t *testing.T) {
			id := e.create("dio-"+tc.name, 512<<20, tc.c, nil).GetVolumeId()
			e.up(id, tc.c)
			loop := loopOf(t, e.image(id))
			if dio := sysLoop(t, loop, "loop/dio"); dio != "1" {
				t.Errorf("%s volume: /sys/block/%s/loop/dio = %s, want 1 (direct I/O)", tc.name, loop, dio)
			}
			e.down(id)
		})
	}
	e.assertClean()
}

// TestStagedBeforeGetsDirectIOAtNextStage: a volume staged by a plugin
// attaching buffered (--direct-io=false, as every version did before) keeps
// working, buffered, across the upgrade, and has direct I/O once staged
// again.
func TestStagedBeforeGetsDirectIOAtNextStage(t *testing.T) {
	e := newEnv(t, plugintest.Options{Args: []string{"--direct-io=false"}})
	c := mountCap("xfs", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	id := e.create("upgraded", 512<<20, c, nil).GetVolumeId()
	e.up(id, c)
	loop := loopOf(t, e.image(id))
	if dio, bs := sysLoop(t, loop, "loop/dio"), sysLoop(t, loop, "queue/logical_block_size"); dio != "0" || bs != "512" {
		t.Fatalf("--direct-io=false: dio=%s, logical block size %s; want 0 and 512 as before", dio, bs)
	}
	writeFile(t, filepath.Join(e.target(id), "f"), "before")
	e.p.Upgrade()
	e.up(id, c) // kubelet's calls after a plugin restart: done already
	if dio := sysLoop(t, loopOf(t, e.image(id)), "loop/dio"); dio != "0" {
		t.Fatalf("the mounted volume's device changed under it: dio=%s", dio)
	}
	e.must("NodeUnpublishVolume", e.unpublish(id))
	e.must("NodeUnstageVolume", e.unstage(id))
	e.up(id, c)
	if dio := sysLoop(t, loopOf(t, e.image(id)), "loop/dio"); dio != "1" {
		t.Fatalf("staged again after the upgrade: dio=%s, want 1", dio)
	}
	if got := readFile(t, filepath.Join(e.target(id), "f")); got != "before" {
		t.Fatalf("read %q after the upgrade", got)
	}
	e.down(id)
	e.assertClean()
}

// TestImageNotCachedTwice: after a pod's synced buffered write of 1 GiB,
// the host's page cache holds (almost) nothing of the volume's image: the
// data is cached once, by the volume's own filesystem, charged to the pod.
func TestImageNotCachedTwice(t *testing.T) {
	e := newEnv(t, defaultOpts)
	for _, tc := range dataCases {
		t.Run(tc.name, func(t *testing.T) {
			id := e.create("cache-"+tc.name, 2<<30, tc.c, nil).GetVolumeId()
			e.up(id, tc.c)
			if tc.name == "block" {
				writeGiB(t, e.target(id), 0)
			} else {
				writeGiB(t, filepath.Join(e.target(id), "data"), os.O_CREATE)
			}
			got := cachedBytes(t, e.image(id))
			t.Logf("%s: %d MiB of the image in the host page cache after a synced 1 GiB write", tc.name, got>>20)
			if got > (1<<30)*5/100 {
				t.Errorf("%s: the host page cache holds %d MiB of the image after a 1 GiB write: every block is cached twice (want <= 5%% of it)", tc.name, got>>20)
			}
			e.down(id)
		})
	}
	e.assertClean()
}

// TestDeletedDataGivesSpaceBack: 1 GiB written then deleted inside a volume
// (files removed, or a raw block volume discarded by its consumer) leaves
// the image as little allocated as before the write: with the default
// --discard=fstrim at unstage, or while staged every --trim-interval, and
// with --discard=mount as the filesystem commits.
func TestDeletedDataGivesSpaceBack(t *testing.T) {
	for _, mode := range []struct {
		name    string
		args    []string
		unstage bool // the space is back only once the volume is unstaged
		cases   []string
	}{
		{"fstrim-at-unstage", nil, true, []string{"xfs", "ext4", "block"}},
		{"fstrim-periodic", []string{"--trim-interval=1s"}, false, []string{"xfs", "ext4"}},
		{"discard-mount", []string{"--discard=mount"}, false, []string{"xfs", "ext4"}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			e := newEnv(t, plugintest.Options{Args: mode.args})
			for _, tc := range dataCases {
				if !slices.Contains(mode.cases, tc.name) {
					continue
				}
				t.Run(tc.name, func(t *testing.T) { e.giveBack(t, tc.name, tc.c, mode.unstage) })
			}
			e.assertClean()
		})
	}
}

func (e *env) giveBack(t *testing.T, name string, c *csi.VolumeCapability, unstage bool) {
	id := e.create("trim-"+name, 2<<30, c, nil).GetVolumeId()
	e.up(id, c)
	img := e.image(id)
	before := allocated(t, img)
	if name == "block" {
		writeGiB(t, e.target(id), 0)
	} else {
		writeGiB(t, filepath.Join(e.target(id), "data"), os.O_CREATE)
	}
	full := allocated(t, img)
	if full < before+900<<20 {
		t.Fatalf("%s: the image holds %d MiB after a 1 GiB write (%d before)", name, full>>20, before>>20)
	}
	if name == "block" {
		if out, err := exec.Command("blkdiscard", e.target(id)).CombinedOutput(); err != nil {
			t.Fatalf("blkdiscard %s: %v: %s", e.target(id), err, out)
		}
	} else {
		e.must("remove", os.Remove(filepath.Join(e.target(id), "data")))
		unix.Sync()
	}
	if unstage {
		e.must("NodeUnpublishVolume", e.unpublish(id))
		e.must("NodeUnstageVolume", e.unstage(id))
	}
	// Discards are issued as the filesystem commits (discard), or at the
	// next trim: give them a moment. xfs frees a deleted file's blocks in
	// the background (inode garbage collection) and discards them once the
	// log checkpoint that frees them is written, which without a sync waits
	// for its 30 s log worker: on a loaded machine the one sync above can
	// come before the frees. Each round syncs the volume's filesystem again.
	var now int64
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if now = allocated(t, img); now <= before+64<<20 || time.Now().After(deadline) {
			break
		}
		if !unstage && name != "block" {
			syncFS(t, e.target(id))
		}
	}
	t.Logf("%s: image allocation %d MiB before, %d MiB after writing 1 GiB, %d MiB after deleting it", name, before>>20, full>>20, now>>20)
	if now > before+64<<20 {
		t.Errorf("%s: the image still holds %d MiB after the data was deleted (%d MiB before it was written): the space did not go back to the pool", name, now>>20, before>>20)
	}
	if unstage {
		e.must("DeleteVolume", e.delete(id))
	} else {
		e.down(id)
	}
}

// syncFS commits the filesystem holding path (syncfs(2)).
func syncFS(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		t.Fatalf("syncfs %s: %v", path, err)
	}
}

// TestDirectIORefusedPool: on a pool whose filesystem refuses direct I/O
// (ramfs) volumes still stage and hold data, buffered, and the pool's
// health says so, as does the metric.
func TestDirectIORefusedPool(t *testing.T) {
	plugintest.RequireRoot(t)
	dir := plugintest.TempDir(t)
	poolDir := filepath.Join(dir, "ramfs-pool")
	if err := os.Mkdir(poolDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("podvol-test", poolDir, "ramfs", 0, "mode=0700"); err != nil {
		t.Fatalf("mount ramfs: %v", err)
	}
	// Registered before the plugin starts, so it runs after the plugin
	// stopped and its volumes were cleaned up.
	t.Cleanup(func() {
		if err := unix.Unmount(poolDir, 0); err != nil {
			t.Errorf("unmount the ramfs pool: %v", err)
		}
	})
	e := start(t, plugintest.Options{Dir: dir, NodeID: node, PoolDir: poolDir, Capacity: "1Gi", Args: []string{"--metrics-address", "127.0.0.1:0"}})
	c := mountCap("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	id := e.create("refused", 64<<20, c, nil).GetVolumeId()
	e.up(id, c)
	if dio := sysLoop(t, loopOf(t, e.image(id)), "loop/dio"); dio != "0" {
		t.Fatalf("loop/dio = %s on a ramfs pool", dio)
	}
	writeFile(t, filepath.Join(e.target(id), "f"), "data")
	r, err := e.p.Node().NodeGetStorageHealth(ctx(t), &csi.NodeGetStorageHealthRequest{})
	e.must("NodeGetStorageHealth", err)
	var found bool
	for _, b := range r.GetBackendHealth() {
		if b.GetReason() == "DirectIORefused" && b.GetStatus() == csi.StorageHealthErrorType_STORAGE_DEGRADED && strings.Contains(b.GetMessage(), id) {
			found = true
		}
	}
	if !found {
		t.Fatalf("NodeGetStorageHealth does not report DirectIORefused for %s: %v", id, r.GetBackendHealth())
	}
	if !strings.Contains(e.p.Log(), "refused direct I/O") {
		t.Fatalf("the plugin did not log the refusal:\n%s", e.p.Log())
	}
	m := regexp.MustCompile(`"Serving metrics" address="([^"]+)"`).FindStringSubmatch(e.p.Log())
	if m == nil {
		t.Fatalf("no metrics address in the log:\n%s", e.p.Log())
	}
	resp, err := http.Get("http://" + m[1] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "\npodvol_loop_direct_io_refused_total{node=\""+node+"\",pool=\"default\"} 1\n") {
		t.Fatalf("metrics do not count the refusal:\n%s", body)
	}
	e.down(id)
	e.assertClean()
}

// mountLoop returns the loop device mounted at path.
func mountLoop(t *testing.T, path string) string {
	t.Helper()
	ms, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(path))
	if err != nil || len(ms) == 0 {
		t.Fatalf("nothing mounted at %s: %v", path, err)
	}
	return filepath.Base(ms[len(ms)-1].Source)
}

// TestEveryAttachPathDoesDirectIO: an inline volume, a clone, a restore and
// a volume re-attached by recovery after a reboot get direct I/O too.
func TestEveryAttachPathDoesDirectIO(t *testing.T) {
	e, k := newInlineEnv(t, "")
	wantDIO := func(what, loop string) {
		t.Helper()
		if dio := sysLoop(t, loop, "loop/dio"); dio != "1" {
			t.Errorf("%s: /sys/block/%s/loop/dio = %s, want 1", what, loop, dio)
		}
	}
	k.e.must("publish inline", k.publish("uid1", "scratch", map[string]string{"size": "64Mi", "fsType": "ext4"}))
	wantDIO("inline volume", mountLoop(t, k.target("uid1", "scratch")))
	k.e.must("unpublish inline", k.unpublish("uid1", "scratch"))

	c := mountCap("xfs", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	src := e.create("src", 400<<20, c, nil).GetVolumeId()
	e.up(src, c)
	writeFile(t, filepath.Join(e.target(src), "f"), "source")
	snap := e.snapshot("snap", src).GetSnapshotId()
	clone, err := e.createFrom("clone", 400<<20, c, fromVolume(src))
	e.must("clone", err)
	restore, err := e.createFrom("restore", 400<<20, c, fromSnapshot(snap))
	e.must("restore", err)
	for what, id := range map[string]string{"clone": clone.GetVolumeId(), "restore": restore.GetVolumeId()} {
		e.up(id, c)
		wantDIO(what, mountLoop(t, e.staging(id)))
		if got := readFile(t, filepath.Join(e.target(id), "f")); got != "source" {
			t.Errorf("%s holds %q", what, got)
		}
		e.down(id)
	}

	e.p.Kill()
	plugintest.ForceClean(filepath.Join(e.dir, "staging")) // the reboot: no mount, no loop device
	plugintest.ForceClean(filepath.Join(e.dir, "pods"))
	plugintest.ForceClean(e.p.PoolDir)
	e.p.Restart()
	wantDIO("re-attached by recovery", mountLoop(t, e.staging(src)))
	e.up(src, c)
	e.down(src)
	_, err = e.p.Controller().DeleteSnapshot(ctx(t), &csi.DeleteSnapshotRequest{SnapshotId: snap})
	e.must("DeleteSnapshot", err)
	e.assertClean()
}
