package main

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/podvol/podvol/internal/devcluster"
	"github.com/podvol/podvol/internal/names"
)

// Migration is one drain of a node holding a StatefulSet replica whose
// claim follows its pod, and one of a replica with an emptyDir.
type Migration struct {
	Size            string
	DataBytes       int64 // written before the drain's cordon
	ChangedBytes    int64 // written after the first copy, before the eviction
	FirstCopyBytes  int64 // what the first pull moved, the pod running
	FinalCopyBytes  int64 // what the last one moved, the pod gone
	FirstCopy       time.Duration
	Migrate         time.Duration // cordon to the pod ready on the target
	Downtime        time.Duration // eviction to the pod ready on the target
	EmptyDirRestart time.Duration // the same, for a replica with an emptyDir
	Intact          bool          // the checksums of both files matched
}

// DowntimeRatio is the migrating replica's downtime over the emptyDir one's.
func (m Migration) DowntimeRatio() float64 {
	if m.EmptyDirRestart <= 0 {
		return 0
	}
	return m.Downtime.Seconds() / m.EmptyDirRestart.Seconds()
}

// pulledFirst and pulledAll match the target plugin's log lines of a
// migration's pulls.
var (
	pulledFirst = regexp.MustCompile(`"Pulled a first copy of a volume in use; the rest follows once it is not".* name="([^"]+)".* bytes=(\d+) duration="([^"]+)"`)
	pulledAll   = regexp.MustCompile(`"Pulled a volume's data".* name="([^"]+)".* duration="([^"]+)" bytes=(\d+)`)
)

// cordonOthers cordons every node but keep; the returned function undoes it.
func (b *bench) cordonOthers(ctx context.Context, keep string) (func(), error) {
	var others []string
	for _, n := range b.cl.Nodes {
		if n.Name != keep {
			others = append(others, n.Name)
		}
	}
	if _, err := b.kubectl(ctx, append([]string{"cordon"}, others...)...); err != nil {
		return func() {}, err
	}
	return func() { _, _ = b.kubectl(context.Background(), append([]string{"uncordon"}, others...)...) }, nil
}

// replica starts a one-replica StatefulSet named name on the source node
// (the others cordoned meanwhile), with volume as its data (a claim
// template if claim, else an emptyDir), and waits for it.
func (b *bench) replica(ctx context.Context, name, script string, claim bool) error {
	uncordon, err := b.cordonOthers(ctx, b.source.Name)
	defer uncordon()
	if err != nil {
		return err
	}
	volume, templates := "emptyDir: {}", ""
	if claim {
		volume = ""
		templates = fmt.Sprintf(`  volumeClaimTemplates:
  - metadata: {name: data, annotations: {%s: "true"}}
    spec:
      accessModes: [ReadWriteOnce]
      storageClassName: podvol-xfs
      resources: {requests: {storage: %s}}
`, names.MigrateOnDrain, b.migrateSize)
	}
	err = b.cl.Apply(ctx, fmt.Sprintf(`apiVersion: apps/v1
kind: StatefulSet
metadata: {name: %[1]s, namespace: %[2]s}
spec:
  serviceName: %[1]s
  replicas: 1
  selector: {matchLabels: {app: %[1]s}}
  template:
    metadata: {labels: {app: %[1]s}}
    spec:
%[3]s%[4]s`, name, namespace, devcluster.PodSpec(6, script, "data", "/data", volume), templates))
	if err != nil {
		return err
	}
	if _, err := b.kubectl(ctx, "-n", namespace, "rollout", "status", "statefulset/"+name, "--timeout="+b.timeout.String()); err != nil {
		return err
	}
	return b.cl.WaitPod(ctx, namespace, name+"-0", b.timeout)
}

// evictAndWait drains the source node of the replica's pod and waits until
// it is ready on another node; it returns when the drain began.
func (b *bench) evictAndWait(ctx context.Context, name string) (time.Time, time.Duration, error) {
	evicted := time.Now()
	if out, err := b.kubectl(ctx, "drain", b.source.Name, "--ignore-daemonsets", "--delete-emptydir-data", "--pod-selector=app="+name, "--timeout="+b.timeout.String()); err != nil {
		return evicted, 0, fmt.Errorf("drain: %w: %s", err, out)
	}
	pod := name + "-0"
	_, err := b.await(ctx, pod+" ready on another node", func() (string, error) {
		node, err := b.cl.Get(ctx, namespace, "pod/"+pod, "{.spec.nodeName}")
		ready, rerr := b.cl.Get(ctx, namespace, "pod/"+pod, `{.status.conditions[?(@.type=="Ready")].status}`)
		if err != nil || rerr != nil || node == "" || node == b.source.Name || ready != "True" {
			return "", nil
		}
		return node, nil
	})
	return evicted, time.Since(evicted), err
}

// migration drains the source node of a migrating replica and of an
// emptyDir one, and measures both.
func (b *bench) migration(ctx context.Context, r int) (Migration, error) {
	ctx, cancel := context.WithTimeout(ctx, 4*b.timeout)
	defer cancel()
	name := "mig-" + strconv.Itoa(r)
	m := Migration{Size: b.migrateSize, DataBytes: b.migrateData, ChangedBytes: b.migrateChanged}
	defer func() {
		_, _ = b.kubectl(context.Background(), "uncordon", b.source.Name)
		_, _ = b.kubectl(context.Background(), "-n", namespace, "delete", "statefulset", name, "ed-"+strconv.Itoa(r), "--ignore-not-found", "--wait=true", "--timeout=2m")
		_, _ = b.kubectl(context.Background(), "-n", namespace, "delete", "pvc", "data-"+name+"-0", "--ignore-not-found", "--wait=true", "--timeout=3m")
	}()
	b.logf("migration %d: %s writes %s into a %s volume on %s", r, name, mib(m.DataBytes), m.Size, b.source.Name)
	if err := b.replica(ctx, name, fmt.Sprintf("test -f /data/sums || (dd if=/dev/urandom of=/data/base bs=1M count=%d 2>/dev/null && cd /data && sha256sum base > sums && sync)", m.DataBytes>>20), true); err != nil {
		return m, err
	}
	uid, err := b.cl.Get(ctx, namespace, "pvc/data-"+name+"-0", "{.metadata.uid}")
	if err != nil {
		return m, err
	}
	start := time.Now()
	if _, err := b.kubectl(ctx, "cordon", b.source.Name); err != nil {
		return m, err
	}
	clone := "podvol-move-" + uid
	volume, err := b.await(ctx, "the copy's claim", func() (string, error) {
		u, err := b.cl.Get(ctx, namespace, "pvc/"+clone, "{.metadata.uid}")
		if err != nil || u == "" {
			return "", nil // not made yet
		}
		return "pvc-" + u, nil
	})
	if err != nil {
		return m, err
	}
	b.logf("migration %d: copying while %s runs (volume %s)", r, name, volume)
	if _, err := b.await(ctx, "the first copy", func() (string, error) {
		logs, err := b.pluginLog(ctx)
		if err != nil {
			return "", err
		}
		for _, l := range strings.Split(logs, "\n") {
			if f := pulledFirst.FindStringSubmatch(l); f != nil && f[1] == volume {
				m.FirstCopyBytes, _ = strconv.ParseInt(f[2], 10, 64)
				m.FirstCopy, err = time.ParseDuration(f[3])
				return "done", err
			}
		}
		return "", nil
	}); err != nil {
		return m, err
	}
	b.logf("migration %d: first copy %s in %s; %s writes %s more, then the drain", r, mib(m.FirstCopyBytes), m.FirstCopy, name, mib(m.ChangedBytes))
	if _, err := b.cl.Exec(ctx, namespace, name+"-0", fmt.Sprintf("dd if=/dev/urandom of=/data/changed bs=1M count=%d 2>/dev/null && cd /data && sha256sum changed >> sums && sync", m.ChangedBytes>>20)); err != nil {
		return m, err
	}
	_, downtime, err := b.evictAndWait(ctx, name)
	if err != nil {
		return m, err
	}
	m.Downtime, m.Migrate = downtime.Round(100*time.Millisecond), time.Since(start).Round(100*time.Millisecond)
	out, err := b.cl.Exec(ctx, namespace, name+"-0", "cd /data && sha256sum -c sums")
	m.Intact = err == nil && strings.Contains(out, "base: OK") && strings.Contains(out, "changed: OK")
	logs, err := b.pluginLog(ctx)
	if err != nil {
		return m, err
	}
	for _, l := range strings.Split(logs, "\n") {
		if f := pulledAll.FindStringSubmatch(l); f != nil && f[1] == volume {
			all, _ := strconv.ParseInt(f[3], 10, 64)
			m.FinalCopyBytes = all - m.FirstCopyBytes
		}
	}
	b.logf("migration %d: %s on another node after %s down (%s from the cordon), last copy %s, data intact: %v", r, name, m.Downtime, m.Migrate, mib(m.FinalCopyBytes), m.Intact)
	if _, err := b.kubectl(ctx, "uncordon", b.source.Name); err != nil {
		return m, err
	}

	ed := "ed-" + strconv.Itoa(r)
	if err := b.replica(ctx, ed, "true", false); err != nil {
		return m, err
	}
	if _, err := b.kubectl(ctx, "cordon", b.source.Name); err != nil {
		return m, err
	}
	_, restart, err := b.evictAndWait(ctx, ed)
	if err != nil {
		return m, err
	}
	m.EmptyDirRestart = restart.Round(100 * time.Millisecond)
	b.logf("migration %d: an emptyDir replica drained the same way is ready elsewhere after %s", r, m.EmptyDirRestart)
	return m, nil
}

// pluginLog is the target node's plugin's log.
func (b *bench) pluginLog(ctx context.Context) (string, error) {
	var logs strings.Builder
	for _, n := range b.cl.Nodes {
		if n.Name == b.source.Name {
			continue
		}
		pod, err := b.kubectl(ctx, "-n", "podvol-system", "get", "pods", "-l", "app.kubernetes.io/component=node",
			"--field-selector", "spec.nodeName="+n.Name, "-o", "jsonpath={.items[0].metadata.name}")
		if err != nil || pod == "" {
			return "", fmt.Errorf("podvol's node pod on %s: %q %w", n.Name, pod, err)
		}
		l, err := b.kubectl(ctx, "-n", "podvol-system", "logs", pod, "-c", "plugin")
		if err != nil {
			return "", fmt.Errorf("the plugin's log on %s: %w", n.Name, err)
		}
		logs.WriteString(l)
	}
	return logs.String(), nil
}
