package deploy

import (
	"encoding/json"
	"slices"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	coordinationclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/utils/ptr"

	"github.com/podvol/podvol/internal/mobility"
	"github.com/podvol/podvol/internal/names"
)

// twoWay is the strategic merge patch from before to after, as the sidecars
// compute theirs (external-resizer's GetPatchData, the provisioner
// library's finalizer patch).
func twoWay(t *testing.T, before, after, kind any) []byte {
	t.Helper()
	o, err := json.Marshal(before)
	if err != nil {
		t.Fatal(err)
	}
	n, err := json.Marshal(after)
	if err != nil {
		t.Fatal(err)
	}
	p, err := strategicpatch.CreateTwoWayMergePatch(o, n, kind)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func without(list []string, s string) []string {
	var out []string
	for _, x := range list {
		if x != s {
			out = append(out, x)
		}
	}
	return out
}

func (e *env) testPersistentVolumes(t *testing.T) {
	get := func(name string) *corev1.PersistentVolume {
		p, err := e.admin.kc.CoreV1().PersistentVolumes().Get(bg, name, metav1.GetOptions{})
		must(t, err)
		return p
	}
	create := func(id *identity, p *corev1.PersistentVolume) error {
		_, err := id.kc.CoreV1().PersistentVolumes().Create(bg, p, metav1.CreateOptions{})
		return err
	}
	patch := func(id *identity, name string, change func(*corev1.PersistentVolume)) error {
		old := get(name)
		n := old.DeepCopy()
		change(n)
		_, err := id.kc.CoreV1().PersistentVolumes().Patch(bg, name, types.StrategicMergePatchType, twoWay(t, old, n, &corev1.PersistentVolume{}), metav1.PatchOptions{})
		return err
	}
	del := func(id *identity, name string) error {
		return id.kc.CoreV1().PersistentVolumes().Delete(bg, name, metav1.DeleteOptions{})
	}
	addFinalizer := func(p *corev1.PersistentVolume) { p.Finalizers = append(p.Finalizers, provisionerFinalizer) }
	dropFinalizer := func(p *corev1.PersistentVolume) { p.Finalizers = without(p.Finalizers, provisionerFinalizer) }
	size := func(s string) func(*corev1.PersistentVolume) {
		return func(p *corev1.PersistentVolume) { p.Spec.Capacity[corev1.ResourceStorage] = resource.MustParse(s) }
	}

	// node-a's external-provisioner provisions on node-a.
	allowed(t, e.nodeA, "create a podvol PV of node-a", create(e.nodeA, pv("pv-a", "podvol.io", "node-a")))
	allowed(t, e.nodeA, "add external-provisioner's finalizer to its PV", patch(e.nodeA, "pv-a", addFinalizer))

	// Not on another node, not for another driver, not without a node.
	refused(t, e.nodeB, "create a podvol PV of node-a", create(e.nodeB, pv("pv-b-for-a", "podvol.io", "node-a")),
		"on node node-b may create only", "is on node-a")
	refused(t, e.nodeA, "create a podvol PV of node-a or node-b", create(e.nodeA, pv("pv-two", "podvol.io", "node-a", "node-b")),
		"is on node-a or node-b")
	refused(t, e.nodeA, "create a podvol PV without node affinity", create(e.nodeA, pv("pv-anywhere", "podvol.io")),
		"no topology.podvol.io/node")
	refused(t, e.nodeA, "create a PV of another driver on node-a", create(e.nodeA, pv("pv-other", "other.example.com", "node-a")),
		"is of other.example.com")
	refused(t, e.unbound, "create a podvol PV of node-a", create(e.unbound, pv("pv-unbound", "podvol.io", "node-a")),
		"names no node", "authentication.kubernetes.io/node-name")

	// external-resizer, one instance on any node (here node-b), grows
	// node-a's PV; it may do nothing else to it.
	allowed(t, e.nodeB, "grow node-a's PV, as external-resizer does", patch(e.nodeB, "pv-a", func(p *corev1.PersistentVolume) {
		size("2Gi")(p)
		metav1.SetMetaDataAnnotation(&p.ObjectMeta, "volume.alpha.kubernetes.io/pre-resize-capacity", "1Gi")
	}))
	allowed(t, e.nodeB, "remove the pre-resize-capacity annotation of node-a's PV", patch(e.nodeB, "pv-a", func(p *corev1.PersistentVolume) {
		delete(p.Annotations, "volume.alpha.kubernetes.io/pre-resize-capacity")
	}))
	refused(t, e.nodeB, "shrink node-a's PV", patch(e.nodeB, "pv-a", size("1Gi")), "grow its capacity", "is on node-a")
	refused(t, e.nodeB, "bind node-a's PV to another claim", patch(e.nodeB, "pv-a", func(p *corev1.PersistentVolume) {
		p.Spec.ClaimRef = &corev1.ObjectReference{APIVersion: "v1", Kind: "PersistentVolumeClaim", Namespace: "attacker", Name: "loot"}
	}), "is on node-a")
	refused(t, e.nodeB, "set node-a's PV to Retain", patch(e.nodeB, "pv-a", func(p *corev1.PersistentVolume) {
		p.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimRetain
	}), "is on node-a")
	refused(t, e.nodeB, "label node-a's PV", patch(e.nodeB, "pv-a", func(p *corev1.PersistentVolume) {
		metav1.SetMetaDataLabel(&p.ObjectMeta, "x", "y")
	}), "is on node-a")
	refused(t, e.nodeB, "remove external-provisioner's finalizer from node-a's PV (reclaim policy Delete)",
		patch(e.nodeB, "pv-a", dropFinalizer), "is on node-a")
	refused(t, e.nodeB, "delete node-a's PV", del(e.nodeB, "pv-a"), "on node node-b may delete only", "is on node-a")
	refused(t, e.unbound, "grow node-a's PV", patch(e.unbound, "pv-a", size("3Gi")), "names no node")

	// A migration's marks are podvol-controller's, even on a node's own PV.
	refused(t, e.nodeA, "mark its own PV for a migration", patch(e.nodeA, "pv-a", func(p *corev1.PersistentVolume) {
		metav1.SetMetaDataAnnotation(&p.ObjectMeta, names.MigrationTarget, "node-b")
	}), "migration marks")
	refused(t, e.nodeA, "create a PV marked as a migration's", create(e.nodeA, func() *corev1.PersistentVolume {
		p := pv("pv-a-marked", "podvol.io", "node-a")
		metav1.SetMetaDataAnnotation(&p.ObjectMeta, names.MigratedFrom, "pv-x")
		return p
	}()), "migration marks")
	must(t, patch(e.admin, "pv-a", func(p *corev1.PersistentVolume) {
		metav1.SetMetaDataAnnotation(&p.ObjectMeta, names.MigrationPhase, names.MigrationCopying)
	}))
	refused(t, e.nodeA, "change a migration's phase on its own PV", patch(e.nodeA, "pv-a", func(p *corev1.PersistentVolume) {
		p.Annotations[names.MigrationPhase] = names.MigrationSwitching
	}), "migration marks")
	refused(t, e.nodeA, "remove a migration's phase from its own PV", patch(e.nodeA, "pv-a", func(p *corev1.PersistentVolume) {
		delete(p.Annotations, names.MigrationPhase)
	}), "migration marks")
	allowed(t, e.nodeA, "add its finalizer to its own PV under migration", patch(e.nodeA, "pv-a", func(p *corev1.PersistentVolume) {
		metav1.SetMetaDataAnnotation(&p.ObjectMeta, "other", "x")
	}))
	must(t, patch(e.admin, "pv-a", func(p *corev1.PersistentVolume) { delete(p.Annotations, names.MigrationPhase) }))

	// Every node's external-provisioner adds its finalizer to bound PVs
	// reclaimed by deletion and removes it from the others, whatever their
	// node.
	_, err := e.admin.kc.CoreV1().PersistentVolumes().Create(bg, pv("pv-a2", "podvol.io", "node-a"), metav1.CreateOptions{})
	must(t, err)
	allowed(t, e.nodeB, "add external-provisioner's finalizer to node-a's PV", patch(e.nodeB, "pv-a2", addFinalizer))
	must(t, patch(e.admin, "pv-a2", func(p *corev1.PersistentVolume) {
		p.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimRetain
	}))
	allowed(t, e.nodeB, "remove external-provisioner's finalizer from node-a's PV (reclaim policy Retain)", patch(e.nodeB, "pv-a2", dropFinalizer))

	// On its own node, anything: deleting, then removing the finalizer
	// from the PV being deleted, as the provisioner library does.
	allowed(t, e.nodeA, "delete its PV", del(e.nodeA, "pv-a"))
	allowed(t, e.nodeA, "remove its finalizer from its PV being deleted", patch(e.nodeA, "pv-a", dropFinalizer))

	// What counts is the node the API server authenticated.
	allowed(t, e.impersonated, "create a podvol PV of node-a", create(e.impersonated, pv("pv-imp", "podvol.io", "node-a")))
	refused(t, e.impersonated, "create a podvol PV of node-b", create(e.impersonated, pv("pv-imp-b", "podvol.io", "node-b")),
		"on node node-a may create only", "is on node-b")

	// Other users are not concerned.
	allowed(t, e.admin, "create a podvol PV of node-b", create(e.admin, pv("pv-admin-b", "podvol.io", "node-b")))
	allowed(t, e.admin, "create a PV of another driver without node affinity", create(e.admin, pv("pv-admin-other", "other.example.com")))
	allowed(t, e.admin, "change anything of a podvol PV", patch(e.admin, "pv-admin-b", func(p *corev1.PersistentVolume) {
		p.Spec.ClaimRef.Name = "other"
		metav1.SetMetaDataLabel(&p.ObjectMeta, "x", "y")
	}))
	allowed(t, e.admin, "delete a podvol PV of node-b", del(e.admin, "pv-admin-b"))
}

func (e *env) testClaims(t *testing.T) {
	claims := e.admin.kc.CoreV1().PersistentVolumeClaims("tenant")
	for name, provisioner := range map[string]string{"data": "podvol.io", "foreign": "other.example.com"} {
		_, err := claims.Create(bg, &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{
				"volume.kubernetes.io/storage-provisioner": provisioner, "volume.beta.kubernetes.io/storage-provisioner": provisioner}},
			Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: ptr.To("podvol"),
				Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}},
		}, metav1.CreateOptions{})
		must(t, err)
	}
	// The provisioner updates the whole claim it read.
	update := func(id *identity, name string, change func(*corev1.PersistentVolumeClaim)) error {
		c, err := claims.Get(bg, name, metav1.GetOptions{})
		must(t, err)
		change(c)
		_, err = id.kc.CoreV1().PersistentVolumeClaims("tenant").Update(bg, c, metav1.UpdateOptions{})
		return err
	}
	// The resizer patches the status (util.PatchClaim).
	patchStatus := func(id *identity, name string, change func(*corev1.PersistentVolumeClaim)) error {
		old, err := claims.Get(bg, name, metav1.GetOptions{})
		must(t, err)
		n := old.DeepCopy()
		change(n)
		_, err = id.kc.CoreV1().PersistentVolumeClaims("tenant").Patch(bg, name, types.StrategicMergePatchType,
			twoWay(t, old, n, &corev1.PersistentVolumeClaim{}), metav1.PatchOptions{}, "status")
		return err
	}
	const sel = "volume.kubernetes.io/selected-node"
	const clone = "provisioner.storage.kubernetes.io/cloning-protection"
	selectNode := func(n string) func(*corev1.PersistentVolumeClaim) {
		return func(c *corev1.PersistentVolumeClaim) { metav1.SetMetaDataAnnotation(&c.ObjectMeta, sel, n) }
	}
	unselect := func(c *corev1.PersistentVolumeClaim) { delete(c.Annotations, sel) }

	// external-provisioner's becomeOwner (Immediate binding) and
	// rescheduleProvisioning, on its own node only.
	allowed(t, e.nodeA, "take a podvol claim for node-a", update(e.nodeA, "data", selectNode("node-a")))
	refused(t, e.nodeB, "take node-a's claim for node-b", update(e.nodeB, "data", selectNode("node-b")),
		"only as node-b", "is selected for node node-a, asked: node-b")
	refused(t, e.nodeB, "hand node-a's claim back to the scheduler", update(e.nodeB, "data", unselect),
		"is selected for node node-a, asked: (none)")
	allowed(t, e.nodeA, "hand its claim back to the scheduler", update(e.nodeA, "data", unselect))
	refused(t, e.nodeA, "take a claim of another driver", update(e.nodeA, "foreign", selectNode("node-a")), "is not for podvol.io")
	refused(t, e.unbound, "take a podvol claim", update(e.unbound, "data", selectNode("node-a")), "names no node")

	// The cloning-protection finalizer on a clone's source; nothing else.
	allowed(t, e.nodeB, "protect a clone's source", update(e.nodeB, "data", func(c *corev1.PersistentVolumeClaim) {
		c.Finalizers = append(c.Finalizers, clone)
	}))
	allowed(t, e.nodeA, "release a clone's source", update(e.nodeA, "data", func(c *corev1.PersistentVolumeClaim) {
		c.Finalizers = without(c.Finalizers, clone)
	}))
	refused(t, e.nodeA, "add another finalizer", update(e.nodeA, "data", func(c *corev1.PersistentVolumeClaim) {
		c.Finalizers = append(c.Finalizers, "example.com/hold")
	}), "changes more")
	refused(t, e.nodeA, "remove pvc-protection", update(e.nodeA, "data", func(c *corev1.PersistentVolumeClaim) {
		c.Finalizers = without(c.Finalizers, "kubernetes.io/pvc-protection")
	}), "changes more")
	refused(t, e.nodeA, "label a claim", update(e.nodeA, "data", func(c *corev1.PersistentVolumeClaim) {
		metav1.SetMetaDataLabel(&c.ObjectMeta, "x", "y")
	}), "changes more")
	refused(t, e.nodeA, "annotate a claim", update(e.nodeA, "data", func(c *corev1.PersistentVolumeClaim) {
		metav1.SetMetaDataAnnotation(&c.ObjectMeta, "volume.kubernetes.io/storage-provisioner", "other.example.com")
	}), "changes more")

	// external-resizer's status patches of a bound podvol claim.
	for _, name := range []string{"data", "foreign"} {
		c, err := claims.Get(bg, name, metav1.GetOptions{})
		must(t, err)
		c.Status = corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound, AccessModes: c.Spec.AccessModes,
			Capacity: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}
		_, err = claims.UpdateStatus(bg, c, metav1.UpdateOptions{})
		must(t, err)
	}
	resizing := func(c *corev1.PersistentVolumeClaim) {
		c.Status.Conditions = []corev1.PersistentVolumeClaimCondition{{Type: corev1.PersistentVolumeClaimResizing, Status: corev1.ConditionTrue,
			LastTransitionTime: metav1.Now()}}
		c.Status.AllocatedResources = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("2Gi")}
		c.Status.AllocatedResourceStatuses = map[corev1.ResourceName]corev1.ClaimResourceStatus{
			corev1.ResourceStorage: corev1.PersistentVolumeClaimControllerResizeInProgress}
	}
	allowed(t, e.nodeB, "mark a podvol claim's resize in progress", patchStatus(e.nodeB, "data", resizing))
	allowed(t, e.nodeB, "mark a podvol claim's node expansion pending", patchStatus(e.nodeB, "data", func(c *corev1.PersistentVolumeClaim) {
		c.Status.Conditions = []corev1.PersistentVolumeClaimCondition{{Type: corev1.PersistentVolumeClaimFileSystemResizePending,
			Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
		c.Status.AllocatedResourceStatuses = map[corev1.ResourceName]corev1.ClaimResourceStatus{
			corev1.ResourceStorage: corev1.PersistentVolumeClaimNodeResizePending}
	}))
	refused(t, e.nodeB, "mark a podvol claim Lost", patchStatus(e.nodeB, "data", func(c *corev1.PersistentVolumeClaim) {
		c.Status.Phase = corev1.ClaimLost
	}), "changes more")
	refused(t, e.nodeB, "label a claim through its status", patchStatus(e.nodeB, "data", func(c *corev1.PersistentVolumeClaim) {
		metav1.SetMetaDataLabel(&c.ObjectMeta, "x", "y")
	}), "changes more")
	refused(t, e.nodeB, "remove pvc-protection through the status", patchStatus(e.nodeB, "data", func(c *corev1.PersistentVolumeClaim) {
		c.Finalizers = without(c.Finalizers, "kubernetes.io/pvc-protection")
	}), "changes more")
	refused(t, e.nodeB, "mark another driver's claim resizing", patchStatus(e.nodeB, "foreign", resizing), "not provisioned by podvol.io")
	refused(t, e.unbound, "mark a podvol claim resizing", patchStatus(e.unbound, "data", resizing), "names no node")

	// A restore's or clone's node says its data is in (the plugin's own
	// patch); the same patch cannot reach a claim made again.
	copied := func(id *identity, name, uid string) error {
		patch, err := mobility.DataCopiedPatch(uid, "1 GiB of snapshot snap-x pulled from node node-b in 9s and verified")
		must(t, err)
		_, err = id.kc.CoreV1().PersistentVolumeClaims("tenant").Patch(bg, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
		return err
	}
	data, err := claims.Get(bg, "data", metav1.GetOptions{})
	must(t, err)
	allowed(t, e.nodeA, "say a podvol claim's data is copied", copied(e.nodeA, "data", string(data.UID)))
	// Merged by type: the resizer's condition set above stays beside it.
	data, err = claims.Get(bg, "data", metav1.GetOptions{})
	must(t, err)
	var have []string
	for _, c := range data.Status.Conditions {
		have = append(have, string(c.Type))
	}
	if !slices.Contains(have, names.DataCopied) || !slices.Contains(have, string(corev1.PersistentVolumeClaimFileSystemResizePending)) {
		t.Errorf("the claim's conditions after the patch: %v, want %s beside the resizer's", have, names.DataCopied)
	}
	if err := copied(e.nodeA, "data", "another-uid"); err == nil {
		t.Error("node-a set the condition of a claim of another UID")
	}
	refused(t, e.nodeA, "say another driver's claim's data is copied", copied(e.nodeA, "foreign", ""), "not provisioned by podvol.io")

	// Other users are not concerned.
	allowed(t, e.admin, "label a claim and select any node", update(e.admin, "foreign", func(c *corev1.PersistentVolumeClaim) {
		metav1.SetMetaDataLabel(&c.ObjectMeta, "x", "y")
		metav1.SetMetaDataAnnotation(&c.ObjectMeta, sel, "node-b")
	}))
	allowed(t, e.admin, "mark a claim Lost", patchStatus(e.admin, "foreign", func(c *corev1.PersistentVolumeClaim) {
		c.Status.Phase = corev1.ClaimLost
	}))
}

func (e *env) testSnapshots(t *testing.T) {
	vs := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
		"metadata": map[string]any{"name": "snap", "namespace": "tenant"},
		"spec":     map[string]any{"volumeSnapshotClassName": "podvol", "source": map[string]any{"persistentVolumeClaimName": "data"}},
	}}
	_, err := e.admin.dyn.Resource(vsGVR).Namespace("tenant").Create(bg, vs, metav1.CreateOptions{})
	must(t, err)
	for name, node := range map[string]string{"content-a": "node-a", "content-b": "node-b"} {
		_, err := e.admin.dyn.Resource(vscGVR).Create(bg, vsc(name, node), metav1.CreateOptions{})
		must(t, err)
	}
	// The provisioner updates the whole VolumeSnapshot it read.
	updateVS := func(id *identity, change func(u *unstructured.Unstructured)) error {
		u, err := e.admin.dyn.Resource(vsGVR).Namespace("tenant").Get(bg, "snap", metav1.GetOptions{})
		must(t, err)
		change(u)
		_, err = id.dyn.Resource(vsGVR).Namespace("tenant").Update(bg, u, metav1.UpdateOptions{})
		return err
	}
	const protect = "provisioner.storage.kubernetes.io/volumesnapshot-as-source-protection"
	allowed(t, e.nodeA, "protect a restore's source snapshot", updateVS(e.nodeA, func(u *unstructured.Unstructured) {
		u.SetFinalizers(append(u.GetFinalizers(), protect))
	}))
	allowed(t, e.nodeB, "release it (orphan sweep: any node)", updateVS(e.nodeB, func(u *unstructured.Unstructured) {
		u.SetFinalizers(without(u.GetFinalizers(), protect))
	}))
	refused(t, e.nodeA, "label a VolumeSnapshot", updateVS(e.nodeA, func(u *unstructured.Unstructured) {
		u.SetLabels(map[string]string{"x": "y"})
	}), "changes more")
	refused(t, e.nodeA, "add another finalizer to a VolumeSnapshot", updateVS(e.nodeA, func(u *unstructured.Unstructured) {
		u.SetFinalizers(append(u.GetFinalizers(), "example.com/hold"))
	}), "changes more")
	refused(t, e.nodeA, "point a VolumeSnapshot at another class", updateVS(e.nodeA, func(u *unstructured.Unstructured) {
		_ = unstructured.SetNestedField(u.Object, "other", "spec", "volumeSnapshotClassName")
	}), "changes more")

	// csi-snapshotter patches its node's contents (JSON patches) and their
	// status.
	patchVSC := func(id *identity, name, patch string, sub ...string) error {
		_, err := id.dyn.Resource(vscGVR).Patch(bg, name, types.JSONPatchType, []byte(patch), metav1.PatchOptions{}, sub...)
		return err
	}
	const annotate = `[{"op":"add","path":"/metadata/annotations","value":{"snapshot.storage.kubernetes.io/volumesnapshot-being-created":"yes"}}]`
	const ready = `[{"op":"add","path":"/status","value":{"readyToUse":true,"snapshotHandle":"snap-1@node-a","restoreSize":1073741824}}]`
	allowed(t, e.nodeA, "annotate its node's snapshot content", patchVSC(e.nodeA, "content-a", annotate))
	allowed(t, e.nodeA, "set its node's snapshot content ready", patchVSC(e.nodeA, "content-a", ready, "status"))
	refused(t, e.nodeA, "annotate node-b's snapshot content", patchVSC(e.nodeA, "content-b", annotate), "is managed by node-b")
	refused(t, e.nodeA, "set node-b's snapshot content ready (another snapshot handle)", patchVSC(e.nodeA, "content-b", ready, "status"),
		"is managed by node-b")
	refused(t, e.nodeA, "hand its snapshot content to node-b",
		patchVSC(e.nodeA, "content-a", `[{"op":"replace","path":"/metadata/labels/snapshot.storage.kubernetes.io~1managed-by","value":"node-b"}]`),
		"asked: node-b")
	refused(t, e.unbound, "annotate node-a's snapshot content", patchVSC(e.unbound, "content-a", annotate), "names no node")
	allowed(t, e.admin, "set any snapshot content's status", patchVSC(e.admin, "content-b", ready, "status"))

	e.testSnapshotHandles(t, patchVSC)
}

// testSnapshotHandles: a content's handle is what a restore of it gets (the
// transfer source's authorizer, source-placement and external-provisioner
// read it). Issue 41: node-1's token rewrote the handle of a content it
// manages to name node-2, another id on node-2, and another id on node-1;
// all three were accepted. A node sets it once, naming itself (or, for a
// content made for an existing snapshot, as its spec says), and changes or
// removes it never (but on a content being deleted, once its snapshot is).
func (e *env) testSnapshotHandles(t *testing.T, patchVSC func(id *identity, name, patch string, sub ...string) error) {
	setHandle := func(h string) string {
		return `[{"op":"add","path":"/status","value":{"readyToUse":true,"snapshotHandle":"` + h + `"}}]`
	}
	changeHandle := func(h string) string {
		return `[{"op":"replace","path":"/status/snapshotHandle","value":"` + h + `"}]`
	}
	const removeHandle = `[{"op":"remove","path":"/status/snapshotHandle"}]`
	imported := vsc("content-imported", "node-a")
	must(t, unstructured.SetNestedField(imported.Object, map[string]any{"snapshotHandle": "snap-7@node-a"}, "spec", "source"))
	deleting := vsc("content-deleting", "node-a")
	deleting.SetFinalizers([]string{"example.com/hold"})
	for _, u := range []*unstructured.Unstructured{vsc("content-fresh", "node-a"), vsc("content-fresh2", "node-a"), imported, deleting} {
		_, err := e.admin.dyn.Resource(vscGVR).Create(bg, u, metav1.CreateOptions{})
		must(t, err)
	}

	refused(t, e.nodeA, "set its content's handle to node-b's snapshot", patchVSC(e.nodeA, "content-fresh", setHandle("snap-2@node-b"), "status"),
		"only once, to a handle naming its own node", "asked: snap-2@node-b")
	refused(t, e.nodeA, "set its content's handle to one naming no node", patchVSC(e.nodeA, "content-fresh", setHandle("snap-2"), "status"),
		"asked: snap-2")
	refused(t, e.nodeA, "set its content's handle to one naming node-a only as a suffix", patchVSC(e.nodeA, "content-fresh", setHandle("snap-2@xnode-a"), "status"),
		"asked: snap-2@xnode-a")
	allowed(t, e.nodeA, "set its content's handle to its own snapshot", patchVSC(e.nodeA, "content-fresh", setHandle("snap-2@node-a"), "status"))
	refused(t, e.nodeA, "change its content's handle to another id of its own", patchVSC(e.nodeA, "content-fresh", changeHandle("snap-3@node-a"), "status"),
		"has snap-2@node-a, asked: snap-3@node-a")
	refused(t, e.nodeA, "change its content's handle to node-b's snapshot", patchVSC(e.nodeA, "content-fresh", changeHandle("snap-2@node-b"), "status"),
		"has snap-2@node-a, asked: snap-2@node-b")
	refused(t, e.nodeA, "remove its content's handle", patchVSC(e.nodeA, "content-fresh", removeHandle, "status"),
		"has snap-2@node-a, asked: (none)")
	allowed(t, e.nodeA, "mark its content ready again, the handle kept (csi-snapshotter's status patch)",
		patchVSC(e.nodeA, "content-fresh", `[{"op":"replace","path":"/status/readyToUse","value":false}]`, "status"))
	// Through an update of the whole object, as UpdateStatus does.
	u, err := e.admin.dyn.Resource(vscGVR).Get(bg, "content-fresh2", metav1.GetOptions{})
	must(t, err)
	must(t, unstructured.SetNestedField(u.Object, "snap-4@node-b", "status", "snapshotHandle"))
	_, err = e.nodeA.dyn.Resource(vscGVR).UpdateStatus(bg, u, metav1.UpdateOptions{})
	refused(t, e.nodeA, "UpdateStatus its content with node-b's snapshot", err, "asked: snap-4@node-b")

	refused(t, e.nodeA, "set an imported content's handle to another than its spec's", patchVSC(e.nodeA, "content-imported", setHandle("snap-8@node-a"), "status"),
		"spec.source handle", "asked: snap-8@node-a")
	allowed(t, e.nodeA, "set an imported content's handle to its spec's", patchVSC(e.nodeA, "content-imported", setHandle("snap-7@node-a"), "status"))

	// csi-snapshotter clears the handle once it deleted the snapshot of a
	// content being deleted, then drops its finalizer.
	allowed(t, e.nodeA, "set the handle of a content to be deleted", patchVSC(e.nodeA, "content-deleting", setHandle("snap-5@node-a"), "status"))
	must(t, e.admin.dyn.Resource(vscGVR).Delete(bg, "content-deleting", metav1.DeleteOptions{}))
	allowed(t, e.nodeA, "remove the handle of its content being deleted", patchVSC(e.nodeA, "content-deleting", removeHandle, "status"))
	_, err = e.admin.dyn.Resource(vscGVR).Patch(bg, "content-deleting", types.JSONPatchType, []byte(`[{"op":"remove","path":"/metadata/finalizers"}]`), metav1.PatchOptions{})
	must(t, err)

	e.testGroupSnapshotHandles(t)
}

// testGroupSnapshotHandles: snapshot-controller makes a group's members'
// contents, their handles, their volumes and the group handle their node is
// read from all copied from the group content's status, which the group's
// node writes: the same rule holds there.
func (e *env) testGroupSnapshotHandles(t *testing.T) {
	const vol1, vol2, other = "pv-111111111111111111111111", "pv-222222222222222222222222", "pv-333333333333333333333333"
	group := func(name string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "groupsnapshot.storage.k8s.io/v1", "kind": "VolumeGroupSnapshotContent",
			"metadata": map[string]any{"name": name, "labels": map[string]any{"snapshot.storage.kubernetes.io/managed-by": "node-a"}},
			"spec": map[string]any{"driver": "podvol.io", "deletionPolicy": "Delete", "volumeGroupSnapshotClassName": "podvol",
				"source":                 map[string]any{"volumeHandles": []any{vol1, vol2}},
				"volumeGroupSnapshotRef": map[string]any{"namespace": "tenant", "name": name}},
		}}
	}
	for _, name := range []string{"group-a", "group-b"} {
		_, err := e.admin.dyn.Resource(vgscGVR).Create(bg, group(name), metav1.CreateOptions{})
		must(t, err)
	}
	status := func(id *identity, name, handle string, members ...[2]string) error {
		var list []map[string]any
		for _, m := range members {
			list = append(list, map[string]any{"volumeHandle": m[0], "snapshotHandle": m[1], "readyToUse": true})
		}
		b, err := json.Marshal([]map[string]any{{"op": "add", "path": "/status", "value": map[string]any{
			"volumeGroupSnapshotHandle": handle, "readyToUse": true, "volumeSnapshotInfoList": list}}})
		must(t, err)
		_, err = id.dyn.Resource(vgscGVR).Patch(bg, name, types.JSONPatchType, b, metav1.PatchOptions{}, "status")
		return err
	}
	refused(t, e.nodeA, "name node-b as its group's node", status(e.nodeA, "group-a", "group-1@node-b",
		[2]string{vol1, "snap-1@node-a"}), "asked: group-1@node-b")
	refused(t, e.nodeA, "list node-b's snapshot as a member of its group", status(e.nodeA, "group-a", "group-1@node-a",
		[2]string{vol1, "snap-1@node-a"}, [2]string{vol2, "snap-2@node-b"}), "each a snapshot naming its own node")
	refused(t, e.nodeA, "list a member of a volume not in its group", status(e.nodeA, "group-a", "group-1@node-a",
		[2]string{other, "snap-1@node-a"}), "spec.source.volumeHandles")
	allowed(t, e.nodeA, "complete its group", status(e.nodeA, "group-a", "group-1@node-a",
		[2]string{vol1, "snap-1@node-a"}, [2]string{vol2, "snap-2@node-a"}))
	_, err := e.nodeA.dyn.Resource(vgscGVR).Patch(bg, "group-a", types.JSONPatchType,
		[]byte(`[{"op":"replace","path":"/status/volumeSnapshotInfoList/1/snapshotHandle","value":"snap-3@node-a"}]`), metav1.PatchOptions{}, "status")
	refused(t, e.nodeA, "change a member of its group", err, "never change them")
}

func (e *env) testCapacity(t *testing.T) {
	api := func(id *identity) capacityAPI { return capacityAPI{id} }
	mine := capacity("", "node-a")
	mine.GenerateName = "csisc-"
	created, err := e.nodeA.kc.StorageV1().CSIStorageCapacities(namespace).Create(bg, mine, metav1.CreateOptions{})
	allowed(t, e.nodeA, "publish its node's capacity", err)
	if err != nil {
		created, err = e.admin.kc.StorageV1().CSIStorageCapacities(namespace).Create(bg, mine, metav1.CreateOptions{})
		must(t, err)
	}
	name := created.Name
	refused(t, e.nodeA, "publish capacity for node-b", api(e.nodeA).create(capacity("for-b", "node-b")), "is for topology.podvol.io/node=node-b")
	anyNode := capacity("anywhere", "node-a")
	anyNode.NodeTopology = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: "topology.podvol.io/node", Operator: metav1.LabelSelectorOpExists}}}
	refused(t, e.nodeA, "publish capacity for every node", api(e.nodeA).create(anyNode), "is for (not a single node)")
	refused(t, e.unbound, "publish capacity for node-a", api(e.unbound).create(capacity("unbound", "node-a")), "names no node")
	allowed(t, e.nodeA, "update its node's capacity", api(e.nodeA).resize(t, e, name, "10Gi"))
	refused(t, e.nodeB, "update node-a's capacity", api(e.nodeB).resize(t, e, name, "0"), "is for topology.podvol.io/node=node-a")
	refused(t, e.nodeB, "delete node-a's capacity", api(e.nodeB).delete(name), "is for topology.podvol.io/node=node-a")
	allowed(t, e.nodeA, "delete its node's capacity", api(e.nodeA).delete(name))
	allowed(t, e.admin, "publish capacity for any node", api(e.admin).create(anyNode))
}

type capacityAPI struct{ id *identity }

func (c capacityAPI) create(o *storagev1.CSIStorageCapacity) error {
	_, err := c.id.kc.StorageV1().CSIStorageCapacities(namespace).Create(bg, o, metav1.CreateOptions{})
	return err
}

func (c capacityAPI) resize(t *testing.T, e *env, name, size string) error {
	o, err := e.admin.kc.StorageV1().CSIStorageCapacities(namespace).Get(bg, name, metav1.GetOptions{})
	must(t, err)
	o.Capacity = ptr.To(resource.MustParse(size))
	_, err = c.id.kc.StorageV1().CSIStorageCapacities(namespace).Update(bg, o, metav1.UpdateOptions{})
	return err
}

func (c capacityAPI) delete(name string) error {
	return c.id.kc.StorageV1().CSIStorageCapacities(namespace).Delete(bg, name, metav1.DeleteOptions{})
}

func (e *env) testLeases(t *testing.T) {
	leases := func(id *identity) leaseAPI { return leaseAPI{id.kc.CoordinationV1().Leases(namespace)} }
	lease := func(name, holder string) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder),
			LeaseDurationSeconds: ptr.To[int32](15), RenewTime: ptr.To(metav1.NewMicroTime(metav1.Now().Time))}}
	}
	const mine = "external-resizer-podvol-io"
	_, err := leases(e.nodeA).Create(bg, lease(mine, "node-a"), metav1.CreateOptions{})
	allowed(t, e.nodeA, "create external-resizer's Lease", err)
	allowed(t, e.nodeB, "take external-resizer's Lease over", leases(e.nodeB).takeOver(mine, "node-b"))
	_, err = leases(e.nodeA).Create(bg, lease("podvol-controller", "node-a"), metav1.CreateOptions{})
	refused(t, e.nodeA, "create podvol-controller's Lease", err, "may only hold Lease external-resizer-podvol-io")
	_, err = leases(e.admin).Create(bg, lease("podvol-controller", "controller"), metav1.CreateOptions{})
	must(t, err)
	forbiddenByRBAC(t, e.nodeA, "take podvol-controller's Lease over", leases(e.nodeA).takeOver("podvol-controller", "node-a"))
	refused(t, e.unbound, "take external-resizer's Lease over", leases(e.unbound).takeOver(mine, "stolen"), "names no node")
}

type leaseAPI struct {
	coordinationclient.LeaseInterface
}

// takeOver is client-go's LeaseLock: get, then update the holder.
func (l leaseAPI) takeOver(name, holder string) error {
	o, err := l.Get(bg, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	o.Spec.HolderIdentity = ptr.To(holder)
	o.Spec.AcquireTime = ptr.To(metav1.NewMicroTime(metav1.Now().Time))
	_, err = l.Update(bg, o, metav1.UpdateOptions{})
	return err
}
