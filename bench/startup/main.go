// Command startup is `make bench-startup`: the start-up time of pods on the
// dev cluster with an emptyDir, a podvol CSI inline volume, a podvol generic
// ephemeral volume (ext4 and xfs) and a pre-bound persistent claim, one pod
// at a time and N at once, phase by phase from the API's watches and the
// plugin's own CSI call durations from its metrics. It writes README.md,
// startup.png and two CSV files in bench/startup. Run it as root while
// holding the dev cluster's lock (the Makefile target does).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/podvol/podvol/bench/internal/plot"
	"github.com/podvol/podvol/internal/devcluster"
	"github.com/podvol/podvol/internal/versions"
)

const (
	namespace  = "podvol-bench-startup"
	volumeName = "data"
	volumeSize = "64Mi"
	metricsURL = devcluster.PluginMetrics
)

type config struct {
	pods, podsOne int
	burst, rounds int
	seed          uint64
	probe         bool
	out           string
	batchTimeout  time.Duration
	only          string
}

func main() {
	var c config
	flag.IntVar(&c.pods, "pods", 40, "pods per cell and mode (M), spread over the rounds")
	flag.IntVar(&c.podsOne, "pods-one", 0, "pods per cell in the one-at-a-time mode, if not -pods (it takes ~6 s a pod there)")
	flag.IntVar(&c.burst, "burst", 20, "pods created at once in the N-at-once mode (N)")
	flag.IntVar(&c.rounds, "rounds", 2, "rounds; each runs every cell in each mode, in an order of its own")
	flag.Uint64Var(&c.seed, "seed", 1, "seed of the cell order of each round")
	flag.BoolVar(&c.probe, "readiness-probe", false, "give the pod the e2e tests' readiness probe (test -e the file, every 1 s) instead of none")
	flag.StringVar(&c.out, "out", filepath.Join(devcluster.RepoRoot(), "bench", "startup"), "directory for README.md, startup.png and the CSV files")
	flag.DurationVar(&c.batchTimeout, "batch-timeout", 5*time.Minute, "how long one batch may take to be Ready")
	flag.StringVar(&c.only, "cells", "", "comma-separated cells to run (default all: emptyDir,inline,ephemeral,ephemeral-watch,ephemeral-xfs,persistent)")
	flag.Parse()
	if err := run(c); err != nil {
		fmt.Fprintf(os.Stderr, "bench-startup: %v\n", err)
		os.Exit(1)
	}
}

type bench struct {
	config
	cl    *devcluster.Cluster
	cs    kubernetes.Interface
	rec   *recorder
	start time.Time
	// base is each node's podvol_volumes before the benchmark: the cluster
	// is quiet when it is back there.
	base  map[string]int
	res   *Result
	seq   int
	nodes []string
	// schedulers are the kube-scheduler binaries by Cell.Scheduler.
	schedulers map[string]string
}

func run(c config) error {
	if os.Geteuid() != 0 {
		return errors.New("run as root: the plugin's metrics are read inside each node's network namespace")
	}
	if c.podsOne == 0 {
		c.podsOne = c.pods
	}
	if c.pods < 1 || c.podsOne < 1 || c.burst < 1 || c.rounds < 1 {
		return errors.New("-pods, -pods-one, -burst and -rounds must be at least 1")
	}
	chosen := cells
	if c.only != "" {
		chosen = nil
		for _, name := range strings.Split(c.only, ",") {
			found := false
			for _, cell := range cells {
				if cell.Name == name {
					chosen, found = append(chosen, cell), true
				}
			}
			if !found {
				return fmt.Errorf("no cell %q", name)
			}
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cl := devcluster.New(devcluster.Config{Out: os.Stderr})
	if !cl.Running() {
		fmt.Fprintln(os.Stderr, "the dev cluster is not running: bringing it up (it stays up)")
		if err := cl.Up(ctx); err != nil {
			return err
		}
	}
	rc, err := clientcmd.BuildConfigFromFlags("", cl.Kubeconfig())
	if err != nil {
		return err
	}
	rc.QPS, rc.Burst = 200, 400
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	loadStart := plot.LoadAvg()
	b := &bench{config: c, cl: cl, cs: cs, start: time.Now(),
		res: &Result{Cells: chosen, Modes: []Mode{{"one at a time", 1}, {fmt.Sprintf("%d at once", c.burst), c.burst}}, Ops: map[Key]OpTotals{}}}
	for _, n := range cl.Nodes {
		b.nodes = append(b.nodes, n.Name)
	}
	if err := b.buildSchedulers(ctx, chosen); err != nil {
		return err
	}
	// Kubernetes' own kube-scheduler runs again at the end, whatever happens.
	defer func() {
		if err := cl.UseScheduler(b.schedulers[""]); err != nil {
			fmt.Fprintf(os.Stderr, "bench-startup: putting back Kubernetes' kube-scheduler: %v (`make up` does it too)\n", err)
		}
	}()
	// The namespace goes at the end whatever happens, interrupt included
	// (ctx is then done: the cleanup has a context of its own).
	defer b.deleteNamespace()
	if err := b.createNamespace(ctx); err != nil {
		return err
	}
	if b.rec, err = newRecorder(ctx, cs, namespace); err != nil {
		return err
	}
	if b.base, err = b.volumes(ctx); err != nil {
		return err
	}
	b.logf("nodes %s; podvol volumes before: %v; pods per cell: %d one at a time, %d %d at once, over %d rounds",
		strings.Join(b.nodes, ", "), b.base, c.podsOne, c.pods, c.burst, c.rounds)
	// The order only has to vary between rounds, and repeat with the seed.
	rng := rand.New(rand.NewPCG(c.seed, 0x5eed)) // #nosec G404 -- not a secret
	var orders [][]string
	for round := 1; round <= c.rounds; round++ {
		order := make([]Cell, len(chosen))
		copy(order, chosen)
		rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		var names []string
		for _, o := range order {
			names = append(names, o.Name)
		}
		orders = append(orders, names)
		for _, m := range b.res.Modes {
			total := c.pods
			if m.Batch == 1 {
				total = c.podsOne
			}
			n := total / c.rounds
			if round <= total%c.rounds {
				n++
			}
			for _, cell := range order {
				if err := b.cell(ctx, round, m, cell, n); err != nil {
					return fmt.Errorf("round %d, %s, %s: %w", round, m.Name, cell.Name, err)
				}
			}
		}
	}
	b.logf("done: %d pods measured", len(b.res.Samples))
	return write(c.out, b.res, Meta{
		Date: time.Now(), Took: time.Since(b.start), Nodes: b.nodes, Pods: c.pods, PodsOne: c.podsOne, LoadStart: loadStart, Burst: c.burst, Rounds: c.rounds,
		Seed: c.seed, Probe: c.probe, Orders: orders, Machine: machine(), Kubernetes: versions.Kubernetes,
	})
}

func (b *bench) logf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "[%s] %s\n", time.Since(b.start).Round(time.Second), fmt.Sprintf(format, a...))
}

func (b *bench) createNamespace(ctx context.Context) error {
	if err := b.waitNamespaceGone(ctx); err != nil {
		return err
	}
	_, err := b.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{})
	return err
}

// waitNamespaceGone deletes the namespace if an earlier run left it, and
// waits until it is gone.
func (b *bench) waitNamespaceGone(ctx context.Context) error {
	err := b.cs.CoreV1().Namespaces().Delete(ctx, namespace, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "deleting namespace %s\n", namespace)
	for {
		_, err := b.cs.CoreV1().Namespaces().Get(ctx, namespace, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (b *bench) deleteNamespace() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := b.waitNamespaceGone(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "bench-startup: deleting namespace %s: %v\n", namespace, err)
	}
}

// volumes is podvol_volumes on each node.
func (b *bench) volumes(ctx context.Context) (map[string]int, error) {
	v := map[string]int{}
	for _, n := range b.cl.Nodes {
		text, err := n.FetchMetrics(ctx, metricsURL)
		if err != nil {
			return nil, fmt.Errorf("metrics of %s: %w", n.Name, err)
		}
		v[n.Name] = ParseMetrics(text).Volumes
	}
	return v, nil
}

// ops is the CSI call totals summed over every node.
func (b *bench) ops(ctx context.Context) (OpTotals, error) {
	t := OpTotals{}
	for _, n := range b.cl.Nodes {
		text, err := n.FetchMetrics(ctx, metricsURL)
		if err != nil {
			return nil, fmt.Errorf("metrics of %s: %w", n.Name, err)
		}
		t.Add(ParseMetrics(text).Ops)
	}
	return t, nil
}

// buildSchedulers finds (building if need be) the kube-scheduler binaries the
// cells run with.
func (b *bench) buildSchedulers(ctx context.Context, chosen []Cell) error {
	b.schedulers = map[string]string{}
	for _, name := range []string{"", PrebindWatch} {
		needed := name == ""
		for _, c := range chosen {
			needed = needed || c.Scheduler == name
		}
		if !needed {
			continue
		}
		bin := name
		if bin == "" {
			bin = "kube-scheduler"
		}
		path, err := b.cl.KubernetesBinary(ctx, bin)
		if err != nil {
			return err
		}
		b.schedulers[name] = path
	}
	return nil
}

// cell runs n pods of one cell in one mode, in batches of the mode's size.
func (b *bench) cell(ctx context.Context, round int, m Mode, c Cell, n int) error {
	if err := b.cl.UseScheduler(b.schedulers[c.Scheduler]); err != nil {
		return fmt.Errorf("running %s: %w", filepath.Base(b.schedulers[c.Scheduler]), err)
	}
	t0 := time.Now()
	k := Key{c.Name, m.Name}
	if b.res.Ops[k] == nil {
		b.res.Ops[k] = OpTotals{}
	}
	for done := 0; done < n; {
		size := min(m.Batch, n-done)
		if err := b.batch(ctx, round, m, c, size); err != nil {
			return err
		}
		done += size
		tot := b.res.TotalStats(c.Name, m.Name)
		b.logf("round %d/%d, %s, %s: %d/%d pods (this cell so far: p50 %s, max %s over %d; %s)",
			round, b.rounds, m.Name, c.Name, done, n, ms(tot.P50), ms(tot.Max), tot.N, time.Since(t0).Round(time.Second))
	}
	return nil
}

// batch starts size pods of cell c at once, waits until all are Ready,
// records them, deletes them and waits until the cluster is quiet again.
func (b *bench) batch(ctx context.Context, round int, m Mode, c Cell, size int) error {
	bctx, cancel := context.WithTimeout(ctx, b.batchTimeout)
	defer cancel()
	before, err := b.ops(bctx)
	if err != nil {
		return err
	}
	var names []string
	for range size {
		b.seq++
		name := fmt.Sprintf("%s-%d", strings.ToLower(c.Name), b.seq)
		names = append(names, name)
		b.rec.expect(&Sample{Cell: c.Name, Mode: m.Name, Round: round, Pod: name})
	}
	if c.Kind == Persistent {
		errs := make(chan error, size)
		for i, name := range names {
			node := b.nodes[(b.seq+i)%len(b.nodes)]
			go func() { errs <- b.createClaim(bctx, name, c.Class, node) }()
		}
		for range names {
			if err := <-errs; err != nil {
				return err
			}
		}
		if err := b.rec.wait(bctx, names, ClaimBound); err != nil {
			return err
		}
	}
	errs := make(chan error, size)
	for _, name := range names {
		go func() {
			_, err := b.cs.CoreV1().Pods(namespace).Create(bctx, b.pod(name, c), metav1.CreateOptions{})
			errs <- err
		}()
	}
	for range names {
		if err := <-errs; err != nil {
			return err
		}
	}
	if err := b.rec.wait(bctx, names, Ready); err != nil {
		return b.explain(err)
	}
	after, err := b.ops(bctx)
	if err != nil {
		return err
	}
	b.res.Ops[Key{c.Name, m.Name}].Add(after.Sub(before))
	for _, name := range names {
		p, err := b.cs.CoreV1().Pods(namespace).Get(bctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, st := range p.Status.ContainerStatuses {
			if st.RestartCount > 0 || st.State.Running == nil {
				return fmt.Errorf("pod %s: container %s restarted %d times (its write to the volume failed?)", name, st.Name, st.RestartCount)
			}
		}
		b.res.Samples = append(b.res.Samples, b.rec.snapshot(name))
	}
	return b.quiet(ctx)
}

// explain adds what the pods that are not Ready show.
func (b *bench) explain(err error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, _ := b.cl.RunKubectl(ctx, "-n", namespace, "get", "pods,pvc,events", "-o", "wide")
	return fmt.Errorf("%w\n%s", err, out)
}

// quiet deletes the benchmark's pods and claims and waits until none of its
// pods, claims, PVs or volumes (every node's podvol_volumes back to where it
// was) is left.
func (b *bench) quiet(ctx context.Context) error {
	qctx, cancel := context.WithTimeout(ctx, b.batchTimeout)
	defer cancel()
	if err := b.cs.CoreV1().Pods(namespace).DeleteCollection(qctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		return err
	}
	if err := b.cs.CoreV1().PersistentVolumeClaims(namespace).DeleteCollection(qctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		return err
	}
	for {
		pods, claims, pvs := b.rec.left()
		state := fmt.Sprintf("%d pods, %d claims, %d PVs", pods, claims, pvs)
		if pods+claims+pvs == 0 {
			v, err := b.volumes(qctx)
			if err != nil {
				return err
			}
			same := true
			for n, c := range b.base {
				same = same && v[n] == c
			}
			if same {
				return nil
			}
			state = fmt.Sprintf("podvol volumes %v, %v before", v, b.base)
		}
		select {
		case <-qctx.Done():
			return fmt.Errorf("waiting for the cluster to be quiet (%s): %w", state, qctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (b *bench) createClaim(ctx context.Context, pod, class, node string) error {
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: claimOf(pod), Annotations: map[string]string{selectedNode: node}},
		Spec:       claimSpec(class),
	}
	_, err := b.cs.CoreV1().PersistentVolumeClaims(namespace).Create(ctx, pvc, metav1.CreateOptions{})
	return err
}

func claimSpec(class string) corev1.PersistentVolumeClaimSpec {
	return corev1.PersistentVolumeClaimSpec{
		AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		StorageClassName: &class,
		Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(volumeSize)}},
	}
}

// pod is the benchmark's pod of cell c: the dev cluster's busybox writes one
// file into the volume and sleeps. Without -readiness-probe it is Ready when
// its container runs (a failed write ends the container, which the batch
// checks); with it, as the e2e tests' pods, when a probe every second finds
// the file.
func (b *bench) pod(name string, c Cell) *corev1.Pod {
	grace := int64(1)
	ctr := corev1.Container{
		Name:            "main",
		Image:           devcluster.Image,
		ImagePullPolicy: corev1.PullIfNotPresent,
		Command:         []string{"sh", "-c", "echo " + name + " > /data/file && exec sleep 36000"},
		VolumeMounts:    []corev1.VolumeMount{{Name: volumeName, MountPath: "/data"}},
	}
	if b.probe {
		ctr.ReadinessProbe = &corev1.Probe{PeriodSeconds: 1, ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"test", "-e", "/data/file"}}}}
	}
	vol := corev1.Volume{Name: volumeName}
	switch {
	case c.Kind == Ephemeral:
		vol.Ephemeral = &corev1.EphemeralVolumeSource{VolumeClaimTemplate: &corev1.PersistentVolumeClaimTemplate{Spec: claimSpec(c.Class)}}
	case c.Kind == Persistent:
		vol.PersistentVolumeClaim = &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claimOf(name)}
	case c.Inline:
		vol.CSI = &corev1.CSIVolumeSource{Driver: "podvol.io", VolumeAttributes: map[string]string{"size": volumeSize}}
	default:
		vol.EmptyDir = &corev1.EmptyDirVolumeSource{}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "podvol-bench-startup", "cell": c.Name}},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &grace,
			Containers:                    []corev1.Container{ctr},
			Volumes:                       []corev1.Volume{vol},
		},
	}
}

func ms(d time.Duration) string {
	if d < 10*time.Second {
		return fmt.Sprintf("%.2fs", d.Seconds())
	}
	return fmt.Sprintf("%.1fs", d.Seconds())
}
