package deploy

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/podvol/podvol/internal/controller/admissionparams"
	"github.com/podvol/podvol/internal/names"
)

// TestPlacementGate: deploy/base/placement-policy.yaml gives an unbound
// restore or clone of a podvol WaitForFirstConsumer class the selected node
// that no node is, at creation and again when a provisioner removes it, so
// that kube-scheduler cannot choose a node for its pod (and provision the
// pod's other claims there) before source-placement has placed it. Claims
// without a source, of other classes, already placed or left to the
// scheduler, and bound ones, are left as they are.
func TestPlacementGate(t *testing.T) {
	e := start(t)
	kc := e.admin.kc
	for name, c := range map[string]struct {
		prov string
		mode storagev1.VolumeBindingMode
	}{
		"podvol":      {names.Driver, storagev1.VolumeBindingWaitForFirstConsumer},
		"local-fast":  {names.Driver, storagev1.VolumeBindingWaitForFirstConsumer},
		"podvol-now":  {names.Driver, storagev1.VolumeBindingImmediate},
		"network-ssd": {"other.example.com", storagev1.VolumeBindingWaitForFirstConsumer},
	} {
		if _, err := kc.StorageV1().StorageClasses().Create(bg, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name},
			Provisioner: c.prov, VolumeBindingMode: ptr.To(c.mode)}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	apply(t, e.ac, manifest(t, "PODVOL_PLACEMENT_POLICY", "placement-policy.yaml"))
	apply(t, e.ac, manifest(t, "PODVOL_ADMISSION_POLICY", "admission-policy.yaml"))
	e.admissionParams(t)
	// local-fast is placed by its provisioner and binding mode; the
	// Immediate class is not (source-placement leaves it alone).
	e.params(t, map[string]string{admissionparams.PlacedClasses: "local-fast podvol"})

	pvcs := kc.CoreV1().PersistentVolumeClaims("tenant")
	snapshot := &corev1.TypedObjectReference{APIGroup: ptr.To("snapshot.storage.k8s.io"), Kind: "VolumeSnapshot", Name: "snap"}
	clone := &corev1.TypedObjectReference{Kind: "PersistentVolumeClaim", Name: "src"}
	claim := func(name, class string, ref *corev1.TypedObjectReference, ann map[string]string) *corev1.PersistentVolumeClaim {
		c := claimTemplate(name, ptr.To(class), ann)
		c.Spec.DataSourceRef = ref
		return &c
	}
	selected := func(name string) string {
		t.Helper()
		c, err := pvcs.Get(bg, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return c.Annotations[names.SelectedNode]
	}

	// The policy is in effect, with the parameters podvol-controller
	// wrote, once a probe restore of local-fast gets the placeholder.
	n := 0
	began := time.Now()
	err := eventually(time.Minute, func() error {
		n++
		c, err := pvcs.Create(bg, claim(fmt.Sprintf("probe-%d", n), "local-fast", snapshot, nil), dryRun)
		if err != nil {
			return err
		}
		if got := c.Annotations[names.SelectedNode]; got != names.AwaitingPlacement {
			return fmt.Errorf("a restore was admitted with selected node %q", got)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("after %v: the placement policy never took effect: %v", time.Since(began).Round(time.Second), err)
	}

	for _, c := range []struct {
		what string
		pvc  *corev1.PersistentVolumeClaim
		want string
	}{
		{"a restore of a podvol class", claim("restore", "podvol", snapshot, nil), names.AwaitingPlacement},
		{"a clone of a podvol class added by an admin", claim("clone", "local-fast", clone, nil), names.AwaitingPlacement},
		{"a new claim (no source)", claim("new", "podvol", nil, nil), ""},
		{"a restore of another driver's class", claim("other", "network-ssd", snapshot, nil), ""},
		{"a restore of a podvol Immediate class", claim("now", "podvol-now", snapshot, nil), ""},
		{"a restore of another kind of source", claim("populated", "podvol", &corev1.TypedObjectReference{APIGroup: ptr.To("example.com"), Kind: "Populator", Name: "p"}, nil), ""},
		{"a restore already placed", claim("placed", "podvol", snapshot, map[string]string{names.SelectedNode: "node-a"}), "node-a"},
		{"a restore left to the scheduler", claim("scheduler", "podvol", snapshot, map[string]string{names.Placement: names.PlacementScheduler}), ""},
		{"a restore whose class is named by the beta annotation", claim("beta", "network-ssd", snapshot, map[string]string{"volume.beta.kubernetes.io/storage-class": "podvol"}), names.AwaitingPlacement},
	} {
		if _, err := pvcs.Create(bg, c.pvc, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create %s: %v", c.what, err)
		}
		if got := selected(c.pvc.Name); got != c.want {
			t.Errorf("%s: selected node %q, want %q", c.what, got, c.want)
		}
	}

	// Placed by source-placement: kept. Given back by the node's
	// provisioner (the annotation removed): the placeholder again.
	patch := func(name, p string) {
		t.Helper()
		if _, err := pvcs.Patch(bg, name, types.MergePatchType, []byte(p), metav1.PatchOptions{}); err != nil {
			t.Fatalf("patch %s %s: %v", name, p, err)
		}
	}
	// (With the provisioner's annotation, as the PV controller sets it.)
	patch("restore", `{"metadata":{"annotations":{"`+names.SelectedNode+`":"node-a","`+names.SourceNode+`":"node-a","volume.kubernetes.io/storage-provisioner":"`+names.Driver+`"}}}`)
	if got := selected("restore"); got != "node-a" {
		t.Fatalf("a placed restore has selected node %q after placement, want node-a", got)
	}
	// Given back by node-a's external-provisioner (RESOURCE_EXHAUSTED: an
	// update of the whole claim without the annotation), as node-a: the
	// node policy lets a node hand its claim back, and the placeholder
	// this policy puts in its place is no node's either.
	c, err := pvcs.Get(bg, "restore", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	delete(c.Annotations, names.SelectedNode)
	_, err = e.nodeA.kc.CoreV1().PersistentVolumeClaims("tenant").Update(bg, c, metav1.UpdateOptions{})
	allowed(t, e.nodeA, "give back a restore placed on it", err)
	if got := selected("restore"); got != names.AwaitingPlacement {
		t.Fatalf("a restore given back has selected node %q, want %q", got, names.AwaitingPlacement)
	}
	// And no further: the placeholder is not a node to take it for.
	c, err = pvcs.Get(bg, "restore", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.Annotations[names.SelectedNode] = "node-b"
	_, err = e.nodeA.kc.CoreV1().PersistentVolumeClaims("tenant").Update(bg, c, metav1.UpdateOptions{})
	if !refusedByPolicy(err) {
		t.Errorf("node-a moved a restore given back to node-b: %v", err)
	}
	// Bound: left alone.
	patch("clone", `{"spec":{"volumeName":"pv-1"}}`)
	patch("clone", `{"metadata":{"annotations":{"`+names.SelectedNode+`":null}}}`)
	if got := selected("clone"); got != "" {
		t.Fatalf("a bound clone was given selected node %q", got)
	}
}
