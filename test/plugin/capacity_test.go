package plugin_test

import (
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/podvol/podvol/test/plugintest"
)

// TestDefaultCapacityIsWritable: a pool given a filesystem of its own and no
// --capacity promises only what that filesystem can give. Block volumes are
// created until RESOURCE_EXHAUSTED, and each is written whole with O_DIRECT
// through its published device: none meets ENOSPC. (The size of the
// filesystem was the capacity before: a 512 MiB XFS pool admitted 448 MiB
// and held 416, an ext4 one 480 and 448.) What it admits stays close to
// what the filesystem holds: a pool does not promise much less than it can
// keep either.
func TestDefaultCapacityIsWritable(t *testing.T) {
	for _, fs := range []string{"xfs", "ext4"} {
		t.Run(fs, func(t *testing.T) {
			plugintest.RequireRoot(t)
			dir := plugintest.TempDir(t)
			poolDir := plugintest.FilesystemPool(t, dir, fs, 512<<20)
			e := start(t, plugintest.Options{Dir: dir, NodeID: node, PoolDir: poolDir, Capacity: plugintest.RoomCapacity})
			const size = 32 << 20
			c := blockCap()
			var ids []string
			for i := 0; ; i++ {
				r, err := e.p.Controller().CreateVolume(ctx(t), &csi.CreateVolumeRequest{Name: fmt.Sprintf("v%d", i),
					CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapabilities: []*csi.VolumeCapability{c}})
				if status.Code(err) == codes.ResourceExhausted {
					break
				}
				e.must("CreateVolume", err)
				ids = append(ids, r.GetVolume().GetVolumeId())
			}
			start := time.Now()
			for i, id := range ids {
				e.up(id, c)
				if n, err := writeWhole(e.target(id), size); err != nil {
					var st unix.Statfs_t
					_ = unix.Statfs(poolDir, &st)
					t.Fatalf("volume %d of the %d admitted (%d MiB): after %d MiB of its %d: %v (the pool's filesystem has %d MiB free)",
						i+1, len(ids), len(ids)*size>>20, n>>20, size>>20, err, int64(st.Bavail)*st.Bsize>>20)
				}
			}
			var st unix.Statfs_t
			if err := unix.Statfs(poolDir, &st); err != nil {
				t.Fatal(err)
			}
			left := int64(st.Bavail) * st.Bsize
			t.Logf("%s: %d volumes of %d MiB admitted and written whole in %s; %d MiB left free",
				fs, len(ids), size>>20, time.Since(start).Round(time.Millisecond), left>>20)
			if left > 2*size {
				t.Errorf("%d MiB left free with every admitted volume written whole: the pool promises less than it can keep", left>>20)
			}
			for _, id := range ids {
				e.down(id)
			}
			e.assertCleanBut(poolDir)
		})
	}
}

// writeWhole writes the device at path from start to end with O_DIRECT and
// syncs it, and returns how far it got.
func writeWhole(path string, size int64) (int64, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|unix.O_DIRECT, 0)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	// O_DIRECT wants an aligned buffer: a mapping is page-aligned.
	buf, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return 0, err
	}
	defer func() { _ = unix.Munmap(buf) }()
	if _, err := rand.Read(buf); err != nil {
		return 0, err
	}
	var off int64
	for ; off < size; off += int64(len(buf)) {
		if _, err := f.WriteAt(buf, off); err != nil {
			return off, err
		}
	}
	return off, f.Sync()
}

// TestCapacityAboveTheRoomIsRefused: a --capacity above what the pool's
// filesystem can give is refused at start, with that figure, unless forced;
// and so are pools on one filesystem given more together.
func TestCapacityAboveTheRoomIsRefused(t *testing.T) {
	plugintest.RequireRoot(t)
	dir := plugintest.TempDir(t)
	poolDir := plugintest.FilesystemPool(t, dir, "xfs", 512<<20)
	args := func(extra ...string) []string {
		return append([]string{"--endpoint", "unix://" + filepath.Join(dir, "csi.sock"), "--node-id", node, "--pool-dir", poolDir}, extra...)
	}
	out, err := plugintest.RunOnce(t, args("--capacity", "1Gi")...)
	if err == nil || !strings.Contains(out, "pool default: its capacity, 1Gi, is more than the filesystem holding "+poolDir+" can give its volumes") ||
		!strings.Contains(out, "--force-capacity") {
		t.Fatalf("--capacity 1Gi on a 512 MiB filesystem: %v\n%s", err, out)
	}
	// The figure it names is the one it takes by default, and a capacity
	// up to it starts.
	room := strings.Split(strings.SplitN(out, "give a capacity of at most ", 2)[1], " ")[0]
	e := start(t, plugintest.Options{Dir: dir, NodeID: node, PoolDir: poolDir, Capacity: plugintest.RoomCapacity})
	r, err := e.p.Controller().GetCapacity(ctx(t), &csi.GetCapacityRequest{})
	e.must("GetCapacity", err)
	if got := humanBytes(r.GetAvailableCapacity()); got != room {
		t.Errorf("the refusal names %s, the default capacity is %s", room, got)
	}
	e.p.Stop()
	e = start(t, plugintest.Options{Dir: dir, NodeID: node, PoolDir: poolDir, Capacity: "1Gi"})
	r, err = e.p.Controller().GetCapacity(ctx(t), &csi.GetCapacityRequest{})
	e.must("GetCapacity", err)
	if r.GetAvailableCapacity() != 1<<30 {
		t.Errorf("forced to 1Gi: capacity %d", r.GetAvailableCapacity())
	}
	e.p.Stop()

	// Two pools on one filesystem: each within the room, not both.
	out, err = plugintest.RunOnce(t, "--endpoint", "unix://"+filepath.Join(dir, "csi.sock"), "--node-id", node,
		"--pool=a="+filepath.Join(poolDir, "a")+",capacity=300Mi", "--pool=b="+filepath.Join(poolDir, "b")+",capacity=300Mi")
	if err == nil || !strings.Contains(out, "pools a (300Mi), b (300Mi) are on one filesystem and given 600Mi together") {
		t.Fatalf("two pools given 600 MiB of a 512 MiB filesystem: %v\n%s", err, out)
	}
}

// humanBytes is n as checkCapacities names it.
func humanBytes(n int64) string {
	if n%(1<<30) == 0 {
		return fmt.Sprintf("%dGi", n>>30)
	}
	return fmt.Sprintf("%dMi", n>>20)
}

// assertCleanBut is assertClean for a test whose pool has a filesystem of
// its own at poolDir (FilesystemPool): its loop device and mount stay.
func (e *env) assertCleanBut(poolDir string) {
	e.t.Helper()
	loops, mounts := plugintest.Leftovers(e.dir)
	var l, m []string
	for _, x := range loops {
		if !strings.HasSuffix(x, filepath.Base(poolDir)+".img)") {
			l = append(l, x)
		}
	}
	for _, x := range mounts {
		if x != poolDir {
			m = append(m, x)
		}
	}
	if len(l)+len(m) > 0 {
		e.t.Fatalf("leftovers: loop devices %v, mounts %v", l, m)
	}
}

// TestFilledPoolWithVolumesStillStarts: a pool that holds volumes, whose
// filesystem other files then fill below its --capacity, still starts (a
// restart that refused would leave every pod of the node without its
// volumes' mounts): its volumes stage, it admits nothing beyond what the
// filesystem can give (GetCapacity says so, CreateVolume beyond it is
// RESOURCE_EXHAUSTED), and it reports PoolCapacityReduced in its health,
// its metrics and its log. (A pool holding nothing is still refused:
// TestCapacityAboveTheRoomIsRefused.)
func TestFilledPoolWithVolumesStillStarts(t *testing.T) {
	plugintest.RequireRoot(t)
	dir := plugintest.TempDir(t)
	mnt := plugintest.FilesystemPool(t, dir, "xfs", 512<<20)
	const given = 300 << 20
	e := start(t, plugintest.Options{Dir: dir, NodeID: node, PoolDir: filepath.Join(mnt, "pool"), Capacity: plugintest.RoomCapacity,
		Args: []string{"--capacity", "300Mi", "--metrics-address", "127.0.0.1:0"}})
	id := e.create("v", 64<<20, rwo, nil).GetVolumeId()
	e.up(id, rwo)
	writeFile(t, filepath.Join(e.target(id), "f"), "data")
	e.must("NodeUnpublishVolume", e.unpublish(id))
	e.must("NodeUnstageVolume", e.unstage(id))
	e.p.Stop()

	// Logs, images: 200 MiB of the filesystem the pool does not own.
	f, err := os.Create(filepath.Join(mnt, "foreign.log"))
	if err != nil {
		t.Fatal(err)
	}
	err = unix.Fallocate(int(f.Fd()), 0, 0, 200<<20)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}

	e.p.Restart()
	e.up(id, rwo)
	if got := readFile(t, filepath.Join(e.target(id), "f")); got != "data" {
		t.Fatalf("the volume's file after the restart: %q", got)
	}

	var st unix.Statfs_t
	if err := unix.Statfs(mnt, &st); err != nil {
		t.Fatal(err)
	}
	r, err := e.p.Controller().GetCapacity(ctx(t), &csi.GetCapacityRequest{})
	e.must("GetCapacity", err)
	avail := r.GetAvailableCapacity()
	if fsFree := int64(st.Bavail) * st.Bsize; avail <= 0 || avail > fsFree || avail+64<<20 >= given {
		t.Fatalf("GetCapacity: %d MiB available with 64 MiB allocated and %d MiB free on the filesystem: want less than the free space", avail>>20, fsFree>>20)
	}
	_, err = e.p.Controller().CreateVolume(ctx(t), &csi.CreateVolumeRequest{Name: "beyond", CapacityRange: &csi.CapacityRange{RequiredBytes: avail + 1<<20},
		VolumeCapabilities: []*csi.VolumeCapability{blockCap()}})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "reduced") {
		t.Fatalf("CreateVolume beyond the filesystem's room: %v, want RESOURCE_EXHAUSTED saying the capacity was reduced", err)
	}
	within := e.create("within", avail, blockCap(), nil).GetVolumeId()

	h, err := e.p.Node().NodeGetStorageHealth(ctx(t), &csi.NodeGetStorageHealthRequest{})
	e.must("NodeGetStorageHealth", err)
	var reasons []string
	for _, b := range h.GetBackendHealth() {
		reasons = append(reasons, b.GetStatus().String()+"/"+b.GetReason()+": "+b.GetMessage())
	}
	if len(reasons) != 1 || !strings.HasPrefix(reasons[0], "STORAGE_DEGRADED/PoolCapacityReduced: pool default: ") {
		t.Fatalf("NodeGetStorageHealth: %q, want PoolCapacityReduced", reasons)
	}
	if !strings.Contains(e.p.Log(), "its capacity, 300Mi, is more than the filesystem") {
		t.Errorf("the start did not log the reduction:\n%s", e.p.Log())
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
	labels := `{node="` + node + `",pool="default"} `
	if !strings.Contains(string(body), "\npodvol_pool_configured_capacity_bytes"+labels+"3.145728e+08\n") ||
		!strings.Contains(string(body), fmt.Sprintf("\npodvol_pool_capacity_bytes%s%g\n", labels, float64(avail+64<<20))) {
		t.Fatalf("metrics: want the configured capacity, 300 MiB, and the capacity reduced to %d MiB:\n%s", (avail+64<<20)>>20, body)
	}

	e.must("DeleteVolume", e.delete(within))
	e.down(id)
	e.assertCleanBut(mnt)
}
