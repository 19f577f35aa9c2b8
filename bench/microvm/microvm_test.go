// Package microvmbench measures what direct assignment buys a microVM: the
// guest's boot time with a direct-assigned podvol volume, and fio in the
// guest on that volume as a virtio-blk disk against the same image's
// filesystem shared into the guest by virtio-fs (what a Kata pod gets
// without direct assignment). It drives the real plugin and the test
// runtime of test/microvm. `make bench-microvm` runs it and writes
// README.md and microvm.png here.
package microvmbench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/podvol/podvol/internal/directvolume"
	"github.com/podvol/podvol/test/microvm"
	"github.com/podvol/podvol/test/microvm/agentapi"
	"github.com/podvol/podvol/test/microvm/guest"
	"github.com/podvol/podvol/test/plugintest"
)

const (
	boots     = 5
	fioSize   = "64M"
	fioTime   = 8 // seconds a job, after 1 s of ramp
	fioEngine = "psync"
	volSize   = 1 << 30
	guestMem  = 1024 // MiB: the initramfs with fio and its libraries is ~80 MiB unpacked
	shareTag  = "podvol"
	reportDir = "." // go test runs in the package directory: the report is committed beside this file
)

// job is one fio workload: direct I/O, one request at a time (psync).
// libaio with a deeper queue stalled the TCG guest's virtio-blk for minutes
// (jbd2 hung), so every job here has queue depth 1.
type job struct {
	Name, RW, BS string
}

var jobs = []job{
	{"4k random read", "randread", "4k"},
	{"4k random write", "randwrite", "4k"},
	{"1M sequential read", "read", "1M"},
	{"1M sequential write", "write", "1M"},
}

// result is what fio measured for one job on one path.
type result struct {
	IOPS     float64
	BWBytes  float64
	MeanLatU float64 // microseconds
}

type report struct {
	Accel       string
	Boot        []time.Duration // QEMU start to agent ready
	Mounted     []time.Duration // QEMU start to volume mounted (Runtime.Start)
	Uptime      []string        // guest kernel's uptime at agent ready
	Direct      map[string]result
	VirtioFS    map[string]result
	Initramfs   [2]int64 // bytes: the tests' guest, the benchmark's (fio)
	Virtiofsd   string
	FioVersion  string
	GuestKernel string
}

func BenchmarkMicroVM(b *testing.B) {
	plugintest.RequireRoot(b)
	guest.EnsurePackage(b, "qemu-system-x86_64", "qemu-system-x86")
	guest.EnsurePackage(b, "fio", "fio")
	if err := microvm.Probe(); err != nil {
		b.Fatalf("QEMU cannot start a microvm machine here: %v", err)
	}
	vfsd := virtiofsd(b)
	fio, err := exec.LookPath("fio")
	if err != nil {
		b.Fatal(err)
	}
	dir := plugintest.TempDir(b)
	lean := guest.Prepare(b, mkdir(b, dir, "lean"))
	full := guest.PrepareWith(b, mkdir(b, dir, "fio"), guest.Options{Filesystems: []string{"virtiofs"}, Binaries: []string{fio}})
	rep := &report{Accel: microvm.Accel(), Direct: map[string]result{}, VirtioFS: map[string]result{}, Virtiofsd: vfsd, GuestKernel: lean.Version}
	for i, g := range []*guest.Guest{lean, full} {
		if fi, err := os.Stat(g.Initramfs); err == nil {
			rep.Initramfs[i] = fi.Size()
		}
	}
	if out, err := exec.Command(fio, "--version").Output(); err == nil {
		rep.FioVersion = strings.TrimSpace(string(out))
	}

	rt := &microvm.Runtime{Root: filepath.Join(dir, "kata", "direct-volumes"), Sandboxes: filepath.Join(dir, "kata", "sbs"), Guest: lean, Logf: b.Logf}
	p := plugintest.Start(b, plugintest.Options{Dir: dir, Args: []string{"--kata-direct-volumes-dir", rt.Root, "--kata-sandbox-dirs", rt.Sandboxes}})
	must := func(what string, err error) {
		b.Helper()
		if err != nil {
			b.Fatalf("%s: %v\nplugin log:\n%s", what, err, p.Log())
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	c := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER},
	}
	v, err := p.Controller().CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "bench-microvm", CapacityRange: &csi.CapacityRange{RequiredBytes: volSize},
		VolumeCapabilities: []*csi.VolumeCapability{c}, Parameters: map[string]string{"directAssign": "always"}})
	must("CreateVolume", err)
	id := v.GetVolume().GetVolumeId()
	staging, target := filepath.Join(dir, "staging", id), filepath.Join(dir, "pods", id, "mount")
	mkdir(b, dir, "staging")
	mkdir(b, filepath.Dir(target))
	_, err = p.Node().NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: c})
	must("NodeStageVolume", err)
	_, err = p.Node().NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: c})
	must("NodePublishVolume (direct)", err)
	if _, err := directvolume.Read(rt.Root, target); err != nil {
		b.Fatalf("the volume was not assigned directly: %v", err)
	}

	b.ResetTimer()
	// Boot: the tests' guest, start to agent and to the volume mounted.
	for i := range boots {
		t0 := time.Now()
		sb, err := rt.Start(ctx, target, fmt.Sprintf("boot-%d", i))
		if err != nil {
			b.Fatalf("boot %d: %v", i, err)
		}
		rep.Mounted = append(rep.Mounted, time.Since(t0))
		rep.Boot = append(rep.Boot, sb.Booted)
		rep.Uptime = append(rep.Uptime, sb.Uptime)
		if err := sb.Stop(ctx); err != nil {
			b.Fatal(err)
		}
	}
	// A failure below leaves the volume published: unpublish and unstage
	// it so that the plugin's cleanup finds no loop device in use.
	b.Cleanup(func() {
		_, _ = p.Node().NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
		_, _ = p.Node().NodeUnstageVolume(context.Background(), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
	})

	// fio on the direct-assigned disk.
	rt.Guest, rt.MemoryMiB = full, guestMem
	sb, err := rt.Start(ctx, target, "fio-direct")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { stopIfRunning(sb) })
	runJobs(ctx, b, sb, rep.Direct)
	if err := sb.Stop(ctx); err != nil {
		b.Fatal(err)
	}
	// Unpublished, the volume is mounted on the host again at the staging
	// path: virtiofsd shares that filesystem, with fio's file on it.
	_, err = p.Node().NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
	must("NodeUnpublishVolume", err)
	if _, err := os.Stat(filepath.Join(staging, "fio.dat")); err != nil {
		b.Fatalf("the staging mount does not hold the file fio wrote in the guest: %v", err)
	}
	sock := filepath.Join(dir, "virtiofsd.sock")
	stopVfsd := startVirtiofsd(b, vfsd, sock, staging, filepath.Join(dir, "virtiofsd.log"))
	b.Cleanup(stopVfsd)
	sb, err = rt.Boot(ctx, "fio-virtiofs", microvm.Disk{VhostUserSocket: sock, Tag: shareTag})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { stopIfRunning(sb) })
	if err := sb.Mount(ctx, agentapi.Request{FsType: "virtiofs", Source: shareTag}); err != nil {
		b.Fatal(err)
	}
	runJobs(ctx, b, sb, rep.VirtioFS)
	err = sb.Stop(ctx)
	stopVfsd()
	if err != nil {
		b.Fatal(err)
	}
	b.StopTimer()

	_, err = p.Node().NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
	must("NodeUnstageVolume", err)
	_, err = p.Controller().DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
	must("DeleteVolume", err)

	b.ReportMetric(float64(median(rep.Boot).Milliseconds()), "boot-ms")
	for _, j := range jobs {
		if d, f := rep.Direct[j.Name], rep.VirtioFS[j.Name]; f.BWBytes > 0 {
			b.ReportMetric(d.BWBytes/f.BWBytes, strings.ReplaceAll(j.Name, " ", "-")+"-direct/virtiofs")
		}
	}
	// What the guests really ran under (kvm can answer and fail them).
	rep.Accel = microvm.Accel()
	if err := rep.write(reportDir); err != nil {
		b.Fatal(err)
	}
}

// runJobs runs each fio job in the guest on /run/volume/fio.dat.
func runJobs(ctx context.Context, b *testing.B, sb *microvm.Sandbox, into map[string]result) {
	b.Helper()
	for _, j := range jobs {
		t0 := time.Now()
		jctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		out, err := sb.Exec(jctx, 0, 0, nil, fmt.Sprintf(
			"/usr/bin/fio --name=bench --filename=%s/fio.dat --size=%s --direct=1 --ioengine=%s --rw=%s --bs=%s "+
				"--thread --time_based --ramp_time=1 --runtime=%d --output-format=json --output=/tmp/fio.json >/tmp/fio.log 2>&1 || { cat /tmp/fio.log; exit 1; }; cat /tmp/fio.json",
			agentapi.Mountpoint, fioSize, fioEngine, j.RW, j.BS, fioTime))
		cancel()
		if err != nil {
			b.Fatalf("fio %s in guest %s: %v", j.Name, sb.ID, err)
		}
		r, err := parseFio(out, strings.Contains(j.RW, "write"))
		if err != nil {
			b.Fatalf("fio %s in guest %s: %v\n%s", j.Name, sb.ID, err, out)
		}
		into[j.Name] = r
		b.Logf("%s, %s: %.0f IOPS, %.1f MiB/s, mean latency %.0f µs (%v)", sb.ID, j.Name, r.IOPS, r.BWBytes/(1<<20), r.MeanLatU, time.Since(t0).Round(time.Second))
	}
}

func parseFio(out string, write bool) (result, error) {
	// fio may print notes before its JSON.
	i := strings.Index(out, "{")
	if i < 0 {
		return result{}, fmt.Errorf("no JSON in fio's output")
	}
	var doc struct {
		Jobs []struct {
			Read, Write struct {
				IOPS    float64 `json:"iops"`
				BWBytes float64 `json:"bw_bytes"`
				Lat     struct {
					Mean float64 `json:"mean"`
				} `json:"lat_ns"`
			}
		} `json:"jobs"`
	}
	if err := json.Unmarshal([]byte(out[i:]), &doc); err != nil {
		return result{}, err
	}
	if len(doc.Jobs) != 1 {
		return result{}, fmt.Errorf("fio reported %d jobs, want 1", len(doc.Jobs))
	}
	s := doc.Jobs[0].Read
	if write {
		s = doc.Jobs[0].Write
	}
	if s.IOPS == 0 {
		return result{}, fmt.Errorf("fio did no I/O")
	}
	return result{IOPS: s.IOPS, BWBytes: s.BWBytes, MeanLatU: s.Lat.Mean / 1000}, nil
}

// virtiofsd finds the daemon: Debian's virtiofsd package (trixie and later),
// or the one bookworm's qemu-system-common ships.
func virtiofsd(b *testing.B) string {
	b.Helper()
	cands := []string{"/usr/libexec/virtiofsd", "/usr/lib/qemu/virtiofsd"}
	find := func() string {
		if p, err := exec.LookPath("virtiofsd"); err == nil {
			return p
		}
		for _, p := range cands {
			if _, err := os.Stat(p); err == nil {
				return p
			}
		}
		return ""
	}
	if p := find(); p != "" {
		return p
	}
	cmd := exec.Command("apt-get", "install", "-y", "-qq", "--no-install-recommends", "virtiofsd")
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	out, err := cmd.CombinedOutput()
	if p := find(); p != "" {
		return p
	}
	b.Fatalf("no virtiofsd in PATH or at %v, and apt-get install virtiofsd failed (%v: %s): install Debian's virtiofsd package (or qemu-system-common on bookworm)", cands, err, out)
	return ""
}

// startVirtiofsd shares dir on sock with Kata's default cache mode (auto)
// and returns how to stop it (by its PID).
func startVirtiofsd(b *testing.B, bin, sock, dir, logPath string) func() {
	b.Helper()
	log, err := os.Create(logPath)
	if err != nil {
		b.Fatal(err)
	}
	defer log.Close()
	var args []string
	if strings.HasPrefix(bin, "/usr/lib/qemu/") { // the C daemon: -o options
		args = []string{"--socket-path=" + sock, "-o", "source=" + dir, "-o", "cache=auto"}
	} else {
		args = []string{"--socket-path=" + sock, "--shared-dir=" + dir, "--cache=auto"}
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		b.Fatalf("start %s: %v", bin, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }() // its exit status says nothing once killed
	stop := func() {
		select {
		case <-exited:
		default:
			_ = cmd.Process.Kill()
			<-exited
		}
		_ = os.Remove(sock)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, err := os.Stat(sock); err == nil {
			return stop
		}
		select {
		case <-exited:
			l, _ := os.ReadFile(logPath)
			b.Fatalf("%s exited before it listened on %s:\n%s", bin, sock, l)
		default:
		}
		if time.Now().After(deadline) {
			stop()
			b.Fatalf("%s did not create %s within 10s", bin, sock)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stopIfRunning stops a guest a failure left running (QEMU killed by PID if
// it does not power off).
func stopIfRunning(sb *microvm.Sandbox) {
	if sb.Running() {
		_ = sb.Stop(context.Background())
	}
}

func mkdir(b *testing.B, elem ...string) string {
	b.Helper()
	d := filepath.Join(elem...)
	if err := os.MkdirAll(d, 0o750); err != nil {
		b.Fatal(err)
	}
	return d
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
