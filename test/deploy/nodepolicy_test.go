package deploy

import (
	"fmt"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

const provisionerFinalizer = "external-provisioner.volume.kubernetes.io/finalizer"

// pv is a PersistentVolume as external-provisioner makes it for podvol: one
// node selector term per topology segment, topology.podvol.io/node In
// [node] (no term when nodes is empty).
func pv(name, driver string, nodes ...string) *corev1.PersistentVolume {
	p := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{"pv.kubernetes.io/provisioned-by": driver}},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			StorageClassName:              "podvol",
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: driver, VolumeHandle: "pv-" + strings.Repeat("0", 24), FSType: "ext4"}},
			ClaimRef: &corev1.ObjectReference{APIVersion: "v1", Kind: "PersistentVolumeClaim", Namespace: "tenant", Name: name},
		},
	}
	if len(nodes) > 0 {
		var terms []corev1.NodeSelectorTerm
		for _, n := range nodes {
			terms = append(terms, corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{
				{Key: "topology.podvol.io/node", Operator: corev1.NodeSelectorOpIn, Values: []string{n}}}})
		}
		p.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: terms}}
	}
	return p
}

var dryRun = metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}

// waitForPolicies waits until every policy refuses a request it exists to
// refuse (dry runs: nothing is written), and until RBAC lets podvol-node make
// a request the policies allow. Policies take a moment to load. If they
// never refuse (no policy applied), that is an error, and the tests go on to
// show what is then allowed.
func (e *env) waitForPolicies(t *testing.T) {
	t.Helper()
	mustAdmin := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	// Fixtures of the probes (admin-made, so not policy-checked).
	_, err := e.admin.kc.CoreV1().PersistentVolumeClaims("tenant").Create(bg, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "probe", Annotations: map[string]string{"volume.kubernetes.io/storage-provisioner": "podvol.io"}},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: ptr.To("podvol"),
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}},
	}, metav1.CreateOptions{})
	mustAdmin(err)
	_, err = e.admin.dyn.Resource(vscGVR).Create(bg, vsc("probe", "node-a"), metav1.CreateOptions{})
	mustAdmin(err)

	probes := map[string]func() error{
		"rbac: node-a creates its own PV (dry run)": func() error {
			_, err := e.nodeA.kc.CoreV1().PersistentVolumes().Create(bg, pv("probe-a", "podvol.io", "node-a"), dryRun)
			return err
		},
		"podvol-node-persistentvolumes": func() error {
			_, err := e.nodeB.kc.CoreV1().PersistentVolumes().Create(bg, pv("probe-b", "podvol.io", "node-a"), dryRun)
			return refusal(err)
		},
		"podvol-node-claims": func() error {
			c, err := e.admin.kc.CoreV1().PersistentVolumeClaims("tenant").Get(bg, "probe", metav1.GetOptions{})
			if err != nil {
				return err
			}
			c.Labels = map[string]string{"probe": "x"}
			_, err = e.nodeB.kc.CoreV1().PersistentVolumeClaims("tenant").Update(bg, c, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
			return refusal(err)
		},
		"podvol-node-snapshots": func() error {
			_, err := e.nodeB.dyn.Resource(vscGVR).Patch(bg, "probe", types.MergePatchType,
				[]byte(`{"metadata":{"annotations":{"probe":"x"}}}`), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
			return refusal(err)
		},
		"podvol-node-capacity": func() error {
			_, err := e.nodeB.kc.StorageV1().CSIStorageCapacities(namespace).Create(bg, capacity("probe", "node-a"), dryRun)
			return refusal(err)
		},
		"podvol-node-leases": func() error {
			_, err := e.nodeB.kc.CoordinationV1().Leases(namespace).Create(bg, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "probe"}}, dryRun)
			return refusal(err)
		},
	}
	start := time.Now()
	pending := map[string]error{}
	for name := range probes {
		pending[name] = nil
	}
	_ = eventually(time.Minute, func() error {
		for name, f := range probes {
			if _, ok := pending[name]; !ok {
				continue
			}
			if err := f(); err != nil {
				pending[name] = err
			} else {
				delete(pending, name)
			}
		}
		if len(pending) > 0 {
			return fmt.Errorf("%d pending", len(pending))
		}
		return nil
	})
	for name, err := range pending {
		t.Errorf("after %v, %s: still %v", time.Since(start).Round(time.Second), name, err)
	}
	if len(pending) == 0 {
		t.Logf("RBAC and all policies active after %v", time.Since(start).Round(100*time.Millisecond))
	}

	e.typeChecked(t, e.policies)
}

// typeChecked: kube-controller-manager type-checks each policy's
// validations (not its variables, which only the tests' requests exercise)
// against the types it matches; a warning means an expression names a field
// that does not exist or compares what cannot be equal.
func (e *env) typeChecked(t *testing.T, policies []*unstructured.Unstructured) {
	t.Helper()
	for _, p := range policies {
		if p.GetKind() != "ValidatingAdmissionPolicy" {
			continue
		}
		var status map[string]any
		err := eventually(30*time.Second, func() error {
			u, err := e.admin.dyn.Resource(vapGVR).Get(bg, p.GetName(), metav1.GetOptions{})
			if err != nil {
				return err
			}
			observed, _, _ := unstructured.NestedInt64(u.Object, "status", "observedGeneration")
			if observed < u.GetGeneration() {
				return fmt.Errorf("not type-checked yet")
			}
			status, _, _ = unstructured.NestedMap(u.Object, "status")
			return nil
		})
		if err != nil {
			t.Errorf("policy %s: %v", p.GetName(), err)
			continue
		}
		warnings, _, _ := unstructured.NestedSlice(status, "typeChecking", "expressionWarnings")
		for _, w := range warnings {
			t.Errorf("policy %s: type checking: %v", p.GetName(), w)
		}
	}
}

// refusal is nil when err is a policy's refusal.
func refusal(err error) error {
	if refusedByPolicy(err) {
		return nil
	}
	if err == nil {
		return fmt.Errorf("not refused")
	}
	return err
}

func capacity(name, node string) *storagev1.CSIStorageCapacity {
	return &storagev1.CSIStorageCapacity{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			"csi.storage.k8s.io/drivername": "podvol.io", "csi.storage.k8s.io/managed-by": "external-provisioner-" + node}},
		NodeTopology:     &metav1.LabelSelector{MatchLabels: map[string]string{"topology.podvol.io/node": node}},
		StorageClassName: "podvol",
		Capacity:         ptr.To(resource.MustParse("20Gi")),
	}
}

// vsc is a VolumeSnapshotContent as snapshot-controller makes it with
// distributed snapshotting: labelled with the node of its source volume.
func vsc(name, node string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
		"metadata": map[string]any{"name": name, "labels": map[string]any{"snapshot.storage.kubernetes.io/managed-by": node}},
		"spec": map[string]any{
			"driver": "podvol.io", "deletionPolicy": "Delete", "volumeSnapshotClassName": "podvol",
			"source":            map[string]any{"volumeHandle": "pv-" + strings.Repeat("1", 24)},
			"volumeSnapshotRef": map[string]any{"namespace": "tenant", "name": name},
		},
	}}
}

// TestNode: podvol-node's RBAC is what its DaemonSet calls; its policies
// let it write PVs, PVCs, snapshots, capacity and its Lease only as its own
// node's sidecars do, and leave other users alone.
func TestNode(t *testing.T) {
	e := start(t)
	t.Run("RBAC", e.testRBAC)
	t.Run("ControllerRBAC", e.testControllerRBAC)
	t.Run("PoliciesActive", e.waitForPolicies)
	t.Run("PersistentVolumes", e.testPersistentVolumes)
	t.Run("Claims", e.testClaims)
	t.Run("Snapshots", e.testSnapshots)
	t.Run("Capacity", e.testCapacity)
	t.Run("Leases", e.testLeases)
}
