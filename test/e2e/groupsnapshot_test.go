package e2e

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/podvol/podvol/internal/devcluster"
)

// testGroupSnapshot: a VolumeGroupSnapshot of a pod's two claims is one
// instant of both. The pod writes a counter to volume a, then the same
// value to volume b, in a loop, so that b is never ahead of a on disk; the
// group is taken while it runs, and the restored pair must hold b <= a (two
// single snapshots, one after the other, would catch b ahead: the plugin's
// group consistency test shows that control). The group's content is
// routed to the pod's node, its members' contents too, and the restores
// land on that node.
func testGroupSnapshot(t *testing.T) {
	n := ns(t)
	for _, c := range []string{"a", "b"} {
		pvc(t, n, c, "podvol-xfs", "512Mi", "")
		must(t, "label claim "+c, func() error {
			_, err := cluster.RunKubectl(ctx(t), "-n", n, "label", "pvc", c, "group=db")
			return err
		}())
	}
	// Each volume says which it is; then the loop: a first, then b. Each
	// counter is written aside and renamed over the last: a file rewritten
	// in place is empty between its truncation and its write, and a
	// snapshot may catch it there, which tells nothing of the group.
	twoClaimPod(t, n, "db", "echo a > /a/name && echo b > /b/name && i=0 && (while true; do i=$((i+1)); echo $i > /a/n.new; mv /a/n.new /a/n; echo $i > /b/n.new; mv /b/n.new /b/n; done) &", "a", "b")
	waitPod(t, n, "db")
	node := podNode(t, n, "db")
	eventually(t, time.Minute, func() string {
		if v := exec(t, n, "db", "cat /b/n 2>/dev/null; true"); v == "" || v == "0" {
			return "the writer has not started: b holds " + v
		}
		return ""
	})

	apply(t, `apiVersion: groupsnapshot.storage.k8s.io/v1
kind: VolumeGroupSnapshot
metadata: {name: db, namespace: %s}
spec:
  volumeGroupSnapshotClassName: podvol
  source: {selector: {matchLabels: {group: db}}}
`, n)
	eventually(t, 3*time.Minute, func() string {
		if r, _ := cluster.Get(ctx(t), n, "volumegroupsnapshot/db", "{.status.readyToUse}"); r != "true" {
			ev, _ := cluster.RunKubectl(ctx(t), "-n", n, "get", "events", "--field-selector", "involvedObject.name=db", "-o", "custom-columns=R:.reason,M:.message", "--no-headers")
			return "group snapshot not ready: " + r + "\n" + ev
		}
		return ""
	})
	content := get(t, n, "volumegroupsnapshot/db", "{.status.boundVolumeGroupSnapshotContentName}")
	if l := get(t, "", "volumegroupsnapshotcontent/"+content, `{.metadata.labels.snapshot\.storage\.kubernetes\.io/managed-by}`); l != node.Name {
		t.Errorf("group content %s is labelled for node %q, want the pod's node %s", content, l, node.Name)
	}

	// Its members: one VolumeSnapshot per claim, made by snapshot-controller,
	// each ready; restore each into a claim and read both in one pod.
	var members []string
	eventually(t, 2*time.Minute, func() string {
		out, _ := cluster.RunKubectl(ctx(t), "-n", n, "get", "volumesnapshot", "-o",
			`jsonpath={range .items[?(@.metadata.ownerReferences[0].kind=="VolumeGroupSnapshot")]}{.metadata.name}={.status.readyToUse}{"\n"}{end}`)
		members = members[:0]
		for _, l := range strings.Fields(out) {
			name, ready, _ := strings.Cut(l, "=")
			if ready != "true" {
				return "member snapshot " + name + " not ready"
			}
			members = append(members, name)
		}
		if len(members) != 2 {
			return "members: " + out
		}
		return ""
	})
	for i, m := range members {
		c := "r" + strconv.Itoa(i)
		pvc(t, n, c, "podvol-xfs", "512Mi", "  dataSource: {apiGroup: snapshot.storage.k8s.io, kind: VolumeSnapshot, name: "+m+"}\n")
	}
	twoClaimPod(t, n, "reader", "true", "r0", "r1")
	waitPod(t, n, "reader")
	if got := podNode(t, n, "reader"); got != node {
		t.Errorf("the restores run on %s; the group's node is %s", got.Name, node.Name)
	}
	val := map[string]int{}
	for _, r := range []string{"/r0", "/r1"} {
		name := exec(t, n, "reader", "cat "+r+"/name")
		v, err := strconv.Atoi(exec(t, n, "reader", "cat "+r+"/n"))
		if err != nil {
			t.Fatalf("%s (volume %s) holds no counter: %v", r, name, err)
		}
		val[name] = v
	}
	t.Logf("restored group: a=%d b=%d", val["a"], val["b"])
	if len(val) != 2 || val["a"] < 1 || val["b"] < 1 {
		t.Fatalf("restored volumes %v: want a and b, each with a counter", val)
	}
	if val["b"] > val["a"] {
		t.Fatalf("restored group has b=%d ahead of a=%d: the members were not captured at one instant", val["b"], val["a"])
	}
	deletePod(t, n, "db")
	deletePod(t, n, "reader")
	must(t, "delete the group snapshot", func() error {
		_, err := cluster.RunKubectl(ctx(t), "-n", n, "delete", "volumegroupsnapshot", "db", "--wait=true", "--timeout=2m")
		return err
	}())
	eventually(t, 2*time.Minute, func() string {
		if out, _ := cluster.RunKubectl(ctx(t), "get", "volumegroupsnapshotcontent", content, "--ignore-not-found", "-o", "name"); out != "" {
			return "group content " + content + " still there after its group snapshot was deleted"
		}
		return ""
	})
}

// twoClaimPod runs script in a pod with claims x and y at /x and /y.
func twoClaimPod(t *testing.T, ns, name, script, x, y string) {
	t.Helper()
	apply(t, `apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: %s
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", %q]
    readinessProbe: {exec: {command: [test, -e, /tmp/ready]}, periodSeconds: 1}
    volumeMounts: [{name: %s, mountPath: /%s}, {name: %s, mountPath: /%s}]
  volumes:
  - {name: %s, persistentVolumeClaim: {claimName: %s}}
  - {name: %s, persistentVolumeClaim: {claimName: %s}}
`, name, ns, devcluster.Image, script+"\ntouch /tmp/ready && exec sleep 36000", x, x, y, y, x, x, y, y)
}
