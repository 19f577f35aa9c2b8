package e2e

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/podvol/podvol/internal/chart"
	"github.com/podvol/podvol/internal/devcluster"
	"github.com/podvol/podvol/internal/kubectlplugin"
)

// testDeviceClasses: the dev cluster's nodes but the last have a second
// pool, fast, of their own size (the chart's pool set, on nodes labelled by
// their kubelets), served through the class podvol-fast. The class has no
// capacity on a node without the pool; a claim that only one node's fast
// pool has room for lands there; a claim's volume, its snapshot, the
// restore and the growth stay in the fast pool; a restore into the default
// pool's class is refused with an event that says why; kubectl podvol
// status shows the pool.
func testDeviceClasses(t *testing.T) {
	var fast []*devcluster.Node
	for _, nd := range cluster.Nodes {
		if nd.HasFastPool() {
			fast = append(fast, nd)
		}
	}
	if len(fast) == 0 || len(fast) == len(cluster.Nodes) {
		t.Fatalf("the dev cluster's nodes %v: want some, not all, with the pool %s", cluster.NodeNames(), devcluster.FastPool)
	}
	slices.SortFunc(fast, func(a, b *devcluster.Node) int { return int(b.FastPoolSize()>>30 - a.FastPoolSize()>>30) })

	// Capacity per class: a node without the pool publishes none for it.
	eventually(t, 2*time.Minute, func() string {
		for _, nd := range cluster.Nodes {
			q, err := cluster.Get(ctx(t), chart.Namespace, "csistoragecapacities", fmt.Sprintf(
				`{range .items[?(@.storageClassName=="%s")]}{.nodeTopology.matchLabels.topology\.podvol\.io/node}={.capacity}{"\n"}{end}`, devcluster.FastClass))
			if err != nil {
				return err.Error()
			}
			got := ""
			for _, l := range strings.Fields(q) {
				if v, ok := strings.CutPrefix(l, nd.Name+"="); ok {
					got = v
				}
			}
			switch {
			case got == "":
				return fmt.Sprintf("no CSIStorageCapacity of class %s for node %s yet", devcluster.FastClass, nd.Name)
			case nd.HasFastPool() && (got == "0" || got == "0Ki"):
				return fmt.Sprintf("node %s has a fast pool, yet its capacity for %s is %s", nd.Name, devcluster.FastClass, got)
			case !nd.HasFastPool() && got != "0" && got != "0Ki":
				return fmt.Sprintf("node %s has no fast pool, yet its capacity for %s is %s", nd.Name, devcluster.FastClass, got)
			}
		}
		return ""
	})

	n := ns(t)
	// A claim only the largest fast pool has room for (a pool's XFS
	// takes some of its image) lands on its node.
	big := fast[0].FastPoolSize()>>30 - 1
	if len(fast) > 1 && fast[1].FastPoolSize()>>30 >= big {
		t.Fatalf("the fast pools (%d and %d GiB) are too close in size for this test", fast[0].FastPoolSize()>>30, fast[1].FastPoolSize()>>30)
	}
	pod(t, n, "big", "true", ephemeralSized(devcluster.FastClass, strconv.FormatInt(big, 10)+"Gi"))
	waitPod(t, n, "big")
	if got := podNode(t, n, "big"); got != fast[0] {
		t.Fatalf("a %d GiB claim of %s landed on %s; only %s's fast pool has room", big, devcluster.FastClass, got.Name, fast[0].Name)
	}
	deletePod(t, n, "big")

	// A volume of the class, its snapshot and a restore: all in the fast
	// pool of one node.
	pvc(t, n, "data", devcluster.FastClass, "512Mi", "")
	pod(t, n, "writer", "echo one > /vol/f && sync", "persistentVolumeClaim: {claimName: data}")
	waitPod(t, n, "writer")
	node := podNode(t, n, "writer")
	handle := get(t, "", "pv/"+get(t, n, "pvc/data", "{.spec.volumeName}"), "{.spec.csi.volumeHandle}")
	inFast := func(handle string) string {
		if !strings.HasPrefix(handle, "pv-"+devcluster.FastPool+"-") {
			return fmt.Sprintf("volume handle %s is not one of pool %s", handle, devcluster.FastPool)
		}
		if _, err := os.Stat(node.FastPoolDir() + "/volumes/" + handle + ".img"); err != nil {
			return fmt.Sprintf("node %s's fast pool has no image of %s: %v", node.Name, handle, err)
		}
		if _, err := os.Stat(node.PoolDir() + "/volumes/" + handle + ".img"); !os.IsNotExist(err) {
			return fmt.Sprintf("node %s's default pool has an image of %s: %v", node.Name, handle, err)
		}
		return ""
	}
	if why := inFast(handle); why != "" {
		t.Fatal(why)
	}
	applyFile(t, "snapshot.yaml", map[string]string{"NS": n})
	eventually(t, 3*time.Minute, func() string {
		if r, _ := cluster.Get(ctx(t), n, "volumesnapshot/snap", "{.status.readyToUse}"); r != "true" {
			return "snapshot not ready: " + r
		}
		return ""
	})
	if h := get(t, "", "volumesnapshotcontent/"+get(t, n, "volumesnapshot/snap", "{.status.boundVolumeSnapshotContentName}"), "{.status.snapshotHandle}"); !strings.HasPrefix(h, "snap-"+devcluster.FastPool+"-") {
		t.Fatalf("the snapshot of a fast volume has handle %s", h)
	}
	fromSnap := "  dataSource: {apiGroup: snapshot.storage.k8s.io, kind: VolumeSnapshot, name: snap}\n"
	pvc(t, n, "restored", devcluster.FastClass, "512Mi", fromSnap)
	pod(t, n, "reader", "true", "persistentVolumeClaim: {claimName: restored}")
	waitPod(t, n, "reader")
	if got := exec(t, n, "reader", "cat /vol/f"); got != "one" {
		t.Fatalf("the restore reads %q", got)
	}
	if why := inFast(get(t, "", "pv/"+get(t, n, "pvc/restored", "{.spec.volumeName}"), "{.spec.csi.volumeHandle}")); why != "" {
		t.Fatal("the restore: " + why)
	}

	// A restore into the default pool's class: a copy stays in its
	// source's pool, and the claim's events say so.
	pvc(t, n, "elsewhere", "podvol-xfs", "512Mi", fromSnap)
	pod(t, n, "elsewhere", "true", "persistentVolumeClaim: {claimName: elsewhere}")
	eventually(t, 2*time.Minute, func() string {
		ev, _ := cluster.RunKubectl(ctx(t), "-n", n, "get", "events", "--field-selector", "involvedObject.name=elsewhere,reason=ProvisioningFailed", "-o", "jsonpath={.items[*].message}")
		if !strings.Contains(ev, "stays in its source's pool") {
			return "no ProvisioningFailed event of claim elsewhere says why: " + ev
		}
		return ""
	})
	deletePod(t, n, "elsewhere")
	_, err := cluster.RunKubectl(ctx(t), "-n", n, "delete", "pvc", "elsewhere", "--wait=true")
	must(t, "delete claim elsewhere", err)

	// Growth within the pool.
	growTo1Gi(t, n, "data", "writer")

	// kubectl podvol status: a line for the node's fast pool, with both
	// volumes and the snapshot.
	eventually(t, time.Minute, func() string {
		var doc struct{ Nodes []kubectlplugin.NodeStatus }
		podvolJSON(t, &doc, "status")
		for _, s := range doc.Nodes {
			if s.Node == node.Name && s.Pool == devcluster.FastPool {
				if s.Volumes < 2 || s.Snapshots < 1 {
					return fmt.Sprintf("status of %s's fast pool: %+v", node.Name, s)
				}
				return ""
			}
		}
		return fmt.Sprintf("status has no line for %s's fast pool: %+v", node.Name, doc.Nodes)
	})
}
