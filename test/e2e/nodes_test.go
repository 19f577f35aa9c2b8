package e2e

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/podvol/podvol/internal/controller/nodeloss"
	"github.com/podvol/podvol/internal/devcluster"
)

// webAndDB is a Deployment "web" of two pods with generic ephemeral volumes
// under a PodDisruptionBudget (maxUnavailable 1), and a StatefulSet "db"
// with one persistent claim.
func webAndDB(n string) string {
	return fmt.Sprintf(`apiVersion: apps/v1
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
}

// onlyOn cordons every node but keep until the returned function is called
// (and at the end of the test), so that what is made meanwhile lands there.
func onlyOn(t *testing.T, keep *devcluster.Node) func() {
	var others []string
	for _, node := range cluster.Nodes {
		if node != keep {
			others = append(others, node.Name)
		}
	}
	if len(others) == 0 {
		t.Fatalf("this test needs a cluster of several nodes; the dev cluster has %v (podvol-dev --nodes)", cluster.NodeNames())
	}
	done := false
	uncordon := func() {
		if !done {
			done = true
			_, err := cluster.RunKubectl(ctx(t), append([]string{"uncordon"}, others...)...)
			must(t, "uncordon", err)
		}
	}
	t.Cleanup(uncordon)
	_, err := cluster.RunKubectl(ctx(t), append([]string{"cordon"}, others...)...)
	must(t, "cordon "+strings.Join(others, " "), err)
	return uncordon
}

// podsOf lists the nodes the pods matching selector run on.
func podsOf(t *testing.T, ns, selector string) []string {
	out, err := cluster.RunKubectl(ctx(t), "-n", ns, "get", "pods", "-l", selector, "-o", "jsonpath={.items[*].spec.nodeName}")
	must(t, "list pods "+selector, err)
	return strings.Fields(out)
}

// testDrainWithSomewhereToGo: the drain of TopoLVM issue 41 on a cluster
// where the pods have somewhere to go. Two pods with generic ephemeral
// volumes under a budget that lets one go at a time are on node A; `kubectl
// drain A` completes, the pods come back on other nodes with new volumes,
// and A's images are removed.
func testDrainWithSomewhereToGo(t *testing.T) {
	n := ns(t)
	a := cluster.Nodes[0]
	release := onlyOn(t, a)
	apply(t, "%s", webAndDB(n))
	_, err := cluster.RunKubectl(ctx(t), "-n", n, "rollout", "status", "deployment/web", "--timeout=4m")
	must(t, "web ready", err)
	if nodes := podsOf(t, n, "app=web"); len(nodes) != 2 || nodes[0] != a.Name || nodes[1] != a.Name {
		t.Fatalf("web's pods run on %v, want both on %s", nodes, a.Name)
	}
	handles := strings.Fields(get(t, "", "pv", `{range .items[?(@.spec.claimRef.namespace=="`+n+`")]}{.spec.claimRef.name}={.spec.csi.volumeHandle}{"\n"}{end}`))
	var webImages []string
	for _, h := range handles {
		if strings.HasPrefix(h, "web-") {
			webImages = append(webImages, a.PoolDir()+"/volumes/"+strings.SplitN(h, "=", 2)[1]+".img")
		}
	}
	if len(webImages) != 2 {
		t.Fatalf("web's volumes: %v, want two", handles)
	}
	for _, img := range webImages {
		if _, err := os.Stat(img); err != nil {
			t.Fatalf("web's volume on %s: %v", a.Name, err)
		}
	}
	release()

	t.Cleanup(func() { _, _ = cluster.RunKubectl(ctx(t), "uncordon", a.Name) })
	out, err := cluster.RunKubectl(ctx(t), "drain", a.Name, "--ignore-daemonsets", "--delete-emptydir-data", "--pod-selector=app=web", "--timeout=4m")
	must(t, "drain "+a.Name+":\n"+out, err)
	eventually(t, 4*time.Minute, func() string {
		ready, _ := cluster.Get(ctx(t), n, "deployment/web", "{.status.readyReplicas}")
		nodes := podsOf(t, n, "app=web")
		if ready != "2" {
			return fmt.Sprintf("web has %q ready replicas, on %v", ready, nodes)
		}
		for _, node := range nodes {
			if node == a.Name {
				return "a web pod is still on " + a.Name
			}
		}
		return ""
	})
	if got := exec(t, n, "deploy/web", "cat /vol/f"); got != "web" {
		t.Fatalf("web after the drain: %q", got)
	}
	eventually(t, 2*time.Minute, func() string {
		for _, img := range webImages {
			if _, err := os.Stat(img); !os.IsNotExist(err) {
				return fmt.Sprintf("the drained pods' image %s is still there (%v)", img, err)
			}
		}
		return ""
	})
}

// testNodeLost: a node really lost. The StatefulSet's pod and claim are on
// node B; B's kubelet, containers and containerd stop (its disk stays) and
// the Node is deleted. podvol-controller releases the claim that pinned the
// pod to B once B's kubelet has not renewed its Lease for node-loss's grace
// period (5 minutes as deploy/base ships it), and not before: this test
// takes over 5 minutes. The pod then runs on another node with a new
// volume. B comes back under its name: what was released is written down,
// announced on the Node, and its image is still in B's pool, until `kubectl
// podvol reclaim` deletes it.
func testNodeLost(t *testing.T) {
	n := ns(t)
	b := cluster.Nodes[len(cluster.Nodes)-1]
	release := onlyOn(t, b)
	apply(t, "%s", devcluster.DBStatefulSet(n, "podvol", "64Mi", "echo db > /vol/f", "/vol"))
	waitPod(t, n, "db-0")
	if node := get(t, n, "pod/db-0", "{.spec.nodeName}"); node != b.Name {
		t.Fatalf("db-0 runs on %s, want %s", node, b.Name)
	}
	release()
	oldClaim := get(t, n, "pvc/data-db-0", "{.metadata.uid}")
	oldPV := get(t, n, "pvc/data-db-0", "{.spec.volumeName}")
	oldHandle := get(t, "", "pv/"+oldPV, "{.spec.csi.volumeHandle}")

	grace := nodeLossGrace(t)
	// The node comes back at the end whatever happens, so that the tests
	// after this one (and a kept cluster) have all their nodes.
	t.Cleanup(func() { must(t, "restart node "+b.Name, b.Restart(ctx(t))) })
	lost := time.Now()
	must(t, "lose node "+b.Name, b.Lose(ctx(t)))

	eventually(t, grace+6*time.Minute, func() string {
		phase, _ := cluster.Get(ctx(t), n, "pod/db-0", "{.status.phase}/{.spec.nodeName}")
		if !strings.HasPrefix(phase, "Running/") || phase == "Running/"+b.Name {
			return "db-0 is " + phase
		}
		return ""
	})
	// The release itself (the claim's NodeLost event), not the pod that
	// follows it, must come no sooner than the grace after the kubelet's
	// last Lease renewal, which is at most 10 s before the node was lost.
	released := strings.Fields(get(t, n, "events", `{range .items[?(@.reason=="NodeLost")]}{.eventTime}{" "}{.firstTimestamp}{"\n"}{end}`))
	if len(released) == 0 {
		t.Fatal("no NodeLost event on the released claim")
	}
	at, err := time.Parse(time.RFC3339Nano, released[0])
	must(t, "time of the NodeLost event", err)
	if took := at.Sub(lost); took < grace-10*time.Second {
		t.Fatalf("the lost node's claim was released %s after the node was lost, before node-loss's grace period of %s", took.Round(time.Second), grace)
	}
	// Events on a Node outlive it: the controller said it waited for the
	// Lease.
	if ev, _ := cluster.RunKubectl(ctx(t), "-n", "default", "get", "events", "--field-selector", "involvedObject.name="+b.Name,
		"-o", "jsonpath={.items[*].reason}"); !strings.Contains(ev, "WaitingForNodeLease") {
		t.Fatalf("no WaitingForNodeLease event on Node %s: %s", b.Name, ev)
	}
	if uid := get(t, n, "pvc/data-db-0", "{.metadata.uid}"); uid == oldClaim {
		t.Fatal("db-0 runs on another node with the lost node's claim")
	}
	if got := exec(t, n, "db-0", "cat /vol/f"); got != "db" {
		t.Fatalf("db-0 on its new node: %q", got)
	}
	// The lost node's PV goes too: no provisioner can delete it.
	eventually(t, time.Minute, func() string {
		if out, err := cluster.RunKubectl(ctx(t), "get", "pv", oldPV, "--ignore-not-found", "-o", "jsonpath={.metadata.name} {.metadata.finalizers}"); err != nil || out != "" {
			return fmt.Sprintf("PV of the lost node is still there: %s (%v)", out, err)
		}
		return ""
	})
	record := get(t, "podvol-system", "configmap/"+nodeloss.ReleasedRecordName(b.Name), "{.data}")
	if !strings.Contains(record, oldPV) || !strings.Contains(record, "volumeHandle="+oldHandle+" claim="+n+"/data-db-0") {
		t.Fatalf("record of the volumes released from %s: %s", b.Name, record)
	}

	// B comes back (docs/operations.md, "A node comes back"): the Node is
	// told what was released, and the image is still in its pool.
	must(t, "restart node "+b.Name, b.Restart(ctx(t)))
	eventually(t, 2*time.Minute, func() string {
		ev, _ := cluster.RunKubectl(ctx(t), "-n", "default", "get", "events", "--field-selector", "involvedObject.name="+b.Name, "-o", "jsonpath={.items[*].reason}")
		if !strings.Contains(ev, "ReleasedVolumesOnNode") {
			return "no ReleasedVolumesOnNode event on Node " + b.Name + ": " + ev
		}
		return ""
	})
	if _, err := os.Stat(b.PoolDir() + "/volumes/" + oldHandle + ".img"); err != nil {
		t.Fatalf("the released volume's image on %s: %v", b.Name, err)
	}
	// What an admin does next (docs/operations.md, "kubectl podvol").
	checkReleasedAndReclaim(t, b, oldPV, oldHandle, n+"/data-db-0")
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

// callsPerNode reads, from each node's plugin, how many times each method
// succeeded.
func callsPerNode(t *testing.T, methods []string) map[string]map[string]int {
	calls := map[string]map[string]int{}
	for _, node := range cluster.Nodes {
		page, err := node.FetchMetrics(ctx(t), devcluster.PluginMetrics)
		must(t, "node "+node.Name+"'s plugin metrics", err)
		calls[node.Name] = map[string]int{}
		for _, m := range methods {
			re := regexp.MustCompile(`podvol_csi_operation_duration_seconds_count\{code="OK",method="` + m + `",node="` + node.Name + `"\} (\S+)`)
			if sm := re.FindStringSubmatch(page); sm != nil {
				v, _ := strconv.ParseFloat(sm[1], 64)
				calls[node.Name][m] = int(v)
			}
		}
	}
	return calls
}

// testPerNodeRouting: each call reaches the node that holds the volume.
// Every node publishes its own capacity; a volume placed on node B is
// provisioned, snapshotted, grown and deleted by node B's plugin and by no
// other node's, whichever node's external-resizer holds its Lease.
func testPerNodeRouting(t *testing.T) {
	// Each node's CSIStorageCapacity says what its own pool has: the pools
	// differ in size, so each node's figure is its own.
	seen := map[string]string{}
	out, err := cluster.Get(ctx(t), "podvol-system", "csistoragecapacities",
		`{range .items[?(@.storageClassName=="podvol")]}{.nodeTopology.matchLabels.topology\.podvol\.io/node}={.capacity}{"\n"}{end}`)
	must(t, "CSIStorageCapacity", err)
	for _, node := range cluster.Nodes {
		for _, line := range strings.Fields(out) {
			if name, capacity, _ := strings.Cut(line, "="); name == node.Name {
				q := resource.MustParse(capacity)
				if q.Value() > node.PoolSize || q.Value() < node.PoolSize*9/10 {
					t.Fatalf("node %s publishes %s for a pool of %d GiB", node.Name, capacity, node.PoolSize>>30)
				}
				if other, dup := seen[capacity]; dup {
					t.Fatalf("nodes %s and %s publish the same capacity %s: one is not its own pool's", other, node.Name, capacity)
				}
				seen[capacity] = node.Name
			}
		}
	}
	if len(seen) != len(cluster.Nodes) {
		t.Fatalf("capacity of class podvol published for %v, want one per node %v", seen, cluster.NodeNames())
	}

	methods := []string{"CreateVolume", "CreateSnapshot", "NodeExpandVolume", "DeleteSnapshot", "DeleteVolume"}
	before := callsPerNode(t, methods)
	n := ns(t)
	b := cluster.Nodes[len(cluster.Nodes)/2]
	release := onlyOn(t, b)
	pvc(t, n, "data", "podvol-xfs", "256Mi", "")
	pod(t, n, "writer", "echo one > /vol/f", "persistentVolumeClaim: {claimName: data}")
	waitPod(t, n, "writer")
	release()
	applyFile(t, "snapshot.yaml", map[string]string{"NS": n})
	eventually(t, 3*time.Minute, func() string {
		if r, _ := cluster.Get(ctx(t), n, "volumesnapshot/snap", "{.status.readyToUse}"); r != "true" {
			return "snapshot not ready: " + r
		}
		return ""
	})
	_, err = cluster.RunKubectl(ctx(t), "-n", n, "patch", "pvc", "data", "--type=merge", "-p", `{"spec":{"resources":{"requests":{"storage":"512Mi"}}}}`)
	must(t, "resize", err)
	eventually(t, 3*time.Minute, func() string {
		if got := get(t, n, "pvc/data", "{.status.capacity.storage}"); got != "512Mi" {
			return "claim capacity " + got
		}
		return ""
	})
	leader := get(t, "podvol-system", "lease/external-resizer-podvol-io", "{.spec.holderIdentity}")
	_, err = cluster.RunKubectl(ctx(t), "-n", n, "delete", "volumesnapshot", "snap", "--wait=true", "--timeout=2m")
	must(t, "delete snapshot", err)
	deletePod(t, n, "writer")
	pv := get(t, n, "pvc/data", "{.spec.volumeName}")
	_, err = cluster.RunKubectl(ctx(t), "-n", n, "delete", "pvc", "data", "--wait=true", "--timeout=2m")
	must(t, "delete claim", err)
	eventually(t, 2*time.Minute, func() string {
		if out, _ := cluster.RunKubectl(ctx(t), "get", "pv", pv, "--ignore-not-found", "-o", "name"); out != "" {
			return "PV " + pv + " is still there"
		}
		return ""
	})

	after := callsPerNode(t, methods)
	for _, node := range cluster.Nodes {
		for _, m := range methods {
			d := after[node.Name][m] - before[node.Name][m]
			if node == b && d < 1 {
				t.Errorf("node %s, which holds the volume, made no %s", node.Name, m)
			}
			if node != b && d != 0 {
				t.Errorf("node %s made %d %s for a volume of node %s", node.Name, d, m, b.Name)
			}
		}
	}
	t.Logf("every call for the volume on %s was made by %s's plugin; external-resizer's Lease was held by %s", b.Name, b.Name, leader)
}
