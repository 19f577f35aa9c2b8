package e2e

import (
	"testing"
	"time"

	"github.com/podvol/podvol/internal/devcluster"
	"github.com/podvol/podvol/internal/names"
)

// testPlacementBeforeScheduling forces the order that would strand a pod:
// podvol-controller is stopped, so nothing places a clone on its source's
// node, while a pod that uses the clone and a new claim (a database's
// restored data and its new WAL) is created, preferring another node. The
// scheduler must not choose a node for it meanwhile: the new claim would be
// provisioned there and the clone on its source's node, and the pod could
// never run. With the placement gate the pod waits, the new claim is not
// provisioned; once podvol-controller is back, the pod runs on the source's
// node with both volumes there and the source's data.
func testPlacementBeforeScheduling(t *testing.T) {
	n := ns(t)
	pvc(t, n, "src", "podvol", "128Mi", "")
	pod(t, n, "writer", "echo golden > /vol/f && sync", "persistentVolumeClaim: {claimName: src}")
	waitPod(t, n, "writer")
	source := podNode(t, n, "writer").Name
	deletePod(t, n, "writer")
	other := ""
	for _, name := range cluster.NodeNames() {
		if name != source {
			other = name
		}
	}
	if other == "" {
		t.Fatalf("this test needs two nodes or more; the dev cluster has %v", cluster.NodeNames())
	}

	const sys = "podvol-system"
	_, err := cluster.RunKubectl(ctx(t), "-n", sys, "scale", "deployment/podvol-controller", "--replicas=0")
	must(t, "stop podvol-controller", err)
	restored := false
	restore := func() {
		if restored {
			return
		}
		restored = true
		_, err := cluster.RunKubectl(ctx(t), "-n", sys, "scale", "deployment/podvol-controller", "--replicas=1")
		must(t, "start podvol-controller again", err)
		_, err = cluster.RunKubectl(ctx(t), "-n", sys, "rollout", "status", "deployment/podvol-controller", "--timeout=3m")
		must(t, "podvol-controller back", err)
	}
	t.Cleanup(restore)
	eventually(t, 2*time.Minute, func() string {
		if pods := get(t, sys, "pods", `{.items[?(@.metadata.labels.app\.kubernetes\.io/component=="controller")].metadata.name}`); pods != "" {
			return "podvol-controller's pod is still there: " + pods
		}
		return ""
	})

	pvc(t, n, "copy", "podvol", "128Mi", "  dataSource: {kind: PersistentVolumeClaim, name: src}\n")
	pvc(t, n, "wal", "podvol", "64Mi", "")
	apply(t, `apiVersion: v1
kind: Pod
metadata: {name: db, namespace: %s}
spec:
  affinity:
    nodeAffinity:
      preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        preference: {matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [%s]}]}
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: %s
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "cat /data/f > /wal/f && touch /tmp/ready && exec sleep 36000"]
    readinessProbe: {exec: {command: [test, -e, /tmp/ready]}, periodSeconds: 1}
    volumeMounts: [{name: data, mountPath: /data}, {name: wal, mountPath: /wal}]
  volumes:
  - {name: data, persistentVolumeClaim: {claimName: copy}}
  - {name: wal, persistentVolumeClaim: {claimName: wal}}
`, n, other, devcluster.Image)

	// Long enough for kube-scheduler to have chosen a node many times over.
	time.Sleep(20 * time.Second)
	if got := get(t, n, "pvc/copy", `{.metadata.annotations.volume\.kubernetes\.io/selected-node}`); got != names.AwaitingPlacement {
		t.Fatalf("the clone's selected node is %q before podvol placed it, want %q", got, names.AwaitingPlacement)
	}
	if got := get(t, n, "pvc/wal", `{.metadata.annotations.volume\.kubernetes\.io/selected-node}{.spec.volumeName}`); got != "" {
		t.Fatalf("the pod's new claim was given a node (or a volume) before its clone was placed: %q", got)
	}
	if got := get(t, n, "pod/db", "{.spec.nodeName}"); got != "" {
		t.Fatalf("the pod was scheduled to %s before its clone was placed", got)
	}

	restore()
	waitPod(t, n, "db")
	if got := podNode(t, n, "db").Name; got != source {
		t.Fatalf("the pod runs on %s, not on %s which holds its clone's source", got, source)
	}
	for _, c := range []string{"copy", "wal"} {
		pv := get(t, n, "pvc/"+c, "{.spec.volumeName}")
		if node := get(t, "", "pv/"+pv, "{.spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values[0]}"); node != source {
			t.Fatalf("claim %s was provisioned on %s, not with its pod on %s", c, node, source)
		}
	}
	if got := exec(t, n, "db", "cat /wal/f"); got != "golden" {
		t.Fatalf("the clone holds %q, want the source's data", got)
	}
	t.Logf("the pod ran on the source's node %s once podvol-controller was back", source)
	deletePod(t, n, "db")
}
