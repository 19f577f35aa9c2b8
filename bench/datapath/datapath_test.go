package datapath

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/podvol/podvol/bench/internal/plot"
	"github.com/podvol/podvol/internal/devcluster"
	"github.com/podvol/podvol/test/microvm/guest"
	"github.com/podvol/podvol/test/plugintest"
)

// The benchmark's flags, after -args (DATAPATH_FLAGS in the Makefile).
var (
	flagHost        = flag.Bool("host", true, "run the host layer (the real plugin, volumes vs the pool's filesystem); -host=false without -pods only rewrites README.md from the JSON figures")
	flagPods        = flag.Bool("pods", false, "run the pod layer on the dev cluster (takes its lock; brings it up if it is not running)")
	flagSize        = flag.String("size", "1g", "file (block: region) the fio jobs run on")
	flagWriteSize   = flag.String("write-size", "1g", "buffered write whose residency in the host page cache is measured")
	flagRuntime     = flag.Duration("runtime", DefaultConfig.Runtime, "measured time of each fio throughput job")
	flagRamp        = flag.Duration("ramp", DefaultConfig.Ramp, "unmeasured time before each fio throughput job")
	flagEtcdSize    = flag.String("etcd-size", DefaultConfig.EtcdSize, "what etcd's disk check writes")
	flagEtcdRuntime = flag.Duration("etcd-runtime", DefaultConfig.EtcdRuntime, "cap on etcd's disk check")
	flagRounds      = flag.Int("rounds", DefaultConfig.Rounds, "rounds of every fio job on every target; the report takes each one's median round")
	flagFS          = flag.String("fs", "xfs,ext4,block", "volumes of the host layer: xfs, ext4, block")
	flagPodFS       = flag.String("pod-fs", "xfs", "filesystem of the pod layer's podvol volumes: xfs or ext4")
	flagLock        = flag.String("cluster-lock", "/tmp/podvol-devcluster.lock", "the dev cluster's lock file (the Makefile passes CONFORMANCE_LOCK)")
	flagOut         = flag.String("out", ".", "directory for README.md, datapath.png and the JSON figures")
	flagVariants    multiFlag
)

func init() {
	flag.Var(&flagVariants, "variant", "an extra plugin variant, name=plugin-arguments (repeatable), e.g. -variant 'discard=--direct-io=true --discard=mount'")
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ", ") }
func (m *multiFlag) Set(s string) error { *m = append(*m, s); return nil }

func config(b *testing.B) Config {
	b.Helper()
	c := DefaultConfig
	var err error
	if c.Size, err = ParseSize(*flagSize); err != nil {
		b.Fatal(err)
	}
	if c.WriteSize, err = ParseSize(*flagWriteSize); err != nil {
		b.Fatal(err)
	}
	c.Runtime, c.Ramp, c.EtcdSize, c.EtcdRuntime, c.Rounds = *flagRuntime, *flagRamp, *flagEtcdSize, *flagEtcdRuntime, *flagRounds
	if err := c.Validate(); err != nil {
		b.Fatal(err)
	}
	return c
}

// BenchmarkDatapath is `make bench-datapath`. It runs once (-benchtime 1x):
// the figures are fio's, not the benchmark loop's.
func BenchmarkDatapath(b *testing.B) {
	plugintest.RequireRoot(b)
	guest.EnsurePackage(b, "fio", "fio")
	c := config(b)
	var host *Report
	var pods *PodReport
	if *flagHost {
		host = runHost(b, c)
	}
	if *flagPods {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Hour)
		defer cancel()
		hp, err := os.MkdirTemp("/var/tmp", "podvol-bench-datapath-")
		if err != nil {
			b.Fatal(err)
		}
		pods, err = RunPods(ctx, PodOptions{Config: c, FS: *flagPodFS, HostPath: hp, Lock: *flagLock, Logf: logf})
		if err != nil {
			b.Fatal(err)
		}
		pods.Commit = commit()
	}
	if host == nil && pods == nil {
		logf("-host=false and no -pods: README.md and the plot rewritten from the figures in %s", *flagOut)
	}
	if err := Write(*flagOut, host, pods); err != nil {
		b.Fatal(err)
	}
	h, p, err := Load(*flagOut)
	if err != nil {
		b.Fatal(err)
	}
	fmt.Print("\n" + Render(h, p))
}

var started = time.Now()

// logf prints progress as it happens (a benchmark's own log is printed
// only at its end, and cut short).
func logf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "[%s] %s\n", time.Since(started).Round(time.Second), fmt.Sprintf(format, a...))
}

// target is where a job runs: the pool's own filesystem or a volume.
type target struct {
	name    string // "pool" or fs/variant
	fs      string
	variant string
	file    string // the throughput jobs' file, or the block device
	etcd    string // etcd's file (the device, for block)
	dir     string // where the buffered write goes ("" for block)
	image   string // the volume's image ("" for the pool)
}

func runHost(b *testing.B, c Config) *Report {
	filesystems, err := ParseFilesystems(*flagFS)
	if err != nil {
		b.Fatal(err)
	}
	out, err := exec.Command(plugintest.Binary(b), "-h").CombinedOutput()
	if len(out) == 0 {
		b.Fatalf("podvol-plugin -h printed nothing: %v", err)
	}
	variants, err := AddVariants(DefaultVariants(string(out)), flagVariants)
	if err != nil {
		b.Fatal(err)
	}
	volSize := VolumeSize(c)
	// Room for every volume written full twice over, and the pool's files.
	poolSize := int64(len(filesystems)*len(variants))*(c.Size+c.WriteSize+64<<20) + c.Size + 2<<30
	poolSize = (poolSize + 1<<30 - 1) &^ (1<<30 - 1)
	r := NewReport(c, variants, filesystems)
	r.Date, r.Commit, r.Kernel, r.CPU, r.CPUs, r.LoadStart = time.Now(), commit(), plot.Uname(), plot.CPUModel(), plot.NumCPU(), plot.LoadAvg()
	r.PoolSize, r.VolumeSize = poolSize, volSize
	if v, err := exec.Command("fio", "--version").Output(); err == nil {
		r.Fio = strings.TrimSpace(string(v))
	}

	dir := plugintest.TempDir(b)
	mnt, poolDev := directPool(b, dir, poolSize)
	r.PoolFS = FSType(mnt)
	r.PoolDevice = poolDev
	// A bound on the whole layer, so that a hung fio or dd fails the run
	// rather than hold it until go test's own timeout.
	perTarget := 4*(c.Runtime+c.Ramp) + c.EtcdRuntime + time.Minute
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute+time.Duration(c.Rounds*(1+len(filesystems)*len(variants)))*perTarget)
	defer cancel()

	base := filepath.Join(mnt, "baseline")
	mkdir(b, base)
	targets := []target{{name: "pool", file: filepath.Join(base, "fio.dat"), etcd: filepath.Join(base, "etcd.dat"), dir: base}}
	for vi := range variants {
		v := &variants[vi]
		v.Loops = map[string]Loop{}
		vdir := mkdir(b, dir, v.Name)
		mkdir(b, vdir, "staging")
		mkdir(b, vdir, "pods")
		p := plugintest.Start(b, plugintest.Options{Dir: vdir, PoolDir: filepath.Join(mnt, v.Name), Args: v.Args})
		logf("variant %s: podvol-plugin %s", v.Name, strings.Join(v.Args, " "))
		for _, fs := range filesystems {
			t := publish(ctx, b, p, vdir, fs, volSize)
			t.variant, t.name = v.Name, fs+"/"+v.Name
			l, err := LoopOf(t.image)
			if err != nil {
				b.Fatalf("%s: %v", t.name, err)
			}
			v.Loops[fs] = l
			logf("%s: %s, direct I/O %v, %d-byte sectors", t.name, l.Device, l.DirectIO, l.LogicalBlock)
			targets = append(targets, t)
		}
	}

	outDir := mkdir(b, dir, "fio")
	runFio := func(j Job, file, output string) (Result, error) {
		args, err := Args(c, j, file, output)
		if err != nil {
			return Result{}, err
		}
		if o, err := exec.CommandContext(ctx, "fio", args...).CombinedOutput(); err != nil {
			return Result{}, fmt.Errorf("fio: %w: %s", err, strings.TrimSpace(string(o)))
		}
		o, err := os.ReadFile(output)
		if err != nil {
			return Result{}, err
		}
		return Parse(j, o)
	}
	fail := func(key string, err error) {
		logf("%s: %v", key, err)
		r.Errors[key] = err.Error()
	}
	b.ResetTimer()
	for _, t := range targets {
		if err := DropCaches(); err != nil {
			b.Fatal(err)
		}
		cmd := exec.CommandContext(ctx, "fio", PrepArgs(c, t.file, filepath.Join(outDir, strings.ReplaceAll(t.name, "/", "-")+"-prep.json"))...)
		if o, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("%s: writing the jobs' file: %v: %s", t.name, err, o)
		}
	}
	logf("the jobs' files are written (%s)", time.Since(r.Date).Round(time.Second))
	record := func(t target, j Job, res Result) {
		if t.name == "pool" {
			r.Pool[j.Key] = res
		} else {
			r.Volumes[VolKey(t.fs, t.variant, j.Key)] = res
		}
	}
	// Each round runs every fio job on every target, starting each round
	// at another target: a trend in the machine's load then weighs on no
	// target more than on the others.
	samples := map[string][]Result{}
	for round := range c.Rounds {
		for _, j := range Jobs {
			if j.Kind == Residency {
				continue
			}
			for _, i := range Order(len(targets), round) {
				t := targets[i]
				key := t.name + "/" + j.Key
				if err := DropCaches(); err != nil {
					b.Fatal(err)
				}
				file := t.file
				if j.Kind == Fsync {
					file = t.etcd
				}
				res, err := runFio(j, file, filepath.Join(outDir, fmt.Sprintf("%s-%d.json", strings.ReplaceAll(key, "/", "-"), round)))
				if err != nil {
					fail(fmt.Sprintf("%s (round %d)", key, round+1), err)
					continue
				}
				samples[key] = append(samples[key], res)
				logf("round %d, %s: %s", round+1, key, Figure(j, res))
			}
		}
	}
	for _, j := range Jobs {
		for _, t := range targets {
			if rs := samples[t.name+"/"+j.Key]; len(rs) > 0 {
				record(t, j, Median(j.Kind, rs))
				r.Samples[t.name+"/"+j.Key] = rs
			}
		}
	}
	// The residency last: it removes the fio jobs' files.
	j, _ := JobByKey("residency")
	for _, t := range targets {
		if t.image == "" {
			continue
		}
		key := t.name + "/" + j.Key
		if err := DropCaches(); err != nil {
			b.Fatal(err)
		}
		res, err := residency(ctx, c, t)
		if err != nil {
			fail(key, err)
			continue
		}
		record(t, j, res)
		logf("%s: %s", key, Figure(j, res))
	}
	b.StopTimer()
	r.Took, r.LoadEnd = time.Since(r.Date), plot.LoadAvg()
	for _, v := range variants {
		met, measured, all := r.Met(v.Name)
		b.ReportMetric(float64(met), v.Name+"-targets-met")
		logf("%s: %d of %d targets met (%d measured)", v.Name, met, all, measured)
	}
	return r
}

// residency removes the fio files, writes c.WriteSize buffered into the
// volume, synced, and counts the image's pages in the host page cache.
func residency(ctx context.Context, c Config, t target) (Result, error) {
	of := t.file // the block device
	if t.dir != "" {
		for _, f := range []string{t.file, t.etcd} {
			if err := os.Remove(f); err != nil {
				return Result{}, err
			}
		}
		of = filepath.Join(t.dir, "dd.dat")
		// The removal's metadata goes out before the cache is dropped:
		// what is counted afterwards is the write's.
		if err := DropCaches(); err != nil {
			return Result{}, err
		}
	}
	out, err := exec.CommandContext(ctx, "dd", "if=/dev/zero", "of="+of, "bs=1M", "count="+strconv.FormatInt(c.WriteSize>>20, 10), "conv=fsync").CombinedOutput()
	if err != nil {
		return Result{}, fmt.Errorf("dd: %w: %s", err, out)
	}
	res, err := Resident(t.image)
	if err != nil {
		return Result{}, err
	}
	return Result{Resident: res, Written: c.WriteSize}, nil
}

// publish creates, stages and publishes a volume of filesystem fs ("block":
// a raw block volume) and returns where its jobs run.
func publish(ctx context.Context, b *testing.B, p *plugintest.Plugin, vdir, fs string, size int64) target {
	b.Helper()
	vc := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	if fs == "block" {
		vc.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
	} else {
		vc.AccessType = &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fs}}
	}
	must := func(what string, err error) {
		b.Helper()
		if err != nil {
			b.Fatalf("%s (%s): %v\nplugin log:\n%s", what, fs, err, p.Log())
		}
	}
	v, err := p.Controller().CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "bench-" + fs, CapacityRange: &csi.CapacityRange{RequiredBytes: size},
		VolumeCapabilities: []*csi.VolumeCapability{vc}})
	must("CreateVolume", err)
	id := v.GetVolume().GetVolumeId()
	staging, tpath := filepath.Join(vdir, "staging", id), filepath.Join(vdir, "pods", fs)
	// Undone in reverse whatever happens below, before the plugin stops
	// (cleanups run last-in first-out): no loop device or mount is left.
	b.Cleanup(func() {
		bg := context.Background()
		_, _ = p.Node().NodeUnpublishVolume(bg, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: tpath})
		_, _ = p.Node().NodeUnstageVolume(bg, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
		_, _ = p.Controller().DeleteVolume(bg, &csi.DeleteVolumeRequest{VolumeId: id})
	})
	_, err = p.Node().NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: vc})
	must("NodeStageVolume", err)
	_, err = p.Node().NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: tpath, VolumeCapability: vc})
	must("NodePublishVolume", err)
	t := target{fs: fs, image: filepath.Join(p.PoolDir, "volumes", id+".img")}
	if fs == "block" {
		t.file, t.etcd = tpath, tpath
	} else {
		t.file, t.etcd, t.dir = filepath.Join(tpath, "fio.dat"), filepath.Join(tpath, "etcd.dat"), tpath
	}
	if _, err := os.Stat(t.image); err != nil {
		b.Fatalf("the volume's image is not where the pool keeps images: %v", err)
	}
	return t
}

// directPool makes the pool: XFS on a sparse image of size bytes attached
// with direct I/O, so that the pool's own figures are the disk's and not the
// host page cache's. It is taken down when the benchmark ends.
func directPool(b *testing.B, dir string, size int64) (mnt, describe string) {
	b.Helper()
	img := filepath.Join(dir, "pool.img")
	mnt = filepath.Join(dir, "pool")
	f, err := os.Create(img)
	if err != nil {
		b.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		b.Fatal(err)
	}
	f.Close()
	out, err := exec.Command("losetup", "--find", "--show", "--direct-io=on", img).CombinedOutput()
	if err != nil {
		b.Fatalf("losetup --direct-io=on %s: %v: %s", img, err, out)
	}
	dev := strings.TrimSpace(string(out))
	b.Cleanup(func() {
		// The volumes' loop devices keep the pool busy: they go first.
		plugintest.ForceClean(mnt)
		_ = syscall.Unmount(mnt, 0)
		_ = exec.Command("losetup", "-d", dev).Run()
	})
	l, err := LoopOf(img)
	if err != nil || !l.DirectIO {
		b.Fatalf("the pool's loop device %s has no direct I/O (%+v, %v): the pool's figures would be the page cache's", dev, l, err)
	}
	if out, err := exec.Command("mkfs.xfs", "-q", "-f", dev).CombinedOutput(); err != nil {
		b.Fatalf("mkfs.xfs: %v: %s", err, out)
	}
	mkdir(b, mnt)
	if out, err := exec.Command("mount", dev, mnt).CombinedOutput(); err != nil {
		b.Fatalf("mount: %v: %s", err, out)
	}
	backing := FSType(dir)
	src, _ := exec.Command("findmnt", "-n", "-o", "SOURCE", "--target", dir).Output()
	return mnt, fmt.Sprintf("%s, a %s sparse image attached with direct I/O (%d-byte sectors), the image on %s (%s)",
		l.Device, gib(size), l.LogicalBlock, backing, strings.TrimSpace(string(src)))
}

func mkdir(b *testing.B, elem ...string) string {
	b.Helper()
	d := filepath.Join(elem...)
	if err := os.MkdirAll(d, 0o750); err != nil {
		b.Fatal(err)
	}
	return d
}

// commit is the tree's commit, "-dirty" when it has changes.
func commit() string {
	out, err := exec.Command("git", "-C", devcluster.RepoRoot(), "describe", "--always", "--dirty", "--abbrev=12").Output()
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(out))
}
