package e2e

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/podvol/podvol/internal/devcluster"
)

const ephemeralVolume = `ephemeral:
  volumeClaimTemplate:
    spec:
      accessModes: [ReadWriteOnce]
      storageClassName: podvol
      resources: {requests: {storage: 128Mi}}`

// ephemeralSized is a generic ephemeral volume of class and size.
func ephemeralSized(class, size string) string {
	return strings.NewReplacer("storageClassName: podvol", "storageClassName: "+class, "128Mi", size).Replace(ephemeralVolume)
}

// testGenericEphemeral: a PVC per pod, owned by it; data written in the pod
// is gone with it, and so is the volume.
func testGenericEphemeral(t *testing.T) {
	n := ns(t)
	before := poolImages(t)
	pod(t, n, "scratch", "echo hello > /vol/f", ephemeralVolume)
	waitPod(t, n, "scratch")
	if got := exec(t, n, "scratch", "cat /vol/f"); got != "hello" {
		t.Fatalf("read back %q", got)
	}
	if owner := get(t, n, "pvc/scratch-vol", "{.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}/{.metadata.ownerReferences[0].controller}"); owner != "Pod/scratch/true" {
		t.Fatalf("PVC scratch-vol owner: %q", owner)
	}
	if poolImages(t) != before+1 {
		t.Fatalf("pool images: %d, want %d", poolImages(t), before+1)
	}
	deletePod(t, n, "scratch")
	eventually(t, 2*time.Minute, func() string {
		if out, _ := cluster.Get(ctx(t), n, "pvc", "{.items[*].metadata.name}"); out != "" {
			return "PVCs left: " + out
		}
		if got := poolImages(t); got != before {
			return fmt.Sprintf("pool images: %d, want %d: the volume outlived its pod", got, before)
		}
		return ""
	})
	// A new pod of the same name gets a new, empty volume.
	pod(t, n, "scratch", "true", ephemeralVolume)
	waitPod(t, n, "scratch")
	if got := exec(t, n, "scratch", "ls /vol | grep -v lost+found || true"); got != "" {
		t.Fatalf("a new pod saw the old pod's data: %q", got)
	}
}

// testInline: CSI inline volume, gone with its pod.
func testInline(t *testing.T) {
	n := ns(t)
	before := poolImages(t)
	pod(t, n, "inline", "echo inline > /vol/f", "csi:\n  driver: podvol.io\n  volumeAttributes: {size: 64Mi}")
	waitPod(t, n, "inline")
	if got := exec(t, n, "inline", "cat /vol/f"); got != "inline" {
		t.Fatalf("read back %q", got)
	}
	if poolImages(t) != before+1 {
		t.Fatalf("pool images: %d, want %d", poolImages(t), before+1)
	}
	deletePod(t, n, "inline")
	eventually(t, 2*time.Minute, func() string {
		if got := poolImages(t); got != before {
			return fmt.Sprintf("pool images: %d, want %d", got, before)
		}
		return ""
	})
}

// testPersistentSnapshotCloneResize: data survives the pod; a snapshot holds
// the data at its moment, a clone the data at its; a running pod sees its
// volume grow.
func testPersistentSnapshotCloneResize(t *testing.T) {
	n := ns(t)
	pvc(t, n, "data", "podvol-xfs", "512Mi", "")
	pod(t, n, "writer", "echo one > /vol/f", "persistentVolumeClaim: {claimName: data}")
	waitPod(t, n, "writer")
	deletePod(t, n, "writer")
	pod(t, n, "writer", "true", "persistentVolumeClaim: {claimName: data}")
	waitPod(t, n, "writer")
	if got := exec(t, n, "writer", "cat /vol/f"); got != "one" {
		t.Fatalf("after the pod was recreated: %q", got)
	}

	applyFile(t, "snapshot.yaml", map[string]string{"NS": n})
	eventually(t, 3*time.Minute, func() string {
		if r, _ := cluster.Get(ctx(t), n, "volumesnapshot/snap", "{.status.readyToUse}"); r != "true" {
			return "snapshot not ready: " + r
		}
		return ""
	})
	exec(t, n, "writer", "echo two > /vol/f && sync")
	pvc(t, n, "restored", "podvol-xfs", "512Mi", "  dataSource: {apiGroup: snapshot.storage.k8s.io, kind: VolumeSnapshot, name: snap}\n")
	pvc(t, n, "clone", "podvol-xfs", "512Mi", "  dataSource: {kind: PersistentVolumeClaim, name: data}\n")
	pod(t, n, "restore-reader", "true", "persistentVolumeClaim: {claimName: restored}")
	pod(t, n, "clone-reader", "true", "persistentVolumeClaim: {claimName: clone}")
	waitPod(t, n, "restore-reader")
	waitPod(t, n, "clone-reader")
	if got := exec(t, n, "restore-reader", "cat /vol/f"); got != "one" {
		t.Fatalf("restored snapshot holds %q, want the data at the snapshot", got)
	}
	if got := exec(t, n, "clone-reader", "cat /vol/f"); got != "two" {
		t.Fatalf("clone holds %q, want the source's data", got)
	}
	exec(t, n, "clone-reader", "echo clone-only > /vol/f")
	if got := exec(t, n, "writer", "cat /vol/f"); got != "two" {
		t.Fatalf("a write to the clone reached the source: %q", got)
	}

	growTo1Gi(t, n, "data", "writer")
	if got := exec(t, n, "writer", "cat /vol/f"); got != "two" {
		t.Fatalf("data after resize: %q", got)
	}
}

// testCapacity: a pod asking for more than the pool has left stays Pending
// with a reason, and runs once room is made.
func testCapacity(t *testing.T) {
	// Sizes in GiB from the nodes' pools, largest a, then b, then the
	// largest of the others c: a filler that fits only a; then a pod that
	// fits only b; then one that fits nowhere until the filler goes. Each
	// size keeps 1 GiB from the edge: a pool's filesystem takes some.
	nodes := slices.Clone(cluster.Nodes)
	slices.SortFunc(nodes, func(x, y *devcluster.Node) int { return int(y.PoolSize>>30 - x.PoolSize>>30) })
	if len(nodes) < 2 {
		t.Fatalf("this test needs two nodes or more; the dev cluster has %v", cluster.NodeNames())
	}
	a, b, c := nodes[0].PoolSize>>30, nodes[1].PoolSize>>30, int64(0)
	if len(nodes) > 2 {
		c = nodes[2].PoolSize >> 30
	}
	filler := (a + b + 1) / 2
	next := max(a-filler, c) + 1
	big := max(a-filler, b-next, c) + 1
	if filler <= b || filler >= a-1 || next >= b || big >= a-1 {
		t.Fatalf("the nodes' pools (%v) are too close in size for this test (podvol-dev sizes them apart by default)", []int64{a, b, c})
	}
	gi := func(v int64) string { return strconv.FormatInt(v, 10) + "Gi" }
	n := ns(t)
	pvc(t, n, "filler", "podvol", gi(filler), "")
	pod(t, n, "filler", "true", "persistentVolumeClaim: {claimName: filler}")
	waitPod(t, n, "filler")
	if got := podNode(t, n, "filler"); got != nodes[0] {
		t.Fatalf("the filler (%s) runs on %s; only %s has room for it", gi(filler), got.Name, nodes[0].Name)
	}
	// The scheduler reads each node's CSIStorageCapacity, so the pod lands
	// on the one node with room, never on a node whose provisioning or
	// mount would fail.
	pod(t, n, "next", "true", ephemeralSized("podvol", gi(next)))
	waitPod(t, n, "next")
	if got := podNode(t, n, "next"); got != nodes[1] {
		t.Fatalf("pod next (%s) landed on %s; only %s had room", gi(next), got.Name, nodes[1].Name)
	}
	// Now no node has room: the pod waits, and says why.
	pod(t, n, "big", "true", ephemeralSized("podvol", gi(big)))
	waitPendingFor(t, n, "big", "storage")
	deletePod(t, n, "filler")
	_, err := cluster.RunKubectl(ctx(t), "-n", n, "delete", "pvc", "filler", "--wait=true")
	must(t, "delete filler", err)
	waitPod(t, n, "big")
	if got := podNode(t, n, "big"); got != nodes[0] {
		t.Fatalf("pod big (%s) landed on %s; only %s had room", gi(big), got.Name, nodes[0].Name)
	}
}

// testReadWriteOncePod: a second pod cannot use an RWOP volume.
func testReadWriteOncePod(t *testing.T) {
	n := ns(t)
	apply(t, `apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: solo, namespace: %s}
spec:
  accessModes: [ReadWriteOncePod]
  storageClassName: podvol
  resources: {requests: {storage: 64Mi}}
`, n)
	pod(t, n, "first", "true", "persistentVolumeClaim: {claimName: solo}")
	waitPod(t, n, "first")
	pod(t, n, "second", "true", "persistentVolumeClaim: {claimName: solo}")
	waitPendingFor(t, n, "second", "ReadWriteOncePod")
}

// testMetricsMatchVolumes: the plugin's metrics count the volumes podvol's
// PVs and inline pods have.
func testMetricsMatchVolumes(t *testing.T) {
	n := ns(t)
	pvc(t, n, "m", "podvol", "64Mi", "")
	pod(t, n, "m", "true", "persistentVolumeClaim: {claimName: m}")
	pod(t, n, "i", "true", "csi:\n  driver: podvol.io\n  volumeAttributes: {size: 64Mi}")
	waitPod(t, n, "m")
	waitPod(t, n, "i")
	// A PV of an earlier test may be going away: compare until both
	// sides agree.
	eventually(t, time.Minute, func() string {
		out, err := cluster.Get(ctx(t), "", "pv", `{range .items[?(@.spec.csi.driver=="podvol.io")]}{.metadata.name} {end}`)
		if err != nil {
			return err.Error()
		}
		pvs := strings.Fields(out)
		// Each node's plugin counts its own volumes, on the node's
		// loopback.
		var pages []string
		for _, node := range cluster.Nodes {
			page, err := node.FetchMetrics(ctx(t), devcluster.PluginMetrics)
			if err != nil {
				return fmt.Sprintf("node %s's plugin metrics: %v", node.Name, err)
			}
			pages = append(pages, page)
		}
		// A series a node's plugin has not had yet (no publish since it
		// started there) counts 0: it is absent, not an error.
		metric := func(re string) int {
			sum := 0
			for _, page := range pages {
				m := regexp.MustCompile(re).FindStringSubmatch(page)
				if m == nil {
					continue
				}
				v, _ := strconv.ParseFloat(m[1], 64)
				sum += int(v)
			}
			return sum
		}
		if got := metric(`podvol_volumes\{kind="persistent",node="[^"]+",pool="default"\} (\S+)`); got != len(pvs) {
			return fmt.Sprintf("podvol_volumes{kind=persistent} = %d, podvol PVs: %d (%v)", got, len(pvs), pvs)
		}
		if got := metric(`podvol_volumes\{kind="inline",node="[^"]+",pool="default"\} (\S+)`); got < 1 {
			return fmt.Sprintf("podvol_volumes{kind=inline} = %d with an inline pod running", got)
		}
		if got := metric(`podvol_csi_operation_duration_seconds_count\{code="OK",method="NodePublishVolume",node="[^"]+"\} (\S+)`); got < 2 {
			return fmt.Sprintf("NodePublishVolume count %d", got)
		}
		return ""
	})
}

// waitPendingFor waits until the pod's scheduling condition or one of its
// events explains, with word, why it cannot run, and checks that it indeed
// stays Pending. The condition is read too: repeats of an event keep the
// first message, which may give another reason.
func waitPendingFor(t *testing.T, ns, pod, word string) {
	t.Helper()
	eventually(t, 2*time.Minute, func() string {
		ev, _ := cluster.RunKubectl(ctx(t), "-n", ns, "get", "events", "--field-selector", "involvedObject.name="+pod, "-o", "jsonpath={.items[*].message}")
		cond, _ := cluster.Get(ctx(t), ns, "pod/"+pod, `{.status.conditions[?(@.type=="PodScheduled")].message}`)
		if !strings.Contains(ev+cond, word) {
			return "nothing about pod " + pod + " mentions " + word + ": " + cond + " / " + ev
		}
		return ""
	})
	if phase := get(t, ns, "pod/"+pod, "{.status.phase}"); phase != "Pending" {
		t.Fatalf("pod %s is %s, want Pending because of %s", pod, phase, word)
	}
}

// growTo1Gi grows claim to 1 GiB and waits until pod, which mounts it at
// /vol, sees the filesystem grown.
func growTo1Gi(t *testing.T, n, claim, pod string) {
	t.Helper()
	_, err := cluster.RunKubectl(ctx(t), "-n", n, "patch", "pvc", claim, "--type=merge", "-p", `{"spec":{"resources":{"requests":{"storage":"1Gi"}}}}`)
	must(t, "resize", err)
	eventually(t, 3*time.Minute, func() string {
		out, err := cluster.Exec(ctx(t), n, pod, "df -k /vol | tail -1 | awk '{print $2}'")
		if err != nil {
			return err.Error()
		}
		if kb, _ := strconv.Atoi(out); kb < 900*1024 {
			return fmt.Sprintf("the pod sees %d KiB", kb)
		}
		return ""
	})
}
