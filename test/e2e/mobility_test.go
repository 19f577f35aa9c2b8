package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/podvol/podvol/internal/devcluster"
	"github.com/podvol/podvol/internal/names"
)

// testRestoreOnAnotherNode: a snapshot's data follows a restore to the node
// its pod must run on. A pod writes 64 MiB of random data and its checksum;
// a snapshot is cut; a restore of it, left to the scheduler
// (podvol.io/placement: scheduler), is used by a pod that can run only on
// another node. That node's plugin pulls the snapshot from the source
// node's (mutual TLS with the certificates transfer-signer issued), the
// claim shows the copy's progress, and the pod reads the data with its
// checksum intact. A pod of a tenant that reaches the source's transfer
// port gets nothing: the handshake wants a node's certificate.
func testRestoreOnAnotherNode(t *testing.T) {
	n := ns(t)
	source := writtenSnapshot(t, n, 64)
	other := ""
	for _, name := range cluster.NodeNames() {
		if name != source.Name {
			other = name
			break
		}
	}
	if other == "" {
		t.Fatalf("this test needs two nodes or more; the dev cluster has %v", cluster.NodeNames())
	}

	start := time.Now()
	restoreOn(t, n, "restored", "512Mi", "reader", other)
	waitPod(t, n, "reader")
	t.Logf("restored on %s from %s's snapshot in %s", other, source.Name, time.Since(start).Round(time.Second))
	if got := podNode(t, n, "reader").Name; got != other {
		t.Fatalf("reader runs on %s, want %s", got, other)
	}
	pv := get(t, n, "pvc/restored", "{.spec.volumeName}")
	if node := get(t, "", "pv/"+pv, "{.spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values[0]}"); node != other {
		t.Fatalf("PV %s is on node %s, want %s", pv, node, other)
	}
	if out := exec(t, n, "reader", "cd /vol && sha256sum -c sum"); !strings.Contains(out, "blob: OK") {
		t.Fatalf("the restored data does not match its checksum: %q", out)
	}
	// The copy was reported on the claim while it ran.
	events := get(t, n, "events", `{range .items[?(@.involvedObject.name=="restored")]}{.message}{"\n"}{end}`)
	if !strings.Contains(events, "copying snapshot") || !strings.Contains(events, "from node "+source.Name) {
		t.Errorf("the claim's events do not show the copy:\n%s", events)
	}

	// A tenant's pod on another node reaching the source's transfer port.
	must(t, "image "+curlImage, cluster.ImportToolImage(ctx(t), curlImage, "curl"))
	ip := get(t, "", "node/"+source.Name, `{.status.addresses[?(@.type=="InternalIP")].address}`)
	apply(t, `apiVersion: v1
kind: Pod
metadata: {name: tenant, namespace: %s}
spec:
  nodeSelector: {%s: %s}
  terminationGracePeriodSeconds: 0
  containers:
    - {name: c, image: %s, command: [sleep, "3600"]}
`, n, names.TopologyKey, other, curlImage)
	must(t, "tenant pod ready", cluster.WaitPod(ctx(t), n, "tenant", 2*time.Minute))
	snapID := get(t, "", "volumesnapshotcontent/"+get(t, n, "volumesnapshot/snap", "{.status.boundVolumeSnapshotContentName}"), "{.status.snapshotHandle}")
	snapID, _, _ = strings.Cut(snapID, "@")
	url := fmt.Sprintf("https://%s:9816/v1/images/%s?namespace=%s&name=restored&uid=x", ip, snapID, n)
	out, err := cluster.Exec(ctx(t), n, "tenant", "curl -sk -o /dev/null -w '%{http_code}' --max-time 10 '"+url+"'; echo \" exit=$?\"")
	if err != nil && !strings.Contains(out, "exit=") {
		t.Fatalf("curl from the tenant's pod: %v (%s)", err, out)
	}
	if !strings.HasPrefix(strings.TrimSpace(out), "000") || strings.Contains(out, "exit=0") {
		t.Fatalf("a tenant's pod reached the transfer endpoint: %q, want the TLS handshake refused", out)
	}
	t.Logf("a tenant's pod asking %s: %s", url, strings.TrimSpace(out))
}

// writtenSnapshot makes claim data in namespace n, where a pod writes mib
// MiB of random data (/vol/blob) and its checksum (/vol/sum), and a ready
// VolumeSnapshot snap of it; it returns the pod's node.
func writtenSnapshot(t *testing.T, n string, mib int) *devcluster.Node {
	t.Helper()
	pvc(t, n, "data", "podvol-xfs", "512Mi", "")
	pod(t, n, "writer", fmt.Sprintf("dd if=/dev/urandom of=/vol/blob bs=1M count=%d 2>/dev/null && cd /vol && sha256sum blob > sum && sync", mib),
		"persistentVolumeClaim: {claimName: data}")
	waitPod(t, n, "writer")
	source := podNode(t, n, "writer")
	applyFile(t, "snapshot.yaml", map[string]string{"NS": n})
	eventually(t, 3*time.Minute, func() string {
		if r, _ := cluster.Get(ctx(t), n, "volumesnapshot/snap", "{.status.readyToUse}"); r != "true" {
			return "snapshot not ready: " + r
		}
		return ""
	})
	return source
}

// testCloneOnAnotherNode: a clone its source's node has no room for lands
// on a node that has, with the data. A pod on the node with the smallest
// pool writes 64 MiB and its checksum; a clone asking for more than that
// pool holds is placed on the source's node (podvol places clones there),
// whose plugin gives it back (RESOURCE_EXHAUSTED); podvol-controller then
// leaves it to kube-scheduler, whose node pulls a snapshot the source's
// node cuts of the live volume, and a pod with no node selector reads the
// data there with its checksum intact.
func testCloneOnAnotherNode(t *testing.T) {
	n := ns(t)
	small := cluster.Nodes[0]
	for _, node := range cluster.Nodes {
		if node.PoolSize < small.PoolSize {
			small = node
		}
	}
	pvc(t, n, "data", "podvol-xfs", "512Mi", "")
	apply(t, "apiVersion: v1\nkind: Pod\nmetadata: {name: writer, namespace: %s}\nspec:\n  nodeSelector: {%s: %s}\n%s", n, names.TopologyKey, small.Name,
		devcluster.PodSpec(2, "dd if=/dev/urandom of=/vol/blob bs=1M count=64 2>/dev/null && cd /vol && sha256sum blob > sum && sync", "vol", "/vol", "persistentVolumeClaim: {claimName: data}"))
	waitPod(t, n, "writer")

	size := fmt.Sprintf("%dGi", small.PoolSize>>30+1)
	start := time.Now()
	pvc(t, n, "copy", "podvol-xfs", size, "  dataSource: {kind: PersistentVolumeClaim, name: data}\n")
	pod(t, n, "reader", "true", "persistentVolumeClaim: {claimName: copy}")
	waitPod(t, n, "reader")
	target := podNode(t, n, "reader").Name
	t.Logf("a %s clone of %s's volume runs on %s after %s", size, small.Name, target, time.Since(start).Round(time.Second))
	if target == small.Name {
		t.Fatalf("the clone runs on %s, whose pool of %d GiB cannot hold %s", target, small.PoolSize>>30, size)
	}
	if out := exec(t, n, "reader", "cd /vol && sha256sum -c sum"); !strings.Contains(out, "blob: OK") {
		t.Fatalf("the cloned data does not match its checksum: %q", out)
	}
	events := get(t, n, "events", `{range .items[?(@.involvedObject.name=="copy")]}{.reason}: {.message}{"\n"}{end}`)
	for _, want := range []string{"DataFollowsPod", "copying volume", "from node " + small.Name} {
		if !strings.Contains(events, want) {
			t.Errorf("the clone's events do not say %q:\n%s", want, events)
		}
	}
	// The source kept running, and wrote on.
	if out := exec(t, n, "writer", "echo more > /vol/more && cat /vol/more"); out != "more" {
		t.Errorf("the source's pod after the clone: %q", out)
	}
}

// testTransferSurvivesKilledPlugins: a pull converges when either end's
// plugin is killed in the middle of it. A pod on node A writes 1 GiB of
// random data and its checksum; a snapshot is cut and restored twice for
// pods that run only on node B. During the first pull, A's plugin is
// SIGKILLed (the source: B retries and resumes once it is back); during the
// second, B's (the target: its restart resumes the pull from its store).
// Both restores hold the data with its checksum intact, and B's pool holds
// no image but theirs. The killed plugins' pods are replaced at the end, so
// that the run's no-restart check still means what it says.
func testTransferSurvivesKilledPlugins(t *testing.T) {
	n := ns(t)
	a, b := cluster.Nodes[0], cluster.Nodes[1]
	pvc(t, n, "data", "podvol-xfs", "2Gi", "")
	apply(t, "apiVersion: v1\nkind: Pod\nmetadata: {name: writer, namespace: %s}\nspec:\n  nodeSelector: {%s: %s}\n%s", n, names.TopologyKey, a.Name,
		devcluster.PodSpec(2, "dd if=/dev/urandom of=/vol/blob bs=1M count=1024 2>/dev/null && cd /vol && sha256sum blob > sum && sync", "vol", "/vol", "persistentVolumeClaim: {claimName: data}"))
	waitPod(t, n, "writer")
	applyFile(t, "snapshot.yaml", map[string]string{"NS": n})
	eventually(t, 3*time.Minute, func() string {
		if r, _ := cluster.Get(ctx(t), n, "volumesnapshot/snap", "{.status.readyToUse}"); r != "true" {
			return "snapshot not ready: " + r
		}
		return ""
	})
	t.Cleanup(func() { replaceNodePods(t, a.Name, b.Name) })
	before := imagesOf(t, b)

	for _, kill := range []*devcluster.Node{a, b} {
		restore := "restore-of-" + kill.Name
		reader := "reader-of-" + kill.Name
		restoreOn(t, n, restore, "2Gi", reader, b.Name)
		// The pull writes into a new image in B's pool: killed once a
		// quarter of the data is in (looked at every 50 ms: a pull of
		// 1 GiB takes seconds).
		img := ""
		for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
			for _, f := range imagesOf(t, b) {
				if !slices.Contains(before, f) {
					img = f
				}
			}
			if img != "" && allocatedBytes(img) >= 256<<20 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("after 3 minutes, the pull on %s has not copied 256 MiB (image %q)", b.Name, img)
			}
		}
		pod, id := pluginContainer(t, kill.Name)
		pids := devcluster.KillContainer(id)
		got := allocatedBytes(img)
		if len(pids) == 0 {
			t.Fatalf("no process of the plugin container %s of pod %s to kill", id, pod)
		}
		if got >= 1<<30 {
			t.Fatalf("the pull had all %d MiB when %s's plugin was killed: nothing was interrupted", got>>20, kill.Name)
		}
		t.Logf("killed %s's plugin (pod %s, pids %v) with %d MiB pulled into %s", kill.Name, pod, pids, got>>20, img)
		waitPod(t, n, reader)
		if out := exec(t, n, reader, "cd /vol && sha256sum -c sum"); !strings.Contains(out, "blob: OK") {
			t.Fatalf("the restore whose pull lost %s's plugin does not match its checksum: %q", kill.Name, out)
		}
		before = append(before, img)
		if kill == a {
			// The target lost its source and tried again.
			pod, _ := pluginContainer(t, b.Name)
			logs, err := cluster.RunKubectl(ctx(t), "-n", "podvol-system", "logs", pod, "-c", "plugin")
			must(t, "logs of "+pod, err)
			if !strings.Contains(logs, "A pull failed; retrying") {
				t.Errorf("%s's plugin did not retry the pull whose source was killed:\n%s", b.Name, lastLines(logs, 30))
			}
		}
	}
	// B's pool: the two restores' images, nothing half-copied beside.
	var handles []string
	for _, node := range []string{a.Name, b.Name} {
		pv := get(t, n, "pvc/restore-of-"+node, "{.spec.volumeName}")
		handles = append(handles, filepath.Join(b.PoolDir(), "volumes", get(t, "", "pv/"+pv, "{.spec.csi.volumeHandle}")+".img"))
	}
	for _, f := range imagesOf(t, b) {
		if !slices.Contains(before, f) {
			t.Errorf("an image in %s's pool that no volume of the test names: %s", b.Name, f)
		}
	}
	for _, h := range handles {
		if !slices.Contains(before, h) {
			t.Errorf("restore image %s is not the one that was pulled into (%v)", h, before)
		}
	}
	// The target's restart resumed its pull rather than starting again.
	pod, _ := pluginContainer(t, b.Name)
	logs, err := cluster.RunKubectl(ctx(t), "-n", "podvol-system", "logs", pod, "-c", "plugin")
	must(t, "logs of "+pod, err)
	if !strings.Contains(logs, "Resuming a pull") {
		t.Errorf("%s's plugin did not resume the pull it was killed in:\n%s", b.Name, lastLines(logs, 30))
	}
}

// imagesOf lists the volume images in node's pool.
func imagesOf(t *testing.T, node *devcluster.Node) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(node.PoolDir(), "volumes", "*.img"))
	must(t, "list "+node.Name+"'s images", err)
	return m
}

// allocatedBytes is the disk space a file takes (0 if it is gone).
func allocatedBytes(path string) int64 {
	var st syscall.Stat_t
	if syscall.Stat(path, &st) != nil {
		return 0
	}
	return st.Blocks * 512
}

// pluginContainer is podvol's node pod on node and its plugin container's
// id.
func pluginContainer(t *testing.T, node string) (pod, id string) {
	t.Helper()
	out, err := cluster.RunKubectl(ctx(t), "-n", "podvol-system", "get", "pods", "-l", "app.kubernetes.io/component=node",
		"--field-selector", "spec.nodeName="+node, "-o",
		`jsonpath={.items[0].metadata.name} {.items[0].status.containerStatuses[?(@.name=="plugin")].containerID}`)
	must(t, "podvol's pod on "+node, err)
	pod, id, _ = strings.Cut(strings.TrimSpace(out), " ")
	return pod, strings.TrimPrefix(id, "containerd://")
}

// replaceNodePods deletes podvol's node pods on nodes, gracefully, and
// waits for the DaemonSets to be ready again: their replacements start
// with no restarts counted.
func replaceNodePods(t *testing.T, nodes ...string) {
	for _, node := range nodes {
		pod, _ := pluginContainer(t, node)
		if _, err := cluster.RunKubectl(ctx(t), "-n", "podvol-system", "delete", "pod", pod, "--wait=true", "--timeout=2m"); err != nil {
			t.Errorf("replace %s: %v", pod, err)
		}
	}
	ds, err := cluster.NodeDaemonSets(ctx(t))
	must(t, "podvol's node DaemonSets", err)
	for _, d := range ds {
		if _, err := cluster.RunKubectl(ctx(t), "-n", "podvol-system", "rollout", "status", d, "--timeout=4m"); err != nil {
			t.Errorf("daemonset %s after its pods were replaced: %v", d, err)
		}
	}
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(l[max(0, len(l)-n):], "\n")
}

// restoreOn creates claim, a restore of VolumeSnapshot snap left to
// kube-scheduler (podvol.io/placement: scheduler), and pod, which uses it
// at /vol and may run only on node.
func restoreOn(t *testing.T, ns, claim, size, pod, node string) {
	t.Helper()
	apply(t, `apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: %s
  namespace: %s
  annotations: {%s: %s}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: podvol-xfs
  resources: {requests: {storage: %s}}
  dataSource: {apiGroup: snapshot.storage.k8s.io, kind: VolumeSnapshot, name: snap}
`, claim, ns, names.Placement, names.PlacementScheduler, size)
	apply(t, "apiVersion: v1\nkind: Pod\nmetadata: {name: %s, namespace: %s}\nspec:\n  nodeSelector: {%s: %s}\n%s",
		pod, ns, names.TopologyKey, node, podSpecYAML("persistentVolumeClaim: {claimName: "+claim+"}"))
}

// testDrainMigratesData: a StatefulSet replica whose claim asks to follow
// its pod (podvol.io/migrate-on-drain) is on node A. Cordoning A starts
// the copy while the pod runs; the claim is expanded as the copy begins,
// which grows the volume on A past the copy's size: the copy is made again
// at the new size, and its first copy pulled whole. The pod then writes
// more, and `kubectl drain A` evicts it; what changed since
// the first copy follows, the claim is re-made bound to the copy, and the
// replica runs on another node with every byte (checksums of what was
// written before and during the copy) and the expanded size. The old
// volume goes once the replica runs with the new one.
func testDrainMigratesData(t *testing.T) {
	n := ns(t)
	a := cluster.Nodes[0]
	release := onlyOn(t, a)
	apply(t, "%s", devcluster.MigratingDBStatefulSet(n, "podvol-xfs", "2Gi",
		"test -f /data/sums || (dd if=/dev/urandom of=/data/before bs=1M count=256 2>/dev/null && cd /data && sha256sum before > sums && sync)", "/data"))
	_, err := cluster.RunKubectl(ctx(t), "-n", n, "rollout", "status", "statefulset/db", "--timeout=4m")
	must(t, "db ready", err)
	release()
	if got := get(t, n, "pod/db-0", "{.spec.nodeName}"); got != a.Name {
		t.Fatalf("db-0 runs on %s, want %s", got, a.Name)
	}
	oldPV := get(t, n, "pvc/data-db-0", "{.spec.volumeName}")
	oldImage := filepath.Join(a.PoolDir(), "volumes", get(t, "", "pv/"+oldPV, "{.spec.csi.volumeHandle}")+".img")

	t.Cleanup(func() { _, _ = cluster.RunKubectl(ctx(t), "uncordon", a.Name) })
	_, err = cluster.RunKubectl(ctx(t), "cordon", a.Name)
	must(t, "cordon "+a.Name, err)
	target := ""
	eventually(t, 2*time.Minute, func() string {
		target, _ = cluster.Get(ctx(t), "", "pv/"+oldPV, "{.metadata.annotations.podvol\\.io/migration-target}")
		if target == "" {
			return "PV " + oldPV + " has no migration target"
		}
		return ""
	})
	// The claim expanded as its copy begins: the volume grows on A (its pod
	// runs) past the copy's size, and the copy is made again at the new
	// size.
	copyClaim := "pvc/podvol-move-" + get(t, n, "pvc/data-db-0", "{.metadata.uid}")
	first := ""
	eventually(t, 2*time.Minute, func() string {
		if first, _ = cluster.Get(ctx(t), n, copyClaim, "{.metadata.uid}"); first == "" {
			return "no copy's claim " + copyClaim
		}
		return ""
	})
	patched, err := cluster.RunKubectl(ctx(t), "-n", n, "patch", "pvc", "data-db-0", "--type=merge", "-p", `{"spec":{"resources":{"requests":{"storage":"3Gi"}}}}`)
	must(t, "expand data-db-0:\n"+patched, err)
	again := ""
	eventually(t, 2*time.Minute, func() string {
		again, _ = cluster.Get(ctx(t), n, copyClaim, "{.metadata.uid}")
		size, _ := cluster.Get(ctx(t), n, copyClaim, "{.spec.resources.requests.storage}")
		target, _ = cluster.Get(ctx(t), "", "pv/"+oldPV, "{.metadata.annotations.podvol\\.io/migration-target}")
		if again == "" || again == first || size != "3Gi" || target == "" {
			return fmt.Sprintf("the copy's claim is %q asking %q (target %q), want another than %s asking 3Gi", again, size, target, first)
		}
		return ""
	})
	// The first copy, pulled while the pod runs.
	plugin, _ := pluginContainer(t, target)
	eventually(t, 3*time.Minute, func() string {
		logs, err := cluster.RunKubectl(ctx(t), "-n", "podvol-system", "logs", plugin, "-c", "plugin")
		for _, l := range strings.Split(logs, "\n") {
			if strings.Contains(l, "Pulled a first copy of a volume in use") && strings.Contains(l, "pvc-"+again) {
				return ""
			}
		}
		return fmt.Sprintf("%s's plugin has not pulled the first copy for %s (%v):\n%s", target, again, err, lastLines(logs, 10))
	})
	exec(t, n, "db-0", "dd if=/dev/urandom of=/data/during bs=1M count=64 2>/dev/null && cd /data && sha256sum during >> sums && sync")
	sums := exec(t, n, "db-0", "cat /data/sums")

	out, err := cluster.RunKubectl(ctx(t), "drain", a.Name, "--ignore-daemonsets", "--delete-emptydir-data", "--pod-selector=app=db", "--timeout=4m")
	must(t, "drain "+a.Name+":\n"+out, err)
	eventually(t, 5*time.Minute, func() string {
		node, _ := cluster.Get(ctx(t), n, "pod/db-0", "{.spec.nodeName}")
		ready, _ := cluster.Get(ctx(t), n, "statefulset/db", "{.status.readyReplicas}")
		if node != target || ready != "1" {
			pv, _ := cluster.Get(ctx(t), "", "pv/"+oldPV, "{.metadata.annotations.podvol\\.io/migration-phase}")
			return fmt.Sprintf("db-0 is on %q (ready replicas %q), want %s; migration %s", node, ready, target, pv)
		}
		return ""
	})
	if got := exec(t, n, "db-0", "cd /data && sha256sum -c sums"); !strings.Contains(got, "before: OK") || !strings.Contains(got, "during: OK") {
		t.Fatalf("db-0's data after the move: %q (sums %q)", got, sums)
	}
	if pv := get(t, n, "pvc/data-db-0", "{.spec.volumeName}"); pv == oldPV {
		t.Fatalf("claim data-db-0 is still bound to %s", oldPV)
	}
	if size := get(t, n, "pvc/data-db-0", "{.status.capacity.storage}"); size != "3Gi" {
		t.Errorf("claim data-db-0 holds %s after the move, want the 3Gi it was expanded to", size)
	}
	logs, err := cluster.RunKubectl(ctx(t), "-n", "podvol-system", "logs", plugin, "-c", "plugin")
	must(t, "logs of "+plugin, err)
	if !strings.Contains(logs, "changesSince") || strings.Contains(logs, `changesSince=""`) {
		t.Errorf("%s's plugin did not pull the last data as changes of its first copy:\n%s", target, lastLines(logs, 20))
	}
	eventually(t, 3*time.Minute, func() string {
		if _, err := os.Stat(oldImage); !os.IsNotExist(err) {
			return fmt.Sprintf("the old volume's image %s is still there (%v)", oldImage, err)
		}
		if out, _ := cluster.RunKubectl(ctx(t), "get", "pv", oldPV, "--ignore-not-found", "-o", "name"); out != "" {
			return "the old PV is still there"
		}
		return ""
	})
}

// testBackupMoverPattern: what backup tools' data movers do (velero#7044:
// the mover hangs when its pod lands on the wrong node). A snapshot of a
// claim in one namespace is imported into another as a pre-provisioned
// VolumeSnapshotContent naming the same handle, restored there, and read
// by a mover pod with no node selector: podvol places the restore on the
// snapshot's node (a reflink), the pod follows, and it reads the data.
func testBackupMoverPattern(t *testing.T) {
	n := ns(t)
	source := writtenSnapshot(t, n, 32)
	handle := get(t, "", "volumesnapshotcontent/"+get(t, n, "volumesnapshot/snap", "{.status.boundVolumeSnapshotContentName}"), "{.status.snapshotHandle}")

	mover := nsNamed(t, n+"-mover")
	content := mover + "-snap"
	t.Cleanup(func() {
		_, _ = cluster.RunKubectl(context.Background(), "delete", "volumesnapshotcontent", content, "--ignore-not-found", "--wait=false")
	})
	apply(t, `apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotContent
metadata: {name: %[1]s}
spec:
  deletionPolicy: Retain
  driver: %[2]s
  source: {snapshotHandle: %[3]q}
  volumeSnapshotClassName: podvol
  volumeSnapshotRef: {namespace: %[4]s, name: imported}
---
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: imported, namespace: %[4]s}
spec: {volumeSnapshotClassName: podvol, source: {volumeSnapshotContentName: %[1]s}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: restored, namespace: %[4]s}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: podvol-xfs
  resources: {requests: {storage: 512Mi}}
  dataSource: {apiGroup: snapshot.storage.k8s.io, kind: VolumeSnapshot, name: imported}
---
apiVersion: v1
kind: Pod
metadata: {name: mover, namespace: %[4]s}
spec:
%[5]s`, content, names.Driver, handle, mover, devcluster.PodSpec(2, "true", "vol", "/vol", "persistentVolumeClaim: {claimName: restored}"))
	waitPod(t, mover, "mover")
	if out := exec(t, mover, "mover", "cd /vol && sha256sum -c sum"); !strings.Contains(out, "blob: OK") {
		t.Fatalf("the mover reads %q, want the snapshot's data", out)
	}
	if got := podNode(t, mover, "mover").Name; got != source.Name {
		t.Errorf("the mover runs on %s, want the snapshot's node %s (a reflink, no copy)", got, source.Name)
	}
}
