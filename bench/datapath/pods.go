package datapath

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/podvol/podvol/bench/internal/plot"
	"github.com/podvol/podvol/internal/devcluster"
	"github.com/podvol/podvol/internal/names"
	"github.com/podvol/podvol/internal/versions"
)

// The pod layer: fio in pods on the dev cluster, on podvol volumes of each
// lifecycle and on the node's own emptyDir and hostPath, all on one node.

const (
	podNamespace = "podvol-bench-datapath"
	// FioImage is the image the pod layer imports: fio and its libraries
	// from this host (devcluster.ImportToolImage).
	FioImage  = "localhost/fio:podvol-bench"
	podMount  = "/data"
	fioOutput = "/tmp/fio.json"
)

// PodCell is one kind of volume the pod layer measures.
type PodCell struct {
	Name string
	// Podvol cells are measured against the baselines; their image's
	// residency is measured on the host.
	Podvol bool
}

// PodCells are the pod layer's cells, the baselines first.
var PodCells = []PodCell{
	{Name: "emptyDir"},
	{Name: "hostPath"},
	{Name: "pvc", Podvol: true},
	{Name: "ephemeral", Podvol: true},
	{Name: "inline", Podvol: true},
}

// PodBaselines are the cells the podvol cells are compared with.
var PodBaselines = []string{"emptyDir", "hostPath"}

// PodOptions configures the pod layer.
type PodOptions struct {
	Config Config
	FS     string // ext4 or xfs, for every podvol cell
	// HostPath is the hostPath cell's directory on the node.
	HostPath string
	// Lock is the dev cluster's lock file (the Makefile's CONFORMANCE_LOCK).
	Lock string
	Logf func(format string, a ...any)
}

// StorageClass is deploy/base's class for a filesystem.
func StorageClass(fs string) (string, error) {
	switch fs {
	case "ext4":
		return "podvol", nil
	case "xfs":
		return "podvol-xfs", nil
	}
	return "", fmt.Errorf("no podvol StorageClass for filesystem %q (ext4, xfs)", fs)
}

// VolumeSize is what a volume needs for the jobs: the fio file and the
// buffered write side by side, and room for the filesystem's own metadata
// and ext4's reserved blocks.
func VolumeSize(c Config) int64 { return c.Size + c.WriteSize + 512<<20 }

// PodManifest is the cell's pod (and, for pvc, its claim) on node, the
// volume mounted at /data, idle until the benchmark execs its jobs.
func PodManifest(cell PodCell, ns, node, fs, hostPath string, c Config) (string, error) {
	size := strconv.FormatInt(VolumeSize(c)>>20, 10) + "Mi"
	class, err := StorageClass(fs)
	if err != nil {
		return "", err
	}
	var volume, claim string
	switch cell.Name {
	case "emptyDir":
		volume = "emptyDir: {}"
	case "hostPath":
		if !filepath.IsAbs(hostPath) {
			return "", fmt.Errorf("the hostPath cell needs an absolute directory, not %q", hostPath)
		}
		volume = fmt.Sprintf("hostPath: {path: %q, type: DirectoryOrCreate}", hostPath)
	case "pvc":
		volume = "persistentVolumeClaim: {claimName: pvc}"
		claim = fmt.Sprintf(`apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: pvc, namespace: %s}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: %s
  resources: {requests: {storage: %s}}
---
`, ns, class, size)
	case "ephemeral":
		volume = fmt.Sprintf(`ephemeral:
      volumeClaimTemplate:
        spec:
          accessModes: [ReadWriteOnce]
          storageClassName: %s
          resources: {requests: {storage: %s}}`, class, size)
	case "inline":
		volume = fmt.Sprintf("csi: {driver: %s, volumeAttributes: {size: %s, fsType: %s}}", names.Driver, size, fs)
	default:
		return "", fmt.Errorf("no pod cell %q", cell.Name)
	}
	return claim + fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s}
spec:
  terminationGracePeriodSeconds: 1
  nodeSelector: {kubernetes.io/hostname: %s}
  containers:
  - name: fio
    image: %s
    imagePullPolicy: Never
    command: ["sh", "-c", "exec sleep 36000"]
    volumeMounts: [{name: data, mountPath: %s}]
  volumes:
  - name: data
    %s
`, strings.ToLower(cell.Name), ns, node, FioImage, podMount, volume), nil
}

// shellQuote quotes s for sh.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_=./:,", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// fioScript runs fio with args in the pod and prints its JSON, or its
// output and a failure.
func fioScript(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = shellQuote(a)
	}
	return "fio " + strings.Join(q, " ") + " >/tmp/fio.log 2>&1 || { cat /tmp/fio.log; exit 1; }; cat " + fioOutput
}

// PodJobScript is the shell command that runs job j in a pod (its JSON on
// stdout); PodPrepScript writes the jobs' file first.
func PodJobScript(c Config, j Job) (string, error) {
	file := podMount + "/fio.dat"
	if j.Kind == Fsync {
		file = podMount + "/etcd.dat"
	}
	args, err := Args(c, j, file, fioOutput)
	if err != nil {
		return "", err
	}
	return fioScript(args), nil
}

// PodPrepScript writes the file the throughput jobs run on.
func PodPrepScript(c Config) string {
	return fioScript(PrepArgs(c, podMount+"/fio.dat", fioOutput))
}

// PodWriteScript removes the fio files and writes c.WriteSize buffered,
// synced before dd ends.
func PodWriteScript(c Config) string {
	return fmt.Sprintf("rm -f %[1]s/fio.dat %[1]s/etcd.dat && dd if=/dev/zero of=%[1]s/dd.dat bs=1M count=%[2]d conv=fsync 2>&1",
		podMount, c.WriteSize>>20)
}

// NewImages are the image files in after that were not in before: the
// image of the volume a cell's pod just got.
func NewImages(before, after []string) []string {
	var n []string
	for _, a := range after {
		if !slices.Contains(before, a) {
			n = append(n, a)
		}
	}
	return n
}

// PodReport is a run of the pod layer.
type PodReport struct {
	Date               time.Time
	Took               time.Duration
	Commit, Kernel     string
	LoadStart, LoadEnd string
	Node, FS           string
	Kubernetes         string
	Config             Config
	// Results are by PodKey(cell, job).
	Results map[string]Result
	Loops   map[string]Loop // podvol cells' loop devices
	Errors  map[string]string
}

// PodKey names a pod cell's result.
func PodKey(cell, job string) string { return cell + "/" + job }

// Markdown is the pod layer's section of the report.
func (r *PodReport) Markdown() string {
	var w strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&w, format+"\n", a...) }
	c := r.Config
	p("## Pod layer: fio in pods on the dev cluster (%s)", r.Date.UTC().Format("2006-01-02 15:04 UTC"))
	p("")
	p("`DATAPATH_FLAGS=-pods make bench-datapath` (holds the dev cluster's lock; brings the cluster up if it is not running):")
	p("one pod per cell on node %s, each idle with its volume at `/data`, in image `%s` (the host's fio and every", r.Node, FioImage)
	p("library `ldd` names, built and imported by `devcluster.ImportToolImage`: no registry). The same jobs as above run in")
	p("each pod through `kubectl exec`, each job on every cell in turn (%d round(s), the median round's figure), the host's", c.Rounds)
	p("page cache dropped before each; podvol")
	p("volumes are %s, %s; residency is the podvol image's pages in the node's (the host's) page cache.", r.FS, gib(VolumeSize(c)))
	p("Commit %s, kernel %s, Kubernetes %s; load average %s at the start, %s at the end; the run took %s.",
		r.Commit, r.Kernel, r.Kubernetes, r.LoadStart, r.LoadEnd, r.Took.Round(time.Second))
	p("")
	var loops []string
	for _, cell := range PodCells {
		if l, ok := r.Loops[cell.Name]; ok {
			dio := "buffered"
			if l.DirectIO {
				dio = "direct I/O"
			}
			loops = append(loops, fmt.Sprintf("%s: %s, %d-byte sectors", cell.Name, dio, l.LogicalBlock))
		}
	}
	if len(loops) > 0 {
		p("Loop devices: %s.", strings.Join(loops, "; "))
		p("")
	}
	head, sep := "| job |", "|---|"
	for _, cell := range PodCells {
		head += " " + cell.Name + " |"
		sep += "---|"
	}
	p("%s", head)
	p("%s", sep)
	for _, j := range Jobs {
		row := "| " + j.Name + " |"
		for _, cell := range PodCells {
			if !cell.Podvol && j.Kind == Residency {
				row += " n/a |"
				continue
			}
			row += " " + Figure(j, r.Results[PodKey(cell.Name, j.Key)]) + " |"
		}
		p("%s", row)
	}
	p("")
	for _, base := range PodBaselines {
		head, sep := "| job |", "|---|"
		for _, cell := range PodCells {
			if cell.Podvol {
				head += " " + cell.Name + " / " + base + " |"
				sep += "---|"
			}
		}
		p("%s target |", head)
		p("%s---|", sep)
		for _, j := range Jobs {
			row := "| " + j.Name + " |"
			for _, cell := range PodCells {
				if cell.Podvol {
					row += " " + VerdictText(j, Judge(j, r.Results[PodKey(base, j.Key)], r.Results[PodKey(cell.Name, j.Key)])) + " |"
				}
			}
			p("%s %s |", row, TargetText(j.Kind))
		}
		p("")
	}
	failedJobs(p, r.Errors)
	p("emptyDir and hostPath are directories of the node's root filesystem; podvol's volumes are images in the node's")
	p("pool (an XFS filesystem on a loop-attached image on that same root filesystem), so a podvol volume crosses two")
	p("loop devices here where a real node's pool sits on its disk: its ratios here are a floor.")
	return w.String()
}

// RunPods runs the pod layer on the dev cluster and returns its report.
// The cluster is brought up if it is not running, and left as it was found
// otherwise: the benchmark's namespace and hostPath directory are removed.
func RunPods(ctx context.Context, o PodOptions) (*PodReport, error) {
	if err := o.Config.Validate(); err != nil {
		return nil, err
	}
	if _, err := StorageClass(o.FS); err != nil {
		return nil, err
	}
	if o.Lock == "" || o.HostPath == "" {
		return nil, errors.New("the pod layer needs the dev cluster's lock file and a hostPath directory")
	}
	logf := o.Logf
	lock, err := os.OpenFile(o.Lock, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("the dev cluster's lock %s: %w", o.Lock, err)
	}
	defer lock.Close()
	logf("waiting for the dev cluster's lock %s (another user of the cluster holds it while this waits)", o.Lock)
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return nil, fmt.Errorf("lock %s: %w", o.Lock, err)
	}
	cl := devcluster.New(devcluster.Config{Out: os.Stderr})
	if !cl.Running() {
		logf("the dev cluster is not running: bringing it up (it stays up)")
		if err := cl.Up(ctx); err != nil {
			return nil, err
		}
	}
	node := cl.Nodes[0]
	r := &PodReport{Date: time.Now(), Kernel: plot.Uname(), LoadStart: plot.LoadAvg(), Node: node.Name, FS: o.FS, Kubernetes: versions.Kubernetes,
		Config: o.Config, Results: map[string]Result{}, Loops: map[string]Loop{}, Errors: map[string]string{}}
	logf("building and importing %s (fio and its libraries)", FioImage)
	if err := cl.ImportToolImage(ctx, FioImage, "fio"); err != nil {
		return nil, err
	}
	_, _ = cl.RunKubectl(ctx, "delete", "namespace", podNamespace, "--ignore-not-found", "--wait=true", "--timeout=5m")
	if _, err := cl.RunKubectl(ctx, "create", "namespace", podNamespace); err != nil {
		return nil, err
	}
	defer func() {
		// Its own context: the run's may be over (interrupted).
		dctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if _, err := cl.RunKubectl(dctx, "delete", "namespace", podNamespace, "--wait=true", "--timeout=5m"); err != nil {
			logf("deleting namespace %s: %v (delete it by hand)", podNamespace, err)
		}
		if err := os.RemoveAll(o.HostPath); err != nil {
			logf("removing the hostPath directory %s: %v", o.HostPath, err)
		}
	}()
	images := map[string]string{}
	volumes := filepath.Join(node.PoolDir(), "volumes")
	for _, cell := range PodCells {
		before, _ := filepath.Glob(filepath.Join(volumes, "*.img"))
		m, err := PodManifest(cell, podNamespace, node.Name, o.FS, o.HostPath, o.Config)
		if err != nil {
			return nil, err
		}
		if err := cl.Apply(ctx, m); err != nil {
			return nil, fmt.Errorf("cell %s: %w", cell.Name, err)
		}
		pod := strings.ToLower(cell.Name)
		if err := cl.WaitPod(ctx, podNamespace, pod, 5*time.Minute); err != nil {
			return nil, fmt.Errorf("cell %s: %w", cell.Name, err)
		}
		if cell.Podvol {
			after, _ := filepath.Glob(filepath.Join(volumes, "*.img"))
			n := NewImages(before, after)
			if len(n) != 1 {
				return nil, fmt.Errorf("cell %s: %d new images in %s (%v), want 1: is something else using node %s?", cell.Name, len(n), volumes, n, node.Name)
			}
			images[cell.Name] = n[0]
			l, err := LoopOf(n[0])
			if err != nil {
				return nil, fmt.Errorf("cell %s: %w", cell.Name, err)
			}
			r.Loops[cell.Name] = l
		}
		out, err := cl.Exec(ctx, podNamespace, pod, PodPrepScript(o.Config))
		if err != nil {
			return nil, fmt.Errorf("cell %s: writing the jobs' file: %w\n%s", cell.Name, err, out)
		}
		logf("cell %s ready on %s", cell.Name, node.Name)
	}
	// As on the host: each round starts at another cell, and a figure is
	// the median round's.
	samples := map[string][]Result{}
	for round := range o.Config.Rounds {
		for _, j := range Jobs {
			if j.Kind == Residency {
				continue
			}
			script, err := PodJobScript(o.Config, j)
			if err != nil {
				return nil, err
			}
			for _, i := range Order(len(PodCells), round) {
				cell := PodCells[i]
				key := PodKey(cell.Name, j.Key)
				if err := DropCaches(); err != nil {
					return nil, err
				}
				out, err := cl.Exec(ctx, podNamespace, strings.ToLower(cell.Name), script)
				if err == nil {
					var res Result
					if res, err = Parse(j, []byte(out)); err == nil {
						samples[key] = append(samples[key], res)
						logf("round %d, %s: %s", round+1, key, Figure(j, res))
						continue
					}
				} else {
					err = fmt.Errorf("%w: %s", err, lastLine(out))
				}
				r.Errors[fmt.Sprintf("%s (round %d)", key, round+1)] = err.Error()
			}
		}
	}
	for _, j := range Jobs {
		for _, cell := range PodCells {
			if rs := samples[PodKey(cell.Name, j.Key)]; len(rs) > 0 {
				r.Results[PodKey(cell.Name, j.Key)] = Median(j.Kind, rs)
			}
		}
	}
	// The residency last: it removes the fio jobs' files.
	for _, cell := range PodCells {
		if !cell.Podvol {
			continue
		}
		key := PodKey(cell.Name, "residency")
		if err := DropCaches(); err != nil {
			return nil, err
		}
		if out, err := cl.Exec(ctx, podNamespace, strings.ToLower(cell.Name), PodWriteScript(o.Config)); err != nil {
			r.Errors[key] = fmt.Sprintf("%v: %s", err, lastLine(out))
			continue
		}
		res, err := Resident(images[cell.Name])
		if err != nil {
			r.Errors[key] = err.Error()
			continue
		}
		r.Results[key] = Result{Resident: res, Written: o.Config.WriteSize}
		logf("%s: residency %s of %s", key, mib(res), mib(o.Config.WriteSize))
	}
	r.Took, r.LoadEnd = time.Since(r.Date), plot.LoadAvg()
	return r, nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	return s[strings.LastIndex(s, "\n")+1:]
}
