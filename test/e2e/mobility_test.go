package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

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
	pvc(t, n, "data", "podvol-xfs", "512Mi", "")
	pod(t, n, "writer", "dd if=/dev/urandom of=/vol/blob bs=1M count=64 2>/dev/null && cd /vol && sha256sum blob > sum && sync",
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
	apply(t, `apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: restored
  namespace: %s
  annotations: {%s: %s}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: podvol-xfs
  resources: {requests: {storage: 512Mi}}
  dataSource: {apiGroup: snapshot.storage.k8s.io, kind: VolumeSnapshot, name: snap}
`, n, names.Placement, names.PlacementScheduler)
	apply(t, "apiVersion: v1\nkind: Pod\nmetadata: {name: reader, namespace: %s}\nspec:\n  nodeSelector: {%s: %s}\n%s",
		n, names.TopologyKey, other, podSpecYAML("persistentVolumeClaim: {claimName: restored}"))
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
