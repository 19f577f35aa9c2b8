package e2e

// TestCluster runs this test last: it replaces the cluster's node.

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/podvol/podvol/internal/controller/nodeloss"
	"github.com/podvol/podvol/internal/devcluster"
)

// testNodeReplaced: the drain scenario of TopoLVM issue 41 and a StatefulSet
// whose node goes away. A Deployment of two pods with generic ephemeral
// volumes under a PodDisruptionBudget (maxUnavailable 1) cannot be drained
// from the only node; the node is then replaced (on the single-node dev
// cluster: the kubelet restarted under a new name and the old Node deleted).
// The Deployment recovers, because its volumes are per pod; the StatefulSet
// recovers, because podvol-controller releases the claim that pinned it to
// the lost node: once the old kubelet (killed) has not renewed its Lease for
// node-loss's grace period (5 minutes as deploy/base ships it), and not
// before. This test therefore takes over 5 minutes.
func testNodeReplaced(t *testing.T) {
	n := ns(t)
	old := cluster.NodeName
	apply(t, `apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: %[1]s}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
%[2]s---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web, namespace: %[1]s}
spec:
  maxUnavailable: 1
  selector: {matchLabels: {app: web}}
---
%[3]s`, n, devcluster.PodSpec(6, "echo web > /vol/f", "vol", "/vol", ephemeralVolume), devcluster.DBStatefulSet(n, "podvol", "64Mi", "echo db > /vol/f", "/vol"))
	_, err := cluster.RunKubectl(ctx(t), "-n", n, "rollout", "status", "deployment/web", "--timeout=4m")
	must(t, "web ready", err)
	waitPod(t, n, "db-0")
	oldClaim := get(t, n, "pvc/data-db-0", "{.metadata.uid}")
	oldPV := get(t, n, "pvc/data-db-0", "{.spec.volumeName}")
	oldHandle := get(t, "", "pv/"+oldPV, "{.spec.csi.volumeHandle}")

	// The drain cannot finish on the only node: one pod is evicted, its
	// replacement has nowhere to go, and the budget blocks the second.
	out, err := cluster.RunKubectl(ctx(t), "drain", old, "--ignore-daemonsets", "--delete-emptydir-data", "--pod-selector=app=web", "--timeout=30s")
	if err == nil {
		t.Fatalf("draining the only node succeeded:\n%s", out)
	}

	// A loopback address as the new node's name: the API server reaches
	// the kubelet there.
	next := "127.0.0.1"
	if old == next {
		next = "127.0.0.2"
	}
	grace := nodeLossGrace(t)
	replaced := time.Now()
	// ReplaceNode returns once the old Node is gone, which node-loss lets
	// happen only after the grace (it waits up to 8 minutes for that).
	must(t, "replace the node", cluster.ReplaceNode(ctx(t), next))
	if took := time.Since(replaced); took < grace {
		t.Fatalf("the old node was released %s after it was killed, before node-loss's grace period of %s", took.Round(time.Second), grace)
	}
	// Events on a Node outlive it: the controller said it waited for the
	// Lease.
	if ev, _ := cluster.RunKubectl(ctx(t), "-n", "default", "get", "events", "--field-selector", "involvedObject.name="+old,
		"-o", "jsonpath={.items[*].reason}"); !strings.Contains(ev, "WaitingForNodeLease") {
		t.Fatalf("no WaitingForNodeLease event on Node %s: %s", old, ev)
	}

	eventually(t, 6*time.Minute, func() string {
		ready, err := cluster.Get(ctx(t), n, "deployment/web", "{.status.readyReplicas}")
		if ready != "2" || err != nil {
			return fmt.Sprintf("web has %q ready replicas (%v)", ready, err)
		}
		nodes, err := cluster.Get(ctx(t), n, "pods", "{.items[*].spec.nodeName}")
		if err != nil {
			return err.Error()
		}
		for _, node := range strings.Fields(nodes) {
			if node != next {
				return "a pod is still on " + node + ": " + nodes
			}
		}
		return ""
	})
	eventually(t, 6*time.Minute, func() string {
		phase, _ := cluster.Get(ctx(t), n, "pod/db-0", "{.status.phase}/{.spec.nodeName}")
		if phase != "Running/"+next {
			return "db-0 is " + phase
		}
		return ""
	})
	if uid := get(t, n, "pvc/data-db-0", "{.metadata.uid}"); uid == oldClaim {
		t.Fatal("db-0 runs on the new node with the old node's claim")
	}
	if got := exec(t, n, "db-0", "cat /vol/f"); got != "db" {
		t.Fatalf("db-0 on the new node: %q", got)
	}
	// The lost node's PV goes too: no provisioner can delete it.
	eventually(t, time.Minute, func() string {
		if out, err := cluster.RunKubectl(ctx(t), "get", "pv", oldPV, "--ignore-not-found", "-o", "jsonpath={.metadata.name} {.metadata.finalizers}"); err != nil || out != "" {
			return fmt.Sprintf("PV of the lost node is still there: %s (%v)", out, err)
		}
		return ""
	})
	if ev, _ := cluster.RunKubectl(ctx(t), "-n", n, "get", "events", "-o", "jsonpath={.items[*].reason}"); !strings.Contains(ev, "NodeLost") {
		t.Fatalf("no NodeLost event: %s", ev)
	}

	// What was released is written down, and its image is still in the
	// pool, which the dev cluster's new node serves (on a real replacement
	// the disk is gone; on a node that comes back, it is what the record
	// and docs/operations.md's "A node comes back" are for).
	record := get(t, "podvol-system", "configmap/"+nodeloss.ReleasedRecordName(old), "{.data}")
	if !strings.Contains(record, oldPV) || !strings.Contains(record, "volumeHandle="+oldHandle+" claim="+n+"/data-db-0") {
		t.Fatalf("record of the volumes released from %s: %s", old, record)
	}
	if _, err := os.Stat(cluster.PoolDir() + "/volumes/" + oldHandle + ".img"); err != nil {
		t.Fatalf("the released volume's image: %v", err)
	}
}

// nodeLossGrace is the --node-loss-grace-period podvol-controller runs with.
func nodeLossGrace(t *testing.T) time.Duration {
	args := get(t, "podvol-system", "deployment/podvol-controller", `{.spec.template.spec.containers[?(@.name=="podvol-controller")].args}`)
	m := regexp.MustCompile(`--node-loss-grace-period=([0-9a-zµ.]+)`).FindStringSubmatch(args)
	if m == nil {
		return nodeloss.DefaultGrace
	}
	d, err := time.ParseDuration(m[1])
	must(t, "podvol-controller's --node-loss-grace-period", err)
	return d
}
