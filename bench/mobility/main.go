// Command mobility measures how fast a snapshot's data moves between two
// nodes of the dev cluster (make bench-mobility), against a plain sparse
// copy of the same image between the same two pools.
//
// Each round: a pod on the source node writes -data of random bytes into a
// -size volume; a VolumeSnapshot is cut. Then, the host's page cache
// dropped before each:
//
//   - the plain copy: `cp --sparse=always` of the snapshot's image from the
//     source node's pool to the target node's, and an fsync of the copy
//     (the transfer syncs what it writes too);
//   - the transfer: a restore of the snapshot for a pod that runs only on
//     the target node; its plugin pulls the snapshot from the source's
//     (mutual TLS, checksums, checkpoints: what podvol ships), and logs how
//     long the pull took, which is the figure. The claim's wall time (from
//     its creation to its pod being ready: provisioner retries and the pod's
//     start included) is reported beside it.
//
// The report (README.md, mobility.png, mobility.json) goes to -out.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/podvol/podvol/bench/internal/plot"
	"github.com/podvol/podvol/internal/devcluster"
	"github.com/podvol/podvol/internal/names"
)

const namespace = "bench-mobility"

type config struct {
	size, data string
	rounds     int
	out        string
	timeout    time.Duration
	// The migration part: -migrations drains of a node holding a
	// replica whose claim of migrateSize holds migrateData and gets
	// migrateChanged more after the first copy.
	migrations                                int
	migrateSize, migrateDataQ, migrateChangeQ string
	migrateData, migrateChanged               int64
	parts                                     string
}

func main() {
	var c config
	flag.StringVar(&c.size, "size", "4Gi", "size of the source volume and of its restore")
	flag.StringVar(&c.data, "data", "1Gi", "random data the source's pod writes")
	flag.IntVar(&c.rounds, "rounds", 3, "rounds; the report gives each and their median")
	flag.StringVar(&c.out, "out", filepath.Join(devcluster.RepoRoot(), "bench", "mobility"), "directory for README.md, mobility.png and mobility.json")
	flag.DurationVar(&c.timeout, "step-timeout", 10*time.Minute, "how long one step (a write, a snapshot, a restore) may take")
	flag.IntVar(&c.migrations, "migrations", 1, "drains of a node holding a migrating replica (and of an emptyDir one)")
	flag.StringVar(&c.migrateSize, "migrate-size", "10Gi", "size of the migrating replica's volume")
	flag.StringVar(&c.migrateDataQ, "migrate-data", "2Gi", "random data the migrating replica writes before the drain")
	flag.StringVar(&c.migrateChangeQ, "migrate-changed", "256Mi", "random data it writes after the first copy, before its eviction")
	flag.StringVar(&c.parts, "parts", "transfer,migration", "which parts to run; a part left out keeps its figures from -out's mobility.json")
	rewrite := flag.Bool("rewrite", false, "only write README.md and mobility.png again from -out's mobility.json (no cluster, no root)")
	flag.Parse()
	run := run
	if *rewrite {
		run = rewriteReport
	}
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "bench-mobility:", err)
		os.Exit(1)
	}
}

type bench struct {
	config
	cl             *devcluster.Cluster
	source, target *devcluster.Node
	start          time.Time
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[%s] %s\n", time.Since(b.start).Round(time.Second), fmt.Sprintf(format, args...))
}

func run(c config) error {
	if os.Geteuid() != 0 {
		return errors.New("run as root: it drops the page cache and reads the nodes' pools")
	}
	if c.rounds < 1 {
		return errors.New("-rounds must be at least 1")
	}
	data, err := resource.ParseQuantity(c.data)
	if err != nil || data.Value() < 1<<20 {
		return fmt.Errorf("-data %q: want a quantity of at least 1Mi", c.data)
	}
	if _, err := resource.ParseQuantity(c.size); err != nil {
		return fmt.Errorf("-size %q: %w", c.size, err)
	}
	for _, q := range []struct {
		flag, v string
		to      *int64
	}{{"-migrate-data", c.migrateDataQ, &c.migrateData}, {"-migrate-changed", c.migrateChangeQ, &c.migrateChanged}} {
		v, err := resource.ParseQuantity(q.v)
		if err != nil || v.Value() < 1<<20 {
			return fmt.Errorf("%s %q: want a quantity of at least 1Mi", q.flag, q.v)
		}
		*q.to = v.Value()
	}
	transfers, migrations := strings.Contains(c.parts, "transfer"), strings.Contains(c.parts, "migration")
	var earlier Result
	if b, err := os.ReadFile(filepath.Join(c.out, jsonName)); err == nil {
		_ = json.Unmarshal(b, &earlier)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Up brings the cluster up, or brings a running one up to date with
	// this tree (as the e2e tests do), and it stays up.
	cl := devcluster.New(devcluster.Config{Out: os.Stderr})
	if err := cl.Up(ctx); err != nil {
		return err
	}
	if len(cl.Nodes) < 2 {
		return fmt.Errorf("the dev cluster has %d node(s); a transfer needs two", len(cl.Nodes))
	}
	b := &bench{config: c, cl: cl, source: cl.Nodes[0], target: cl.Nodes[1], start: time.Now()}
	res := &Result{Size: c.size, DataBytes: data.Value(), Source: b.source.Name, Target: b.target.Name, Date: b.start.UTC(), LoadStart: plot.LoadAvg()}
	// The namespace goes at the end whatever happens (an interrupt
	// included: ctx is then done, the cleanup has a context of its own).
	defer func() {
		if _, err := b.kubectl(context.Background(), "delete", "namespace", namespace, "--ignore-not-found", "--wait=true", "--timeout=5m"); err != nil {
			b.logf("deleting namespace %s: %v (delete it by hand)", namespace, err)
		}
	}()
	if _, err := b.kubectl(ctx, "create", "namespace", namespace); err != nil {
		return err
	}
	for r := 1; transfers && r <= c.rounds; r++ {
		round, err := b.round(ctx, r, data.Value())
		if err != nil {
			return fmt.Errorf("round %d: %w", r, err)
		}
		res.Rounds = append(res.Rounds, round)
		b.logf("round %d: %s of data; plain copy %s (%.0f MiB/s), transfer %s (%.0f MiB/s): %.2fx; restore ready after %s",
			r, mib(round.DataBytes), round.Copy, round.CopyRate(), round.Transfer, round.TransferRate(), round.Ratio(), round.Wall)
	}
	if !transfers {
		res.Size, res.DataBytes, res.Rounds = earlier.Size, earlier.DataBytes, earlier.Rounds
	}
	for r := 1; migrations && r <= c.migrations; r++ {
		m, err := b.migration(ctx, r)
		if err != nil {
			return fmt.Errorf("migration %d: %w", r, err)
		}
		res.Migrations = append(res.Migrations, m)
	}
	if !migrations {
		res.Migrations = earlier.Migrations
	}
	res.Took = time.Since(b.start).Round(time.Second)
	res.Machine = fmt.Sprintf("%s, %d CPUs, kernel %s, load average %s (1, 5, 15 min) at the end", plot.CPUModel(), plot.NumCPU(), plot.Uname(), plot.LoadAvg())
	if err := write(c.out, res); err != nil {
		return err
	}
	fmt.Print(Markdown(res))
	return nil
}

func (b *bench) kubectl(ctx context.Context, args ...string) (string, error) {
	return b.cl.RunKubectl(ctx, args...)
}

// round writes a source, snapshots it, copies its image by hand and by
// transfer, and deletes what it made.
func (b *bench) round(ctx context.Context, r int, data int64) (Round, error) {
	ctx, cancel := context.WithTimeout(ctx, 4*b.timeout)
	defer cancel()
	src, snap, dst := fmt.Sprintf("src-%d", r), fmt.Sprintf("snap-%d", r), fmt.Sprintf("restore-%d", r)
	writer, reader := "writer-"+strconv.Itoa(r), "reader-"+strconv.Itoa(r)
	defer func() {
		_, _ = b.kubectl(context.Background(), "-n", namespace, "delete", "pod", writer, reader, "--ignore-not-found", "--wait=true", "--timeout=2m")
		_, _ = b.kubectl(context.Background(), "-n", namespace, "delete", "volumesnapshot", snap, "--ignore-not-found", "--wait=true", "--timeout=2m")
		_, _ = b.kubectl(context.Background(), "-n", namespace, "delete", "pvc", src, dst, "--ignore-not-found", "--wait=true", "--timeout=2m")
	}()

	b.logf("round %d: %s writes %s of random data into a %s volume on %s", r, writer, mib(data), b.size, b.source.Name)
	err := b.cl.Apply(ctx, fmt.Sprintf(`apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: %[1]s, namespace: %[2]s}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: podvol-xfs
  resources: {requests: {storage: %[3]s}}
---
apiVersion: v1
kind: Pod
metadata: {name: %[4]s, namespace: %[2]s}
spec:
  nodeSelector: {%[5]s: %[6]s}
%[7]s`, src, namespace, b.size, writer, names.TopologyKey, b.source.Name,
		devcluster.PodSpec(2, fmt.Sprintf("dd if=/dev/urandom of=/vol/blob bs=1M count=%d 2>/dev/null && sync", data>>20), "vol", "/vol", "persistentVolumeClaim: {claimName: "+src+"}")))
	if err != nil {
		return Round{}, err
	}
	if err := b.cl.WaitPod(ctx, namespace, writer, b.timeout); err != nil {
		return Round{}, fmt.Errorf("the writer: %w", err)
	}
	if err := b.cl.Apply(ctx, fmt.Sprintf(`apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: %s, namespace: %s}
spec: {volumeSnapshotClassName: podvol, source: {persistentVolumeClaimName: %s}}
`, snap, namespace, src)); err != nil {
		return Round{}, err
	}
	handle, err := b.await(ctx, "the snapshot", func() (string, error) {
		if ready, _ := b.cl.Get(ctx, namespace, "volumesnapshot/"+snap, "{.status.readyToUse}"); ready != "true" {
			return "", nil
		}
		content, err := b.cl.Get(ctx, namespace, "volumesnapshot/"+snap, "{.status.boundVolumeSnapshotContentName}")
		if err != nil {
			return "", err
		}
		return b.cl.Get(ctx, "", "volumesnapshotcontent/"+content, "{.status.snapshotHandle}")
	})
	if err != nil {
		return Round{}, err
	}
	id, node, _ := strings.Cut(handle, "@")
	if node != b.source.Name {
		return Round{}, fmt.Errorf("snapshot handle %q: want one of %s", handle, b.source.Name)
	}
	image := filepath.Join(b.source.PoolDir(), "snapshots", id+".img")
	dataBytes, err := dataExtents(image)
	if err != nil {
		return Round{}, err
	}

	copyTime, err := b.plainCopy(ctx, image)
	if err != nil {
		return Round{}, err
	}

	b.logf("round %d: restoring %s for a pod that runs only on %s", r, snap, b.target.Name)
	if err := dropCaches(); err != nil {
		return Round{}, err
	}
	created := time.Now()
	err = b.cl.Apply(ctx, fmt.Sprintf(`apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: %[1]s
  namespace: %[2]s
  annotations: {%[3]s: %[4]s}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: podvol-xfs
  resources: {requests: {storage: %[5]s}}
  dataSource: {apiGroup: snapshot.storage.k8s.io, kind: VolumeSnapshot, name: %[6]s}
---
apiVersion: v1
kind: Pod
metadata: {name: %[7]s, namespace: %[2]s}
spec:
  nodeSelector: {%[8]s: %[9]s}
%[10]s`, dst, namespace, names.Placement, names.PlacementScheduler, b.size, snap, reader, names.TopologyKey, b.target.Name,
		devcluster.PodSpec(2, "true", "vol", "/vol", "persistentVolumeClaim: {claimName: "+dst+"}")))
	if err != nil {
		return Round{}, err
	}
	if err := b.cl.WaitPod(ctx, namespace, reader, b.timeout); err != nil {
		return Round{}, fmt.Errorf("the restore's pod: %w", err)
	}
	wall := time.Since(created)
	uid, err := b.cl.Get(ctx, namespace, "pvc/"+dst, "{.metadata.uid}")
	if err != nil {
		return Round{}, err
	}
	pull, err := b.pullTime(ctx, "pvc-"+uid)
	if err != nil {
		return Round{}, err
	}
	return Round{DataBytes: dataBytes, Copy: copyTime, Transfer: pull, Wall: wall.Round(10 * time.Millisecond)}, nil
}

// await polls f every half second until it returns a value.
func (b *bench) await(ctx context.Context, what string, f func() (string, error)) (string, error) {
	deadline := time.Now().Add(b.timeout)
	for {
		v, err := f()
		if err != nil {
			return "", fmt.Errorf("%s: %w", what, err)
		}
		if v != "" {
			return v, nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("%s: not ready after %s", what, b.timeout)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// plainCopy copies image into the target node's pool as cp does it,
// sparse, and fsyncs the copy, from a cold page cache; the copy is removed.
func (b *bench) plainCopy(ctx context.Context, image string) (time.Duration, error) {
	dst := filepath.Join(b.target.PoolDir(), "bench-mobility-copy.img")
	defer os.Remove(dst)
	if err := dropCaches(); err != nil {
		return 0, err
	}
	start := time.Now()
	if out, err := exec.CommandContext(ctx, "cp", "--sparse=always", image, dst).CombinedOutput(); err != nil { // #nosec G204 -- an argv, no shell
		return 0, fmt.Errorf("cp: %w: %s", err, out)
	}
	f, err := os.OpenFile(dst, os.O_RDWR, 0)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// pulled matches the target plugin's log line of a finished pull.
var pulled = regexp.MustCompile(`"Pulled a volume's data".* name="([^"]+)".* duration="([^"]+)"`)

// pullTime reads how long the pull of the volume named name took from the
// target node's plugin's log.
func (b *bench) pullTime(ctx context.Context, name string) (time.Duration, error) {
	pod, err := b.kubectl(ctx, "-n", "podvol-system", "get", "pods", "-l", "app.kubernetes.io/component=node",
		"--field-selector", "spec.nodeName="+b.target.Name, "-o", "jsonpath={.items[0].metadata.name}")
	if err != nil || pod == "" {
		return 0, fmt.Errorf("podvol's node pod on %s: %q %w", b.target.Name, pod, err)
	}
	logs, err := b.kubectl(ctx, "-n", "podvol-system", "logs", pod, "-c", "plugin")
	if err != nil {
		return 0, fmt.Errorf("the plugin's log on %s: %w", b.target.Name, err)
	}
	for _, l := range strings.Split(logs, "\n") {
		if m := pulled.FindStringSubmatch(l); m != nil && m[1] == name {
			return time.ParseDuration(m[2])
		}
	}
	return 0, fmt.Errorf("the plugin on %s logged no finished pull of %s", b.target.Name, name)
}

// dataExtents is how many bytes of the image are data (not holes).
func dataExtents(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	fd := int(f.Fd())
	var n, off int64
	for off < fi.Size() {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break
		}
		if err != nil {
			return 0, err
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return 0, err
		}
		n += min(hole, fi.Size()) - data
		off = hole
	}
	return n, nil
}

// dropCaches empties the host's page cache, so that each copy reads from
// the disk.
func dropCaches() error {
	unix.Sync()
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0o200)
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644) // #nosec G306 -- a report in the repository, read by all
}

// rewriteReport writes the report again from its figures.
func rewriteReport(c config) error {
	b, err := os.ReadFile(filepath.Join(c.out, jsonName))
	if err != nil {
		return err
	}
	var res Result
	if err := json.Unmarshal(b, &res); err != nil {
		return fmt.Errorf("%s: %w", jsonName, err)
	}
	return write(c.out, &res)
}
