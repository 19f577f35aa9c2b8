package migration

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/podvol/podvol/internal/names"
)

// Reconcile's steps against a fake client, the PV controller's binding
// played by the test between them; test/e2e's DrainMigratesData runs the
// whole migration on a real cluster.

const (
	ns      = "team-a"
	stashNS = "podvol-system"
	claimID = types.UID("0b1c2d3e-0000-4000-8000-000000000001")
)

func node(name string, cordoned bool) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{Unschedulable: cordoned}}
}

func pvOn(name, nodeName, handle string, claimRef *corev1.ObjectReference) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			StorageClassName:              "podvol",
			ClaimRef:                      claimRef,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: names.Driver, VolumeHandle: handle}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: names.TopologyKey, Operator: corev1.NodeSelectorOpIn, Values: []string{nodeName}}}}}}},
		},
		Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeBound},
	}
}

func claim(annotations map[string]string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "data-db-0", UID: claimID, Labels: map[string]string{"app": "db"},
			Annotations: annotations},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: ptr.To("podvol"),
			VolumeName:       "pv-old",
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
		Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound},
	}
}

func capacity(nodeName, size string) *storagev1.CSIStorageCapacity {
	q := resource.MustParse(size)
	return &storagev1.CSIStorageCapacity{
		ObjectMeta:       metav1.ObjectMeta{Namespace: stashNS, Name: "cap-" + nodeName},
		StorageClassName: "podvol",
		NodeTopology:     &metav1.LabelSelector{MatchLabels: map[string]string{names.TopologyKey: nodeName}},
		Capacity:         &q,
	}
}

var optedIn = map[string]string{names.MigrateOnDrain: "true"}

type env struct {
	c   client.Client
	r   *Reconciler
	rec *events.FakeRecorder
}

func newEnv(t *testing.T, objs ...client.Object) *env {
	t.Helper()
	c := fake.NewClientBuilder().WithObjects(objs...).WithStatusSubresource(&corev1.PersistentVolumeClaim{}, &corev1.PersistentVolume{}, &corev1.Pod{}).Build()
	rec := events.NewFakeRecorder(100)
	return &env{c: c, rec: rec, r: &Reconciler{Client: c, APIReader: c, Recorder: rec, Driver: names.Driver, StashNamespace: stashNS}}
}

func (e *env) reconcile(t *testing.T) reconcile.Result {
	t.Helper()
	res, err := e.r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Name: "pv-old"}})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func (e *env) pv(t *testing.T, name string) *corev1.PersistentVolume {
	t.Helper()
	pv := &corev1.PersistentVolume{}
	if err := e.c.Get(context.Background(), client.ObjectKey{Name: name}, pv); err != nil {
		t.Fatal(err)
	}
	return pv
}

func (e *env) events() string {
	var out []string
	for {
		select {
		case ev := <-e.rec.Events:
			out = append(out, ev)
		default:
			return strings.Join(out, "\n")
		}
	}
}

var oldRef = &corev1.ObjectReference{Namespace: ns, Name: "data-db-0", UID: claimID}

// A migration starts for a bound claim that asks for it (or whose class
// does) once its node is cordoned, to the node with the most room the
// claim's pods can run on; not for a claim that does not ask, nor on a
// schedulable node; and with nowhere to go it waits, saying why.
func TestStart(t *testing.T) {
	class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "podvol"}, Provisioner: names.Driver, Parameters: map[string]string{}}
	classOptedIn := class.DeepCopy()
	classOptedIn.Parameters[names.ParamMigrateOnDrain] = "true"
	excluded := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db-0"}, Spec: corev1.PodSpec{
		NodeName: "node-a", NodeSelector: map[string]string{"disk": "fast"},
		Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data-db-0"}}}}}}
	fast := node("node-b", false)
	fast.Labels = map[string]string{"disk": "fast"}
	for _, c := range []struct {
		name   string
		objs   []client.Object
		target string
		event  string
	}{
		{"claim opted in", []client.Object{node("node-a", true), node("node-b", false), node("node-c", false), class, claim(optedIn),
			capacity("node-b", "5Gi"), capacity("node-c", "8Gi")}, "node-c", "MigrationStarted"},
		{"class opted in", []client.Object{node("node-a", true), node("node-b", false), classOptedIn, claim(nil), capacity("node-b", "5Gi")}, "node-b", "MigrationStarted"},
		{"claim opted out of its class", []client.Object{node("node-a", true), node("node-b", false), classOptedIn,
			claim(map[string]string{names.MigrateOnDrain: "false"}), capacity("node-b", "5Gi")}, "", ""},
		{"not opted in", []client.Object{node("node-a", true), node("node-b", false), class, claim(nil), capacity("node-b", "5Gi")}, "", ""},
		{"node not cordoned", []client.Object{node("node-a", false), node("node-b", false), class, claim(optedIn), capacity("node-b", "5Gi")}, "", ""},
		{"no room", []client.Object{node("node-a", true), node("node-b", false), class, claim(optedIn), capacity("node-b", "512Mi")}, "", "MigrationNoTarget"},
		{"the target cordoned too", []client.Object{node("node-a", true), node("node-b", true), class, claim(optedIn), capacity("node-b", "5Gi")}, "", "MigrationNoTarget"},
		{"the pod's selector", []client.Object{node("node-a", true), fast, node("node-c", false), class, claim(optedIn), excluded,
			capacity("node-b", "5Gi"), capacity("node-c", "8Gi")}, "node-b", "MigrationStarted"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, append(c.objs, pvOn("pv-old", "node-a", "pv-0123456789abcdef01234567", oldRef))...)
			e.reconcile(t)
			pv := e.pv(t, "pv-old")
			if got := pv.Annotations[names.MigrationTarget]; got != c.target {
				t.Fatalf("target %q, want %q (events: %s)", got, c.target, e.events())
			}
			if c.target != "" {
				if pv.Annotations[names.MigrationPhase] != names.MigrationCopying || pv.Annotations[names.MigrationClaim] != ns+"/"+CloneName(claimID) {
					t.Errorf("PV annotations %v", pv.Annotations)
				}
			}
			if ev := e.events(); !strings.Contains(ev, c.event) {
				t.Errorf("events %q, want %s", ev, c.event)
			}
		})
	}
}

func copying(target string) *corev1.PersistentVolume {
	pv := pvOn("pv-old", "node-a", "pv-0123456789abcdef01234567", oldRef)
	pv.Annotations = map[string]string{names.MigrationTarget: target, names.MigrationClaim: ns + "/" + CloneName(claimID), names.MigrationPhase: names.MigrationCopying}
	return pv
}

// While copying, the copy is a clone of the claim placed on the target,
// owned by the claim; uncordoning the node cancels the migration: the
// clone goes, and the PV's marks.
func TestCopyThenCancel(t *testing.T) {
	e := newEnv(t, node("node-a", true), node("node-b", false), claim(optedIn), copying("node-b"))
	e.reconcile(t)
	clone := &corev1.PersistentVolumeClaim{}
	if err := e.c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: CloneName(claimID)}, clone); err != nil {
		t.Fatal(err)
	}
	src := clone.Spec.DataSourceRef
	if src == nil || src.Kind != "PersistentVolumeClaim" || src.Name != "data-db-0" || clone.Annotations[names.SelectedNode] != "node-b" ||
		clone.Annotations[names.Placement] != names.PlacementScheduler || clone.Annotations[names.MigrationOf] != "pv-old" ||
		len(clone.OwnerReferences) != 1 || clone.OwnerReferences[0].UID != claimID || *clone.Spec.StorageClassName != "podvol" {
		t.Fatalf("the copy's claim: %+v", clone)
	}
	n := &corev1.Node{}
	if err := e.c.Get(context.Background(), client.ObjectKey{Name: "node-a"}, n); err != nil {
		t.Fatal(err)
	}
	n.Spec.Unschedulable = false
	if err := e.c.Update(context.Background(), n); err != nil {
		t.Fatal(err)
	}
	e.reconcile(t)
	if err := e.c.Get(context.Background(), client.ObjectKeyFromObject(clone), clone); !apierrors.IsNotFound(err) {
		t.Fatalf("the copy's claim after the node is uncordoned: %v", err)
	}
	if pv := e.pv(t, "pv-old"); len(pv.Annotations) != 0 {
		t.Errorf("the PV keeps %v", pv.Annotations)
	}
	if ev := e.events(); !strings.Contains(ev, "MigrationCancelled") {
		t.Errorf("events %q", ev)
	}
}

// Once the copy is bound, the claim is re-made bound to it: both PVs held
// at Retain, the clone's claim gone, the new PV pre-bound to the claim's
// name before the claim is deleted, the claim made again from the stash
// with its labels and annotations less those of its binding; then the new
// PV's policy is given back, and the old one's once a pod runs with the
// copy.
func TestSwitch(t *testing.T) {
	ctx := context.Background()
	old := claim(map[string]string{names.MigrateOnDrain: "true", "pv.kubernetes.io/bind-completed": "yes", "team": "a"})
	clone := (&Reconciler{}).cloneFor(copying("node-b"), old)
	clone.Spec.VolumeName = "pv-new"
	clone.Status.Phase = corev1.ClaimBound
	clone.UID = "clone-uid"
	newPV := pvOn("pv-new", "node-b", "pv-0123456789abcdef0123456f", &corev1.ObjectReference{Namespace: ns, Name: clone.Name, UID: clone.UID})
	newPV.Annotations = map[string]string{"pv.kubernetes.io/bound-by-controller": "yes"}
	pending := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db-0"}, Spec: corev1.PodSpec{
		Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data-db-0"}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodPending}}
	e := newEnv(t, node("node-a", true), node("node-b", false), old, clone, copying("node-b"), newPV, pending)

	for i := 0; i < 20; i++ {
		e.reconcile(t)
		remade := &corev1.PersistentVolumeClaim{}
		err := e.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "data-db-0"}, remade)
		if err == nil && remade.UID != claimID && remade.Status.Phase != corev1.ClaimBound {
			// The PV controller binds the claim made again.
			if remade.Spec.VolumeName != "pv-new" {
				t.Fatalf("the claim made again is bound to %q", remade.Spec.VolumeName)
			}
			pv := e.pv(t, "pv-new")
			if pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.Name != "data-db-0" || pv.Spec.ClaimRef.UID != "" {
				t.Fatalf("the new PV was not pre-bound to the claim's name: %+v", pv.Spec.ClaimRef)
			}
			if pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimRetain || e.pv(t, "pv-old").Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimRetain {
				t.Fatal("the PVs are not held at Retain during the switch")
			}
			if remade.Labels["app"] != "db" || remade.Annotations["team"] != "a" || remade.Annotations["pv.kubernetes.io/bind-completed"] != "" {
				t.Fatalf("the claim made again: labels %v annotations %v", remade.Labels, remade.Annotations)
			}
			remade.Status.Phase = corev1.ClaimBound
			if err := e.c.Status().Update(ctx, remade); err != nil {
				t.Fatal(err)
			}
		}
		if e.pv(t, "pv-old").Annotations[names.MigrationPhase] == names.MigrationSwitched {
			break
		}
	}
	if got := e.pv(t, "pv-old").Annotations[names.MigrationPhase]; got != names.MigrationSwitched {
		t.Fatalf("phase %q after the switch's steps (events: %s)", got, e.events())
	}
	if err := e.c.Get(ctx, client.ObjectKeyFromObject(clone), &corev1.PersistentVolumeClaim{}); !apierrors.IsNotFound(err) {
		t.Errorf("the copy's claim: %v, want it gone", err)
	}
	if p := e.pv(t, "pv-new").Spec.PersistentVolumeReclaimPolicy; p != corev1.PersistentVolumeReclaimDelete {
		t.Errorf("the new PV's policy is %s, want Delete back", p)
	}
	stashes := &corev1.ConfigMapList{}
	if err := e.c.List(ctx, stashes, client.InNamespace(stashNS)); err != nil || len(stashes.Items) != 0 {
		t.Errorf("stashes left: %v (%v)", stashes.Items, err)
	}
	// The old volume waits for a pod running with the copy.
	e.reconcile(t)
	if p := e.pv(t, "pv-old").Spec.PersistentVolumeReclaimPolicy; p != corev1.PersistentVolumeReclaimRetain {
		t.Fatalf("the old PV's policy is %s before a pod runs with the copy", p)
	}
	pod := &corev1.Pod{}
	if err := e.c.Get(ctx, client.ObjectKeyFromObject(pending), pod); err != nil {
		t.Fatal(err)
	}
	pod.Spec.NodeName = "node-b"
	if err := e.c.Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	pod.Status.Phase = corev1.PodRunning
	if err := e.c.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	e.reconcile(t)
	if p := e.pv(t, "pv-old").Spec.PersistentVolumeReclaimPolicy; p != corev1.PersistentVolumeReclaimDelete {
		t.Fatalf("the old PV's policy is %s once the pod runs with the copy, want Delete back", p)
	}
}

// A switch re-binds only the copy migration made: a PV named as the
// migration's volume that is bound to another claim is left alone.
func TestSwitchRefusesAnotherPV(t *testing.T) {
	pv := copying("node-b")
	pv.Annotations[names.MigrationPhase] = names.MigrationSwitching
	pv.Annotations[names.MigrationVolume] = "pv-other"
	other := pvOn("pv-other", "node-b", "pv-0123456789abcdef0123456f", &corev1.ObjectReference{Namespace: "team-b", Name: "secrets", UID: "u2"})
	e := newEnv(t, node("node-a", true), node("node-b", false), claim(optedIn), pv, other)
	_, err := e.r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Name: "pv-old"}})
	if err == nil || !strings.Contains(err.Error(), "not the copy") {
		t.Fatalf("switch to another claim's PV: %v", err)
	}
	got := e.pv(t, "pv-other")
	if got.Spec.ClaimRef.Name != "secrets" || got.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete {
		t.Fatalf("the other PV was changed: %+v", got.Spec)
	}
}

// A claim its user deleted during the switch is not made again: the copy's
// PV is pointed at the deleted claim (released, then deleted by its
// policy), both PVs get their policies back, the stash goes.
func TestSwitchDoesNotBringBackADeletedClaim(t *testing.T) {
	ctx := context.Background()
	pv := copying("node-b")
	pv.Annotations[names.MigrationPhase] = names.MigrationSwitching
	pv.Annotations[names.MigrationVolume] = "pv-new"
	pv.Annotations[names.MigrationReclaim] = "Delete"
	pv.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimRetain
	newPV := pvOn("pv-new", "node-b", "pv-0123456789abcdef0123456f", &corev1.ObjectReference{Namespace: ns, Name: "data-db-0"})
	newPV.Annotations = map[string]string{names.MigratedFrom: "pv-old", names.MigrationReclaim: "Delete"}
	newPV.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimRetain
	stash := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: stashNS, Name: stashName("pv-old"),
		Annotations: map[string]string{names.StashClaim: ns + "/data-db-0", names.StashOldUID: string(claimID)}},
		Data: map[string]string{stashKey: `{"metadata":{"namespace":"team-a","name":"data-db-0"},"spec":{"volumeName":"pv-new"}}`}}
	e := newEnv(t, node("node-a", true), node("node-b", false), pv, newPV, stash)
	for range 3 {
		e.reconcile(t)
	}
	if err := e.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "data-db-0"}, &corev1.PersistentVolumeClaim{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the claim its user deleted: %v, want it not made again", err)
	}
	got := e.pv(t, "pv-new")
	if got.Spec.ClaimRef.UID != claimID || got.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete {
		t.Errorf("the copy's PV: claimRef %+v, policy %s; want it pointed at the deleted claim, Delete", got.Spec.ClaimRef, got.Spec.PersistentVolumeReclaimPolicy)
	}
	if p := e.pv(t, "pv-old").Spec.PersistentVolumeReclaimPolicy; p != corev1.PersistentVolumeReclaimDelete {
		t.Errorf("the old PV's policy is %s, want Delete back", p)
	}
	if err := e.c.Get(ctx, client.ObjectKeyFromObject(stash), &corev1.ConfigMap{}); !apierrors.IsNotFound(err) {
		t.Errorf("the stash: %v, want it gone", err)
	}
}

// A copy its target gave back (external-provisioner removes the selected
// node when the node has no room after all) is given up, so that the
// migration starts again on a node chosen anew.
func TestCopyGivenBackStartsAgain(t *testing.T) {
	old := claim(optedIn)
	clone := (&Reconciler{}).cloneFor(copying("node-b"), old)
	delete(clone.Annotations, names.SelectedNode)
	e := newEnv(t, node("node-a", true), node("node-b", false), old, clone, copying("node-b"))
	e.reconcile(t)
	if err := e.c.Get(context.Background(), client.ObjectKeyFromObject(clone), &corev1.PersistentVolumeClaim{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the copy given back: %v, want it deleted", err)
	}
	if pv := e.pv(t, "pv-old"); pv.Annotations[names.MigrationTarget] != "" {
		t.Errorf("the PV keeps its target: %v", pv.Annotations)
	}
}

// Only a change of a Node's cordon wakes the PVs on it: the status
// updates its kubelet makes every few seconds do not.
func TestCordonChanged(t *testing.T) {
	for _, c := range []struct {
		old, new bool
		want     bool
	}{{false, true, true}, {true, false, true}, {false, false, false}, {true, true, false}} {
		e := event.UpdateEvent{ObjectOld: node("node-a", c.old), ObjectNew: node("node-a", c.new)}
		if got := cordonChanged.Update(e); got != c.want {
			t.Errorf("unschedulable %v -> %v: %v, want %v", c.old, c.new, got, c.want)
		}
	}
}

// A switch read from a cache that lags abandons nothing: the claim the
// switch itself deleted (recorded on the PV, which the cache does not show
// yet) is not taken for one its user deleted, so the copy's PV is neither
// pointed at the old claim (released, then deleted) nor the stash dropped.
func TestSwitchOnALaggingCacheAbandonsNothing(t *testing.T) {
	ctx := context.Background()
	cached := copying("node-b")
	cached.Annotations[names.MigrationPhase] = names.MigrationSwitching
	cached.Annotations[names.MigrationVolume] = "pv-new"
	cached.Annotations[names.MigrationReclaim] = "Delete"
	cached.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimRetain
	live := cached.DeepCopy()
	live.Annotations[names.MigrationClaimDeleted] = string(claimID)
	live.ResourceVersion = "1000"
	newPV := pvOn("pv-new", "node-b", "pv-0123456789abcdef0123456f", &corev1.ObjectReference{Namespace: ns, Name: "data-db-0"})
	newPV.Annotations = map[string]string{names.MigratedFrom: "pv-old", names.MigrationReclaim: "Delete"}
	newPV.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimRetain
	stash := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: stashNS, Name: stashName("pv-old"),
		Annotations: map[string]string{names.StashClaim: ns + "/data-db-0", names.StashOldUID: string(claimID)}},
		Data: map[string]string{stashKey: `{"metadata":{"namespace":"team-a","name":"data-db-0"},"spec":{"volumeName":"pv-new"}}`}}
	e := newEnv(t, node("node-a", true), node("node-b", false), cached, newPV, stash)
	e.r.APIReader = fake.NewClientBuilder().WithObjects(live, newPV.DeepCopy()).Build()
	e.reconcile(t)
	got := e.pv(t, "pv-new")
	if got.Spec.ClaimRef.UID != "" || got.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimRetain {
		t.Fatalf("the copy's PV after a switch read from a lagging cache: claimRef %+v, policy %s; want it still pre-bound, Retain (events: %s)",
			got.Spec.ClaimRef, got.Spec.PersistentVolumeReclaimPolicy, e.events())
	}
	if err := e.c.Get(ctx, client.ObjectKeyFromObject(stash), &corev1.ConfigMap{}); err != nil {
		t.Fatalf("the stash: %v, want it kept", err)
	}
}
