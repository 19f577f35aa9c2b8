package e2e

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// writer appends "<sequence number> <unix time>" to /vol/log twice a
// second, syncing each line, in the background of a pod that is then ready.
const writer = `(i=0; while true; do i=$((i+1)); echo "$i $(date +%s)" >> /vol/log; sync; sleep 0.5; done) & sleep 1`

// testRolloutRestart: `kubectl rollout restart` of the node DaemonSets and of
// the controller while pods with a persistent, a generic ephemeral and an
// inline volume keep writing: every pod keeps running (same pod, no
// container restart), no write is lost and none stalls while podvol's pods
// are replaced, and the restarted plugins serve new volumes.
func testRolloutRestart(t *testing.T) {
	n := ns(t)
	pods, uids := startWriters(t, n)
	start := time.Now()
	time.Sleep(3 * time.Second)

	const sys = "podvol-system"
	// Every node DaemonSet: the nodes of the fast pool set have theirs.
	workloads, err := cluster.NodeDaemonSets(ctx(t))
	must(t, "podvol's node DaemonSets", err)
	workloads = append(workloads, "deployment/podvol-controller")
	_, err = cluster.RunKubectl(ctx(t), append([]string{"-n", sys, "rollout", "restart"}, workloads...)...)
	must(t, "rollout restart", err)
	for _, obj := range workloads {
		_, err := cluster.RunKubectl(ctx(t), "-n", sys, "rollout", "status", obj, "--timeout=5m")
		must(t, "rollout status "+obj, err)
	}
	rolled := time.Since(start)
	time.Sleep(3 * time.Second)

	stillWriting(t, n, pods, uids)
	t.Logf("rollout of the node DaemonSet and the controller took %s; every pod kept writing", rolled.Round(time.Second))

	// The new plugins serve new volumes and take the old ones down.
	pod(t, n, "after", "echo after > /vol/f", ephemeralVolume)
	waitPod(t, n, "after")
	if got := exec(t, n, "after", "cat /vol/f"); got != "after" {
		t.Fatalf("a volume made after the rollout reads %q", got)
	}
	for _, p := range append(pods, "after") {
		deletePod(t, n, p)
	}
}

// startWriters starts pods that append a numbered, timestamped line to their
// volume's log every half second: one on a persistent claim (data), one on a
// generic ephemeral and one on an inline volume. It returns their names and
// UIDs once all run.
func startWriters(t *testing.T, n string) (pods []string, uids map[string]string) {
	t.Helper()
	pvc(t, n, "data", "podvol", "128Mi", "")
	pod(t, n, "persistent", writer, "persistentVolumeClaim: {claimName: data}")
	pod(t, n, "ephemeral", writer, ephemeralVolume)
	pod(t, n, "inline", writer, "csi:\n  driver: podvol.io\n  volumeAttributes: {size: 64Mi}")
	pods = []string{"persistent", "ephemeral", "inline"}
	uids = map[string]string{}
	for _, p := range pods {
		waitPod(t, n, p)
		uids[p] = get(t, n, "pod/"+p, "{.metadata.uid}")
	}
	return pods, uids
}

// stillWriting fails unless every pod is the one it was, its container never
// restarted, and its log has no gap and is still growing.
func stillWriting(t *testing.T, n string, pods []string, uids map[string]string) {
	t.Helper()
	for _, p := range pods {
		if uid := get(t, n, "pod/"+p, "{.metadata.uid}"); uid != uids[p] {
			t.Fatalf("pod %s was replaced (uid %s, was %s)", p, uid, uids[p])
		}
		if r := get(t, n, "pod/"+p, "{.status.containerStatuses[0].restartCount}"); r != "0" {
			t.Fatalf("pod %s's container restarted %s times", p, r)
		}
		checkLog(t, p, exec(t, n, p, "cat /vol/log"), time.Now())
	}
}

// checkLog fails unless the writer's log holds every number from 1 up, each
// line written within 5 s of the one before (a stall would show as a gap),
// and its last line is recent (it still writes).
func checkLog(t *testing.T, pod, log string, now time.Time) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(log), "\n")
	var last int64
	for i, l := range lines {
		f := strings.Fields(l)
		if len(f) != 2 {
			t.Fatalf("pod %s: line %d of its log is %q: a torn write", pod, i+1, l)
		}
		seq, err1 := strconv.Atoi(f[0])
		ts, err2 := strconv.ParseInt(f[1], 10, 64)
		if err1 != nil || err2 != nil || seq != i+1 {
			t.Fatalf("pod %s: line %d of its log is %q, want sequence number %d: a write was lost", pod, i+1, l, i+1)
		}
		if i > 0 && ts-last > 5 {
			t.Fatalf("pod %s: %d s between writes %d and %d: its volume stalled", pod, ts-last, i, i+1)
		}
		last = ts
	}
	if age := now.Unix() - last; age > 5 {
		t.Fatalf("pod %s: its last write (%d of %d) is %d s old: it stopped writing", pod, len(lines), len(lines), age)
	}
	if len(lines) < 10 {
		t.Fatalf("pod %s wrote only %d lines: %s", pod, len(lines), fmt.Sprint(lines))
	}
}
