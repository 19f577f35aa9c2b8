package microvm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/moby/sys/mountinfo"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/podvol/podvol/internal/directvolume"
	"github.com/podvol/podvol/test/microvm/agentapi"
	"github.com/podvol/podvol/test/microvm/guest"
	"github.com/podvol/podvol/test/plugintest"
)

var (
	prepOnce sync.Once
	prepared *guest.Guest
	prepDir  string
	skipWhy  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if prepDir != "" {
		_ = os.RemoveAll(prepDir)
	}
	os.Exit(code)
}

// setup installs QEMU if it is missing, skips when it cannot start at all,
// and prepares the guest (kernel cached, initramfs built once per run).
func setup(t *testing.T) *guest.Guest {
	t.Helper()
	plugintest.RequireRoot(t)
	prepOnce.Do(func() {
		if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
			t.Logf("qemu-system-x86_64 missing: apt-get install qemu-system-x86")
			cmd := exec.Command("apt-get", "install", "-y", "-qq", "--no-install-recommends", "qemu-system-x86")
			cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
			if out, err := cmd.CombinedOutput(); err != nil {
				skipWhy = fmt.Sprintf("QEMU is not installed and apt-get install qemu-system-x86 failed: %v: %s", err, out)
				return
			}
		}
		if err := Probe(); err != nil {
			skipWhy = "QEMU cannot start a microvm machine here: " + err.Error()
			return
		}
		start := time.Now()
		dir, err := os.MkdirTemp("", "podvol-microvm-guest-")
		if err != nil {
			t.Fatal(err)
		}
		prepDir = dir
		prepared = guest.Prepare(t, dir)
		fi, _ := os.Stat(prepared.Initramfs)
		t.Logf("guest: kernel %s (%s), initramfs %d KiB with modules %v, prepared in %v; accelerator %s",
			prepared.Version, prepared.Kernel, fi.Size()>>10, prepared.Modules, time.Since(start).Round(time.Millisecond), Accel())
	})
	if skipWhy != "" {
		t.Skip(skipWhy)
	}
	if prepared == nil {
		t.Fatal("guest preparation failed in an earlier test")
	}
	return prepared
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	c, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return c
}

// env is one real podvol-plugin whose Kata directories are this test's.
type env struct {
	t   *testing.T
	dir string
	p   *plugintest.Plugin
	rt  *Runtime
}

func newEnv(t *testing.T, g *guest.Guest) *env {
	dir := plugintest.TempDir(t)
	rt := &Runtime{Root: filepath.Join(dir, "kata", "direct-volumes"), Sandboxes: filepath.Join(dir, "kata", "sbs"), Guest: g, Logf: t.Logf}
	p := plugintest.Start(t, plugintest.Options{Dir: dir, Args: []string{
		"--kata-direct-volumes-dir", rt.Root, "--kata-sandbox-dirs", rt.Sandboxes}})
	for _, d := range []string{"staging", "pods"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o750); err != nil {
			t.Fatal(err)
		}
	}
	return &env{t: t, dir: dir, p: p, rt: rt}
}

func (e *env) staging(id string) string { return filepath.Join(e.dir, "staging", id) }
func (e *env) target(id string) string {
	return filepath.Join(e.dir, "pods", id, "volumes", "kubernetes.io~csi", "pv", "mount")
}

func (e *env) must(what string, err error) {
	e.t.Helper()
	if err != nil {
		e.t.Fatalf("%s: %v\nplugin log:\n%s", what, err, e.p.Log())
	}
}

func rwop(fs string) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fs, MountFlags: []string{"noatime"}, VolumeMountGroup: "2000"}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER},
	}
}

func (e *env) create(name string, size int64, c *csi.VolumeCapability) string {
	return e.createSized(name, size, c).GetVolumeId()
}

func (e *env) createSized(name string, size int64, c *csi.VolumeCapability) *csi.Volume {
	r, err := e.p.Controller().CreateVolume(ctxT(e.t, time.Minute), &csi.CreateVolumeRequest{
		Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapabilities: []*csi.VolumeCapability{c},
		Parameters: map[string]string{"directAssign": "always", "fsGroupChangePolicy": "OnRootMismatch"},
	})
	e.must("CreateVolume "+name, err)
	return r.GetVolume()
}

func (e *env) stage(id string, c *csi.VolumeCapability) {
	e.t.Helper()
	_, err := e.p.Node().NodeStageVolume(ctxT(e.t, 2*time.Minute), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: e.staging(id), VolumeCapability: c})
	e.must("NodeStageVolume", err)
}

func (e *env) publish(id string, c *csi.VolumeCapability) {
	e.t.Helper()
	if err := os.MkdirAll(filepath.Dir(e.target(id)), 0o750); err != nil {
		e.t.Fatal(err)
	}
	_, err := e.p.Node().NodePublishVolume(ctxT(e.t, 2*time.Minute), &csi.NodePublishVolumeRequest{
		VolumeId: id, StagingTargetPath: e.staging(id), TargetPath: e.target(id), VolumeCapability: c,
		VolumeContext: map[string]string{"csi.storage.k8s.io/pod.name": "p", "csi.storage.k8s.io/pod.namespace": "default"},
	})
	e.must("NodePublishVolume (direct)", err)
}

func (e *env) unpublish(id string) {
	e.t.Helper()
	_, err := e.p.Node().NodeUnpublishVolume(ctxT(e.t, 2*time.Minute), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: e.target(id)})
	e.must("NodeUnpublishVolume", err)
}

func (e *env) unstage(id string) {
	e.t.Helper()
	_, err := e.p.Node().NodeUnstageVolume(ctxT(e.t, 2*time.Minute), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: e.staging(id)})
	e.must("NodeUnstageVolume", err)
}

func (e *env) delete(id string) {
	e.t.Helper()
	_, err := e.p.Controller().DeleteVolume(ctxT(e.t, time.Minute), &csi.DeleteVolumeRequest{VolumeId: id})
	e.must("DeleteVolume", err)
}

// hostMountsOf lists host mounts of dev (the filesystem mounted on the host).
func hostMountsOf(dev string) []string {
	ms, _ := mountinfo.GetMounts(func(m *mountinfo.Info) (bool, bool) { return m.Source != dev, false })
	var out []string
	for _, m := range ms {
		out = append(out, m.Mountpoint)
	}
	return out
}

func statGroup(t *testing.T, path string) (uint32, os.FileMode) {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(path)
	return st.Gid, fi.Mode()
}

const podUID, podGID, fsGroup = 1000, 1000, 2000

// TestGuestConsumesDirectVolume: podvol publishes a volume with
// directAssign: always; a real QEMU microVM, given only what podvol wrote in
// mountInfo.json, attaches the device as virtio-blk, mounts it with the
// fstype and options written there, applies the fsGroup, and a non-root pod
// user writes 100 MiB to it, which NodeGetVolumeStats (through the shim
// socket to the guest) shows as used. After the guest powers off and podvol unpublishes, the host sees the
// guest's files with the fsGroup, also after unstage and restage.
func TestGuestConsumesDirectVolume(t *testing.T) {
	g := setup(t)
	for _, tc := range []struct {
		fs   string
		size int64
	}{{"ext4", 192 << 20}, {"xfs", 320 << 20}} {
		t.Run(tc.fs, func(t *testing.T) {
			total := time.Now()
			e := newEnv(t, g)
			c := rwop(tc.fs)
			id := e.create("micro-"+tc.fs, tc.size, c)
			t.Logf("[%s] volume %s created (%d MiB)", tc.fs, id, tc.size>>20)
			e.stage(id, c)
			target := e.target(id)
			e.publish(id, c)
			info, err := directvolume.Read(e.rt.Root, target)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("[%s] published direct: mountInfo.json %+v", tc.fs, *info)
			if info.FsType != tc.fs || info.Metadata["fsGroup"] != "2000" {
				t.Fatalf("mountInfo: %+v", *info)
			}
			if m := hostMountsOf(info.Device); len(m) != 0 {
				t.Fatalf("%s is mounted on the host while assigned: %v", info.Device, m)
			}

			boot := time.Now()
			sb, err := e.rt.Start(ctxT(t, 3*time.Minute), target, "sandbox-"+tc.fs)
			if err != nil {
				t.Fatalf("boot the guest: %v", err)
			}
			stopped := false
			t.Cleanup(func() {
				if !stopped {
					_ = sb.Stop(context.Background())
				}
			})
			t.Logf("[%s] guest up and volume mounted in %v (agent ready at %v)", tc.fs, time.Since(boot).Round(time.Millisecond), sb.Booted.Round(time.Millisecond))
			ctx := ctxT(t, 5*time.Minute)

			// The guest mounted the device itself, as written.
			mounts, err := sb.Exec(ctx, 0, 0, nil, "grep ' /run/volume ' /proc/mounts; stat -c '%g %a' /run/volume")
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("[%s] in the guest: %s", tc.fs, strings.TrimSpace(mounts))
			fields := strings.Fields(strings.Split(mounts, "\n")[0])
			if len(fields) < 4 || fields[0] != sb.Device || fields[2] != tc.fs || !strings.Contains(","+fields[3]+",", ",noatime,") {
				t.Fatalf("guest mount is not %s %s with noatime: %q", sb.Device, tc.fs, mounts)
			}
			if !strings.Contains(mounts, "\n2000 2") { // group 2000, setgid
				t.Fatalf("fsGroup not applied to the volume root in the guest: %q", mounts)
			}
			// Nothing of it on the host meanwhile, and no second publication.
			if m := hostMountsOf(info.Device); len(m) != 0 {
				t.Fatalf("%s mounted on the host while the guest has it: %v", info.Device, m)
			}
			second := filepath.Join(e.dir, "pods", "second", "mount")
			_ = os.MkdirAll(filepath.Dir(second), 0o750)
			_, err = e.p.Node().NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: e.staging(id), TargetPath: second, VolumeCapability: c})
			if status.Code(err) != codes.FailedPrecondition {
				t.Fatalf("a second publication while the guest runs: %v, want FailedPrecondition", err)
			}

			// Usage as podvol reports it: the shim socket, the runtime,
			// the agent's statfs in the guest.
			stats := func() (bytes, inodes *csi.VolumeUsage) {
				t.Helper()
				st, err := e.p.Node().NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: target})
				e.must("NodeGetVolumeStats", err)
				u := st.GetUsage()
				if len(u) != 2 || u[0].GetUnit() != csi.VolumeUsage_BYTES || u[1].GetUnit() != csi.VolumeUsage_INODES {
					t.Fatalf("stats: %v", u)
				}
				return u[0], u[1]
			}
			before, _ := stats()
			// The pod's user: uid 1000, primary group 1000, the fsGroup as
			// a supplementary group (as kubelet runs it). It writes 100
			// MiB, which podvol's stats must show.
			w := time.Now()
			out, err := sb.Exec(ctx, podUID, podGID, []uint32{fsGroup},
				`id -u; echo "written in the guest as $(id -u)" > from-guest && mkdir sub && dd if=/dev/urandom of=sub/blob bs=1M count=100 2>/dev/null && sync && stat -c '%g' from-guest sub/blob && sha256sum sub/blob`)
			if err != nil {
				t.Fatalf("pod workload in the guest: %v", err)
			}
			t.Logf("[%s] workload as uid %d (groups %d,%d) in %v:\n%s", tc.fs, podUID, podGID, fsGroup, time.Since(w).Round(time.Millisecond), out)
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if len(lines) != 4 || lines[0] != "1000" || lines[1] != "2000" || lines[2] != "2000" {
				t.Fatalf("workload output: %q", out)
			}
			guestSum := strings.Fields(lines[3])[0]

			after, inodes := stats()
			direct, err := sb.Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			grew, shrank := after.GetUsed()-before.GetUsed(), before.GetAvailable()-after.GetAvailable()
			t.Logf("[%s] NodeGetVolumeStats before the write: used %d, available %d, total %d; after: used %d (+%.2f MiB), available %d (-%.2f MiB), total %d bytes; inodes used %d of %d",
				tc.fs, before.GetUsed(), before.GetAvailable(), before.GetTotal(), after.GetUsed(), float64(grew)/(1<<20), after.GetAvailable(), float64(shrank)/(1<<20), after.GetTotal(), inodes.GetUsed(), inodes.GetTotal())
			if after.GetUsed() != direct.Used || after.GetTotal() != direct.Total || inodes.GetUsed() != direct.InodesUsed {
				t.Fatalf("podvol's stats (bytes %v, inodes %v) are not the guest's statfs %+v", after, inodes, direct)
			}
			// 100 MiB of data, plus at most 2 MiB of metadata and the small
			// file: a filesystem with the volume's size, not the host's.
			const wrote, slack = 100 << 20, 2 << 20
			if grew < wrote || grew > wrote+slack || shrank < wrote || shrank > wrote+slack || after.GetTotal() != before.GetTotal() {
				t.Fatalf("after the guest wrote 100 MiB podvol reports used +%d, available -%d bytes, total %d -> %d; want both within [%d, %d] and the same total",
					grew, shrank, before.GetTotal(), after.GetTotal(), wrote, wrote+slack)
			}
			if asked := sb.StatsAsked(); len(asked) != 2 || asked[0] != info.Device || asked[1] != info.Device {
				t.Fatalf("the shim was asked for %v, want [%[2]s %[2]s]", asked, info.Device)
			}

			// The pod ends: the guest unmounts, syncs and powers off.
			down := time.Now()
			if err := sb.Stop(ctx); err != nil {
				t.Fatalf("guest shutdown: %v", err)
			}
			stopped = true
			t.Logf("[%s] guest powered off in %v; whole guest life %v", tc.fs, time.Since(down).Round(time.Millisecond), time.Since(boot).Round(time.Millisecond))

			e.unpublish(id)
			check := func(when string) {
				t.Helper()
				f := filepath.Join(e.staging(id), "from-guest")
				b, err := os.ReadFile(f)
				if err != nil || string(b) != "written in the guest as 1000\n" {
					t.Fatalf("%s: %s: %q, %v", when, f, b, err)
				}
				for _, p := range []string{f, filepath.Join(e.staging(id), "sub", "blob")} {
					var st syscall.Stat_t
					if err := syscall.Stat(p, &st); err != nil {
						t.Fatal(err)
					}
					if st.Uid != podUID || st.Gid != fsGroup {
						t.Fatalf("%s: %s owned by %d:%d, want %d:%d", when, p, st.Uid, st.Gid, podUID, fsGroup)
					}
				}
				sum, err := exec.Command("sha256sum", filepath.Join(e.staging(id), "sub", "blob")).Output()
				if err != nil || strings.Fields(string(sum))[0] != guestSum {
					t.Fatalf("%s: blob checksum on the host %q (%v), in the guest %s", when, sum, err, guestSum)
				}
				if gid, mode := statGroup(t, filepath.Join(e.staging(id), "sub")); gid != fsGroup || mode&os.ModeSetgid == 0 {
					t.Fatalf("%s: directory made in the guest: group %d mode %v", when, gid, mode)
				}
			}
			check("after unpublish")
			t.Logf("[%s] host sees the guest's files (uid 1000, group 2000, 100 MiB blob checksum equal) after unpublish", tc.fs)
			e.unstage(id)
			e.stage(id, c)
			check("after unstage and restage")
			t.Logf("[%s] and after unstage and restage", tc.fs)
			e.unstage(id)
			e.delete(id)
			if loops, mounts := plugintest.Leftovers(e.dir); len(loops)+len(mounts) > 0 {
				t.Fatalf("leftovers: loop devices %v, mounts %v", loops, mounts)
			}
			t.Logf("[%s] done in %v", tc.fs, time.Since(total).Round(time.Millisecond))
		})
	}
}

// TestGuestConsumesDirectBlockVolume: a raw block volume assigned directly is
// a virtio-blk disk of the volume's size in the guest; a pattern the guest
// writes to it is on the volume when the host gets it back.
func TestGuestConsumesDirectBlockVolume(t *testing.T) {
	g := setup(t)
	e := newEnv(t, g)
	c := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER},
	}
	vol := e.createSized("micro-block", 48<<20, c)
	id := vol.GetVolumeId()
	e.stage(id, c)
	target := e.target(id)
	e.publish(id, c)
	info, err := directvolume.Read(e.rt.Root, target)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("[block] volume %s (%d bytes) published direct: %+v", id, vol.GetCapacityBytes(), *info)
	if info.FsType != "" {
		t.Fatalf("block mountInfo has fstype %q", info.FsType)
	}
	boot := time.Now()
	sb, err := e.rt.Start(ctxT(t, 3*time.Minute), target, "sandbox-block")
	if err != nil {
		t.Fatalf("boot the guest: %v", err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = sb.Stop(context.Background())
		}
	})
	t.Logf("[block] guest up in %v", time.Since(boot).Round(time.Millisecond))
	ctx := ctxT(t, 5*time.Minute)
	// 4 MiB of a pattern at 1 MiB, written through the guest's disk.
	out, err := sb.Exec(ctx, 0, 0, nil, fmt.Sprintf(`cd /; blockdev --getsize64 %[1]s; yes podvol-direct-block | head -c 4194304 > /tmp/p; dd if=/tmp/p of=%[1]s bs=1M seek=1 conv=fsync 2>/dev/null; sync; sha256sum /tmp/p`, sb.Device))
	if err != nil {
		t.Fatalf("guest block workload: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	t.Logf("[block] in the guest: %q", lines)
	if len(lines) != 2 || lines[0] != fmt.Sprint(vol.GetCapacityBytes()) {
		t.Fatalf("guest disk size %q, want %d", out, vol.GetCapacityBytes())
	}
	down := time.Now()
	if err := sb.Stop(ctx); err != nil {
		t.Fatalf("guest shutdown: %v", err)
	}
	stopped = true
	t.Logf("[block] guest powered off in %v", time.Since(down).Round(time.Millisecond))
	e.unpublish(id)
	// The host reads the volume's device back.
	f, err := os.Open(info.Device)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4<<20)
	_, err = f.ReadAt(got, 1<<20)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	want := []byte(strings.Repeat("podvol-direct-block\n", 4<<20/20+1))[:4<<20]
	if string(got) != string(want) {
		t.Fatalf("the guest's pattern is not on the volume: %q...", got[:64])
	}
	t.Logf("[block] host reads the guest's 4 MiB pattern back from %s", info.Device)
	e.unstage(id)
	e.delete(id)
	if loops, mounts := plugintest.Leftovers(e.dir); len(loops)+len(mounts) > 0 {
		t.Fatalf("leftovers: loop devices %v, mounts %v", loops, mounts)
	}
}

// expand asks for size bytes as the CO does: ControllerExpandVolume
// (external-resizer), then NodeExpandVolume (kubelet) at path.
func (e *env) expand(ctx context.Context, id, path string, size int64, c *csi.VolumeCapability) (*csi.NodeExpandVolumeResponse, error) {
	e.t.Helper()
	cr, err := e.p.Controller().ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{
		VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapability: c})
	e.must("ControllerExpandVolume", err)
	if cr.GetCapacityBytes() != size || !cr.GetNodeExpansionRequired() {
		e.t.Fatalf("ControllerExpandVolume to %d: %v, want that capacity and node expansion required", size, cr)
	}
	return e.p.Node().NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{
		VolumeId: id, VolumePath: path, StagingTargetPath: e.staging(id),
		CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapability: c})
}

// TestGuestSeesExpandedVolume: a direct-assigned volume grows while no guest
// has it, staged (NodeExpandVolume at the staging path, which the CSI spec
// allows between NodeStageVolume and NodePublishVolume) and unstaged (its
// filesystem then grows at the next stage), and each time a new guest sees
// the larger filesystem with the data still on it. Growing it while a guest
// runs is refused by the runtime, and podvol returns that refusal as
// FAILED_PRECONDITION; the guest's filesystem stays as it was and grows at
// the next host stage (here: the unpublish, which mounts it on the host
// again).
func TestGuestSeesExpandedVolume(t *testing.T) {
	g := setup(t)
	for _, tc := range []struct {
		fs   string
		size int64
	}{{"ext4", 128 << 20}, {"xfs", 320 << 20}} {
		t.Run(tc.fs, func(t *testing.T) {
			const step = 64 << 20
			e := newEnv(t, g)
			c := rwop(tc.fs)
			id := e.create("grow-"+tc.fs, tc.size, c)
			target := e.target(id)
			ctx := ctxT(t, 10*time.Minute)
			e.stage(id, c)
			e.publish(id, c)
			device := ""
			// boot starts a guest on the published volume and returns its
			// view of the filesystem, checking the data is still there.
			boot := func(name, sum string) (*Sandbox, *Reply) {
				t.Helper()
				sb, err := e.rt.Start(ctx, target, name)
				if err != nil {
					t.Fatalf("boot the guest: %v", err)
				}
				t.Cleanup(func() {
					if sb.Running() {
						_ = sb.Stop(context.Background())
					}
				})
				device = sb.Info.Device
				script := "df -k /run/volume | tail -1"
				if sum != "" {
					script += "; sha256sum keep"
				}
				df, err := sb.Exec(ctx, 0, 0, nil, script)
				if err != nil {
					t.Fatal(err)
				}
				st, err := sb.Stats(ctx)
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("[%s] guest %s: disk %d bytes, filesystem %d bytes; df -k: %s", tc.fs, name, st.DeviceBytes, st.Total, strings.TrimSpace(df))
				if sum != "" && !strings.Contains(df, sum+"  keep") {
					t.Fatalf("the data written before the growth is not intact in guest %s: %q, want checksum %s", name, df, sum)
				}
				return sb, st
			}
			stop := func(sb *Sandbox) {
				t.Helper()
				if err := sb.Stop(ctx); err != nil {
					t.Fatalf("guest shutdown: %v", err)
				}
			}
			// grown checks that a new guest's filesystem grew from the
			// first guest's by about the volume's growth (minus what the
			// filesystem keeps for itself: inode tables, group metadata).
			grown := func(first, now *Reply, size int64) {
				t.Helper()
				want := size - tc.size
				got := now.Total - first.Total
				if now.DeviceBytes != size || got < want*85/100 || got > want {
					t.Fatalf("the guest sees a %d-byte disk and a filesystem %d bytes larger than at first; want a %d-byte disk and %d..%d bytes more",
						now.DeviceBytes, got, size, want*85/100, want)
				}
			}

			sb, first := boot("first-"+tc.fs, "")
			out, err := sb.Exec(ctx, 0, 0, nil, "dd if=/dev/urandom of=keep bs=1M count=8 2>/dev/null && sync && sha256sum keep")
			if err != nil {
				t.Fatal(err)
			}
			sum := strings.Fields(out)[0]

			// Online: the runtime refuses, podvol says so.
			size := tc.size + step
			_, err = e.expand(ctx, id, target, size, c)
			t.Logf("[%s] NodeExpandVolume to %d while the guest runs: %v", tc.fs, size, err)
			if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), agentapi.ResizeRefusal) || !strings.Contains(err.Error(), "500 Internal Server Error") {
				t.Fatalf("NodeExpandVolume while the guest runs: %v; want FailedPrecondition carrying the runtime's answer (500, %q)", err, agentapi.ResizeRefusal)
			}
			if rs := sb.Resizes(); len(rs) != 1 || rs[0].VolumePath != device || rs[0].Size != uint64(size) {
				t.Fatalf("the shim got resize requests %+v, want one for %s to %d bytes", rs, device, size)
			}
			if st, err := sb.Stats(ctx); err != nil || st.Total != first.Total {
				t.Fatalf("the guest's filesystem changed under it after the refused growth: %+v, %v (was %d bytes)", st, err, first.Total)
			}
			stop(sb)
			e.unpublish(id)
			// The host stage grew the filesystem the guest could not.
			var hs syscall.Statfs_t
			if err := syscall.Statfs(e.staging(id), &hs); err != nil {
				t.Fatal(err)
			}
			if hostTotal := int64(hs.Blocks) * hs.Bsize; hostTotal-first.Total < step*85/100 {
				t.Fatalf("after the unpublish the host's staging mount has %d bytes, the first guest had %d: the refused growth did not follow at the host stage", hostTotal, first.Total)
			}

			// Offline, staged, at the staging path.
			size += step
			r, err := e.expand(ctx, id, e.staging(id), size, c)
			e.must("NodeExpandVolume (staged, not published)", err)
			if r.GetCapacityBytes() != size {
				t.Fatalf("NodeExpandVolume returned %d bytes, want %d", r.GetCapacityBytes(), size)
			}
			e.publish(id, c)
			sb, now := boot("staged-"+tc.fs, sum)
			grown(first, now, size)
			stop(sb)
			e.unpublish(id)
			e.unstage(id)

			// Offline, unstaged: the image grows, the filesystem at stage.
			size += step
			r, err = e.expand(ctx, id, e.staging(id), size, c)
			e.must("NodeExpandVolume (unstaged)", err)
			if r.GetCapacityBytes() != size {
				t.Fatalf("NodeExpandVolume returned %d bytes, want %d", r.GetCapacityBytes(), size)
			}
			e.stage(id, c)
			e.publish(id, c)
			sb, now = boot("unstaged-"+tc.fs, sum)
			grown(first, now, size)
			stop(sb)
			e.unpublish(id)
			e.unstage(id)
			e.delete(id)
			if loops, mounts := plugintest.Leftovers(e.dir); len(loops)+len(mounts) > 0 {
				t.Fatalf("leftovers: loop devices %v, mounts %v", loops, mounts)
			}
		})
	}
}

// TestGuestBootsWithVolumeExpandedBeforeIt: kubelet's order for a pod whose
// volume was expanded while no pod used it. Kubelet (v1.37) stages and
// publishes the volume, then calls NodeExpandVolume with the pod's target
// path, all before the runtime creates the sandbox. The expansion succeeds
// (no guest has the filesystem: podvol grows it on the host, unmounted), and
// the guest that then boots from that publication sees the larger
// filesystem, with the data written before still intact.
func TestGuestBootsWithVolumeExpandedBeforeIt(t *testing.T) {
	g := setup(t)
	for _, tc := range []struct {
		fs         string
		size, grow int64
	}{{"ext4", 128 << 20, 96 << 20}, {"xfs", 320 << 20, 160 << 20}} {
		t.Run(tc.fs, func(t *testing.T) {
			e := newEnv(t, g)
			c := rwop(tc.fs)
			id := e.create("kubelet-order-"+tc.fs, tc.size, c)
			target := e.target(id)
			ctx := ctxT(t, 10*time.Minute)
			e.stage(id, c)
			// Data from an earlier pod (written on the host's stage).
			keep := filepath.Join(e.staging(id), "keep")
			if out, err := exec.Command("sh", "-c", "dd if=/dev/urandom of="+keep+" bs=1M count=8 2>/dev/null && sync").CombinedOutput(); err != nil {
				t.Fatalf("write %s: %v: %s", keep, err, out)
			}
			sum, err := exec.Command("sha256sum", keep).Output()
			if err != nil {
				t.Fatal(err)
			}
			var hs syscall.Statfs_t
			if err := syscall.Statfs(e.staging(id), &hs); err != nil {
				t.Fatal(err)
			}
			before := int64(hs.Blocks) * hs.Bsize

			e.publish(id, c)
			size := tc.size + tc.grow
			r, err := e.expand(ctx, id, target, size, c)
			e.must("NodeExpandVolume at the target path before the sandbox exists", err)
			if r.GetCapacityBytes() != size {
				t.Fatalf("NodeExpandVolume returned %d bytes, want %d", r.GetCapacityBytes(), size)
			}
			info, err := directvolume.Read(e.rt.Root, target)
			if err != nil {
				t.Fatal(err)
			}
			if m := hostMountsOf(info.Device); len(m) != 0 {
				t.Fatalf("%s is mounted on the host after the expansion: %v", info.Device, m)
			}

			sb, err := e.rt.Start(ctx, target, "sandbox-"+tc.fs)
			if err != nil {
				t.Fatalf("boot the guest: %v", err)
			}
			t.Cleanup(func() {
				if sb.Running() {
					_ = sb.Stop(context.Background())
				}
			})
			out, err := sb.Exec(ctx, 0, 0, nil, "df -k /run/volume | tail -1; sha256sum keep")
			if err != nil {
				t.Fatal(err)
			}
			st, err := sb.Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("[%s] host filesystem before %d bytes; guest after NodeExpandVolume to %d: disk %d bytes, filesystem %d bytes; df -k and checksum:\n%s",
				tc.fs, before, size, st.DeviceBytes, st.Total, strings.TrimSpace(out))
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if len(lines) != 2 || !strings.HasPrefix(lines[1], strings.Fields(string(sum))[0]+"  ") {
				t.Fatalf("the data written before the growth is not intact in the guest: %q, want checksum %s", out, strings.Fields(string(sum))[0])
			}
			df := strings.Fields(lines[0])
			var dfKiB int64
			if len(df) < 2 {
				t.Fatalf("df: %q", lines[0])
			}
			if _, err := fmt.Sscan(df[1], &dfKiB); err != nil {
				t.Fatalf("df: %q: %v", lines[0], err)
			}
			// The filesystem grew by about the volume's growth (minus what
			// it keeps for itself), in df and in statfs.
			want := tc.grow
			for what, got := range map[string]int64{"df": dfKiB<<10 - before, "statfs": st.Total - before} {
				if got < want*85/100 || got > want {
					t.Fatalf("the guest's %s shows a filesystem %d bytes larger than before (disk %d bytes); want %d..%d bytes more: NodeExpandVolume did not grow it",
						what, got, st.DeviceBytes, want*85/100, want)
				}
			}
			if st.DeviceBytes != size {
				t.Fatalf("the guest's disk is %d bytes, want %d", st.DeviceBytes, size)
			}
			if err := sb.Stop(ctx); err != nil {
				t.Fatalf("guest shutdown: %v", err)
			}
			e.unpublish(id)
			e.unstage(id)
			e.delete(id)
			if loops, mounts := plugintest.Leftovers(e.dir); len(loops)+len(mounts) > 0 {
				t.Fatalf("leftovers: loop devices %v, mounts %v", loops, mounts)
			}
		})
	}
}
