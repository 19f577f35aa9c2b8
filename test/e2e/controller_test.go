package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/podvol/podvol/internal/names"
)

// testEphemeralCloneResetsOnDetach: a PVC that is a clone of a golden volume
// is written by a pod; once the pod is gone, the next pod gets a fresh clone
// with the golden data and none of the old writes.
func testEphemeralCloneResetsOnDetach(t *testing.T) {
	n := ns(t)
	pvc(t, n, "golden", "podvol", "128Mi", "")
	pod(t, n, "seed", "echo golden > /vol/f && sync", "persistentVolumeClaim: {claimName: golden}")
	waitPod(t, n, "seed")
	deletePod(t, n, "seed")
	apply(t, `apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: work
  namespace: %s
  annotations: {podvol.io/lifecycle: reset-on-detach}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: podvol
  resources: {requests: {storage: 128Mi}}
  dataSource: {kind: PersistentVolumeClaim, name: golden}
`, n)
	pod(t, n, "user", "true", "persistentVolumeClaim: {claimName: work}")
	waitPod(t, n, "user")
	if got := exec(t, n, "user", "cat /vol/f"); got != "golden" {
		t.Fatalf("clone holds %q", got)
	}
	exec(t, n, "user", "echo dirty > /vol/f && sync")
	uid := get(t, n, "pvc/work", "{.metadata.uid}")
	deletePod(t, n, "user")
	eventually(t, 3*time.Minute, func() string {
		if got, _ := cluster.Get(ctx(t), n, "pvc/work", "{.metadata.uid}/{.metadata.annotations.podvol\\.io/reset-count}"); got == "" || strings.HasPrefix(got, uid) || !strings.HasSuffix(got, "/1") {
			return "PVC work not reset yet: " + got
		}
		return ""
	})
	pod(t, n, "next", "true", "persistentVolumeClaim: {claimName: work}")
	waitPod(t, n, "next")
	if got := exec(t, n, "next", "cat /vol/f"); got != "golden" {
		t.Fatalf("the next pod sees %q, want a fresh clone of the golden volume", got)
	}
	if ev, _ := cluster.RunKubectl(ctx(t), "-n", n, "get", "events", "--field-selector", "involvedObject.name=work", "-o", "jsonpath={.items[*].reason}"); !strings.Contains(ev, "ResetOnDetach") {
		t.Fatalf("no ResetOnDetach event on the PVC: %s", ev)
	}
}

// testPodvolEphemeralController: generic ephemeral volumes are served by
// podvol-controller (kube-controller-manager's is off in the dev cluster).
func testPodvolEphemeralController(t *testing.T) {
	n := ns(t)
	pod(t, n, "p", "true", ephemeralVolume)
	waitPod(t, n, "p")
	// At the pod's address, with a token, as Prometheus scrapes it.
	name := get(t, "podvol-system", "pods", "{.items[?(@.metadata.labels.app\\.kubernetes\\.io/component==\"controller\")].metadata.name}")
	ip := get(t, "podvol-system", "pod/"+name, "{.status.podIP}")
	out, err := cluster.Nodes[0].FetchMetrics(ctx(t), "https://"+ip+":9809"+names.MetricsPath)
	must(t, "scrape podvol-controller", err)
	b := []byte(out)
	if !strings.Contains(string(b), "podvol_ephemeral_volume_controller_create_total") || strings.Contains(string(b), "podvol_ephemeral_volume_controller_create_total 0\n") {
		t.Fatalf("podvol-controller created no PVC:\n%s", grepLines(string(b), "podvol_ephemeral"))
	}
	if !strings.Contains(string(b), "workqueue_depth{controller=\"ephemeral-volume\"") {
		t.Fatal("no workqueue metrics for the ephemeral volume controller")
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// testAdmissionPolicy: a user who may create pods but not PVCs cannot get a
// podvol PVC through a pod's ephemeral volume; one who may create PVCs can.
func testAdmissionPolicy(t *testing.T) {
	n := ns(t)
	users(t, n, "alice", "bob")
	manifest := "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: " + n + "}\nspec:\n" + podSpecYAML(ephemeralVolume)
	try := func(user string) (string, error) {
		f := t.TempDir() + "/pod.yaml"
		must(t, "write", writeString(f, manifest))
		return cluster.RunKubectl(ctx(t), "--as", user, "create", "--dry-run=server", "-f", f)
	}
	// The authorizer learns of new bindings through its own watch: bob's
	// success shows they have arrived.
	eventually(t, time.Minute, func() string {
		if out, err := try("bob"); err != nil {
			return fmt.Sprintf("bob (PVC rights) was refused: %v\n%s", err, out)
		}
		return ""
	})
	out, err := try("alice")
	if err == nil || !strings.Contains(out, "may not create PersistentVolumeClaims") {
		t.Fatalf("alice (no PVC rights) was not refused: %v\n%s", err, out)
	}
	// And a PVC of the directAssign class must be ReadWriteOncePod.
	f := t.TempDir() + "/pvc.yaml"
	must(t, "write", writeString(f, "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: d, namespace: "+n+"}\nspec:\n  accessModes: [ReadWriteOnce]\n  storageClassName: podvol-direct\n  resources: {requests: {storage: 64Mi}}\n"))
	if out, err := cluster.RunKubectl(ctx(t), "create", "--dry-run=server", "-f", f); err == nil || !strings.Contains(out, "ReadWriteOncePod") {
		t.Fatalf("a non-RWOP PVC of podvol-direct was admitted: %v\n%s", err, out)
	}
}
