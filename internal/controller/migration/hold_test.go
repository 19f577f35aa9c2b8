package migration

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/podvol/podvol/internal/names"
)

// The holds of a drain on a migration, against a fake client; test/
// controller's TestMigrationHolds runs them on a real API server, and e2e
// DrainMigratesData stops the node once its drain returns.

type holdEnv struct {
	c   client.Client
	h   *Holds
	rec *events.FakeRecorder
}

func newHoldEnv(t *testing.T, objs ...client.Object) *holdEnv {
	t.Helper()
	c := fake.NewClientBuilder().WithObjects(objs...).WithStatusSubresource(&corev1.PersistentVolumeClaim{}, &corev1.Pod{}).Build()
	rec := events.NewFakeRecorder(100)
	return &holdEnv{c: c, rec: rec, h: &Holds{Client: c, Recorder: rec, Driver: names.Driver}}
}

func (e *holdEnv) reconcile(t *testing.T) reconcile.Result {
	t.Helper()
	res, err := e.h.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: "db-0"}})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// pod is db-0, using data-db-0, on the node.
func pod(node string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db-0", UID: "pod-uid", Labels: map[string]string{"app": "db"}},
		Spec: corev1.PodSpec{NodeName: node,
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data-db-0"}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning}}
}

func (e *holdEnv) pod(t *testing.T) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{}
	err := e.c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "db-0"}, p)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// evict deletes the pod as an eviction does: it stays while a finalizer
// holds it.
func (e *holdEnv) evict(t *testing.T) {
	t.Helper()
	if err := e.c.Delete(context.Background(), e.pod(t)); err != nil {
		t.Fatal(err)
	}
}

func (e *holdEnv) pdb(t *testing.T) *policyv1.PodDisruptionBudget {
	t.Helper()
	p := &policyv1.PodDisruptionBudget{}
	err := e.c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: PDBName("pod-uid")}, p)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (e *holdEnv) setPhase(t *testing.T, phase string) {
	t.Helper()
	pv := &corev1.PersistentVolume{}
	if err := e.c.Get(context.Background(), client.ObjectKey{Name: "pv-old"}, pv); err != nil {
		t.Fatal(err)
	}
	if phase == "" {
		pv.Annotations = nil
	} else {
		pv.Annotations[names.MigrationPhase] = phase
	}
	if err := e.c.Update(context.Background(), pv); err != nil {
		t.Fatal(err)
	}
}

func migrating(started time.Time) *corev1.PersistentVolume {
	pv := copying("node-b")
	pv.Annotations[names.MigrationStarted] = started.UTC().Format(time.RFC3339)
	return pv
}

func isHeld(p *corev1.Pod) bool {
	return p != nil && controllerutil.ContainsFinalizer(p, names.MigrationFinalizer)
}

// A running pod of a claim opted in carries the finalizer before any
// drain, one of a claim not opted in does not, and a claim that opts out
// lets its pods go.
func TestHoldsArmPodsOfClaimsOptedIn(t *testing.T) {
	class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "podvol"}, Provisioner: names.Driver}
	e := newHoldEnv(t, node("node-a", false), class, claim(optedIn), pvOn("pv-old", "node-a", "pv-0123456789abcdef01234567", oldRef), pod("node-a"))
	e.reconcile(t)
	if !isHeld(e.pod(t)) {
		t.Fatalf("the pod of a claim opted in has finalizers %v", e.pod(t).Finalizers)
	}
	pvc := &corev1.PersistentVolumeClaim{}
	if err := e.c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "data-db-0"}, pvc); err != nil {
		t.Fatal(err)
	}
	pvc.Annotations[names.MigrateOnDrain] = "false"
	if err := e.c.Update(context.Background(), pvc); err != nil {
		t.Fatal(err)
	}
	e.reconcile(t)
	if isHeld(e.pod(t)) {
		t.Fatal("the pod keeps the finalizer after its claim opted out")
	}
	// Not opted in at all: an ordinary deletion is never held.
	e.evict(t)
	if e.pod(t) != nil {
		t.Fatal("a pod of a claim not opted in was held")
	}
}

// An evicted pod's deletion waits while its volume's migration copies
// and ends once the copy is bound (the switch), or the migration is
// cancelled, or its node is lost.
func TestHoldsDeletionUntilTheCopyIsSafe(t *testing.T) {
	for _, end := range []string{"copied", "cancelled", "source lost", "claim deleted"} {
		t.Run(end, func(t *testing.T) {
			e := newHoldEnv(t, node("node-a", true), node("node-b", false), claim(optedIn), migrating(time.Now()), pod("node-a"))
			e.reconcile(t)
			e.evict(t)
			if res := e.reconcile(t); !isHeld(e.pod(t)) || res.RequeueAfter == 0 {
				t.Fatalf("an evicted pod whose volume is copying: held %v, requeue %v", isHeld(e.pod(t)), res.RequeueAfter)
			}
			if ev := e.events(); !strings.Contains(ev, "MigrationHoldsPod") || !strings.Contains(ev, "node-b") {
				t.Errorf("events %q, want MigrationHoldsPod naming the target", ev)
			}
			switch end {
			case "copied":
				e.setPhase(t, names.MigrationSwitching)
			case "cancelled":
				e.setPhase(t, "")
				n := &corev1.Node{}
				if err := e.c.Get(context.Background(), client.ObjectKey{Name: "node-a"}, n); err != nil {
					t.Fatal(err)
				}
				n.Spec.Unschedulable = false
				if err := e.c.Update(context.Background(), n); err != nil {
					t.Fatal(err)
				}
			case "source lost":
				e.setPhase(t, names.MigrationCopying)
				pv := e.pvOld(t)
				pv.Annotations[names.MigrationSourceLost] = "2026-12-03T10:00:00Z"
				if err := e.c.Update(context.Background(), pv); err != nil {
					t.Fatal(err)
				}
			case "claim deleted":
				if err := e.c.Delete(context.Background(), claim(nil)); err != nil {
					t.Fatal(err)
				}
			}
			e.reconcile(t)
			if p := e.pod(t); p != nil {
				t.Fatalf("the pod is still held once its migration is %s: finalizers %v", end, p.Finalizers)
			}
		})
	}
}

func (e *holdEnv) pvOld(t *testing.T) *corev1.PersistentVolume {
	t.Helper()
	pv := &corev1.PersistentVolume{}
	if err := e.c.Get(context.Background(), client.ObjectKey{Name: "pv-old"}, pv); err != nil {
		t.Fatal(err)
	}
	return pv
}

func (e *holdEnv) events() string {
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

// kubectl drain cordons and evicts at once: a pod evicted before its
// migration starts is held if the migration will start (a target has
// room), and let go if not (the volume stays, as without podvol).
func TestHoldsAnEvictionThatOutranTheStart(t *testing.T) {
	for _, room := range []bool{true, false} {
		objs := []client.Object{node("node-a", true), node("node-b", false), claim(optedIn), pvOn("pv-old", "node-a", "pv-0123456789abcdef01234567", oldRef), pod("node-a"),
			&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "podvol"}, Provisioner: names.Driver}}
		if room {
			objs = append(objs, capacity("node-b", "5Gi"))
		}
		e := newHoldEnv(t, objs...)
		e.reconcile(t)
		e.evict(t)
		e.reconcile(t)
		if isHeld(e.pod(t)) != room {
			t.Errorf("a target with room %v: the evicted pod held %v", room, isHeld(e.pod(t)))
		}
	}
}

// While the pre-copy is not in, the pod has a PodDisruptionBudget of its
// own that allows no eviction (owned by the pod, selecting it alone by a
// label it gets); once the copy's claim says the pre-copy is in, the
// budget and the label go.
func TestHoldsEvictionUntilThePreCopy(t *testing.T) {
	ctx := context.Background()
	e := newHoldEnv(t, node("node-a", true), node("node-b", false), claim(optedIn), migrating(time.Now()), pod("node-a"),
		(&Reconciler{}).cloneFor(copying("node-b"), claim(optedIn)))
	if res := e.reconcile(t); res.RequeueAfter == 0 {
		t.Error("a pod waiting for its pre-copy is not looked at again")
	}
	pdb := e.pdb(t)
	if pdb == nil || pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 0 || pdb.Spec.MinAvailable != nil ||
		pdb.Spec.Selector.MatchLabels[names.MigrationLabel] != "pod-uid" || len(pdb.OwnerReferences) != 1 || pdb.OwnerReferences[0].UID != "pod-uid" {
		t.Fatalf("the budget: %+v", pdb)
	}
	if p := e.pod(t); p.Labels[names.MigrationLabel] != "pod-uid" || p.Labels["app"] != "db" {
		t.Fatalf("the pod's labels: %v", p.Labels)
	}
	clone := &corev1.PersistentVolumeClaim{}
	if err := e.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: CloneName(claimID)}, clone); err != nil {
		t.Fatal(err)
	}
	clone.Status.Conditions = []corev1.PersistentVolumeClaimCondition{{Type: names.PreCopied, Status: corev1.ConditionTrue}}
	if err := e.c.Status().Update(ctx, clone); err != nil {
		t.Fatal(err)
	}
	e.reconcile(t)
	if pdb := e.pdb(t); pdb != nil {
		t.Fatalf("the budget outlives the pre-copy: %+v", pdb)
	}
	if p := e.pod(t); p.Labels[names.MigrationLabel] != "" || !isHeld(p) {
		t.Fatalf("after the pre-copy the pod has labels %v, finalizers %v; want no mark, still the finalizer", p.Labels, p.Finalizers)
	}
}

// No budget when the pod has one of its own (two would make every
// eviction fail), nor once the wait for the pre-copy is over; each says
// so on the claim.
func TestHoldsEvictionOnlyWhenItCan(t *testing.T) {
	theirs := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db"},
		Spec: policyv1.PodDisruptionBudgetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}}}
	for _, c := range []struct {
		name  string
		objs  []client.Object
		event string
	}{
		{"a budget of its own", []client.Object{theirs, migrating(time.Now())}, "MigrationEvictionNotHeld"},
		{"waited long enough", []client.Object{migrating(time.Now().Add(-time.Hour))}, "MigrationPreCopySlow"},
		{"no first copy comes", []client.Object{migrating(time.Now()), noFirstCopy()}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newHoldEnv(t, append(c.objs, node("node-a", true), node("node-b", false), claim(optedIn), pod("node-a"))...)
			e.reconcile(t)
			if pdb := e.pdb(t); pdb != nil {
				t.Fatalf("a budget was made: %+v", pdb)
			}
			if !isHeld(e.pod(t)) {
				t.Error("the pod's deletion is not held")
			}
			if ev := e.events(); !strings.Contains(ev, c.event) {
				t.Errorf("events %q, want %s", ev, c.event)
			}
		})
	}
}

// An uninstall lets every held pod and budget go, and says so when a
// controller still running holds them again.
func TestRemoveHolds(t *testing.T) {
	ctx := context.Background()
	p := pod("node-a")
	p.Finalizers = []string{names.MigrationFinalizer, "example.com/other"}
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: PDBName("pod-uid"), Labels: map[string]string{managedBy: controllerName}},
		Spec: policyv1.PodDisruptionBudgetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{names.MigrationLabel: "pod-uid"}}}}
	e := newHoldEnv(t, p, pdb)
	n, err := RemoveHolds(ctx, e.c, 0)
	if err != nil || n != 2 {
		t.Fatalf("RemoveHolds: %d, %v; want the pod and the budget", n, err)
	}
	if got := e.pod(t); isHeld(got) || !controllerutil.ContainsFinalizer(got, "example.com/other") {
		t.Fatalf("finalizers after RemoveHolds: %v", got.Finalizers)
	}
	if e.pdb(t) != nil {
		t.Fatal("the budget is still there")
	}
	// A controller still running adds it back.
	again := e.pod(t)
	again.Finalizers = append(again.Finalizers, names.MigrationFinalizer)
	if err := e.c.Update(ctx, again); err != nil {
		t.Fatal(err)
	}
	readd := &readdingClient{Client: e.c}
	if _, err := RemoveHolds(ctx, readd, 0); !errors.Is(err, ErrHoldsAdded) || !strings.Contains(err.Error(), ns+"/db-0") {
		t.Fatalf("RemoveHolds with a controller running: %v, want %v naming the pod", err, ErrHoldsAdded)
	}
}

// readdingClient puts the finalizer back after each patch, as a running
// controller would.
type readdingClient struct{ client.Client }

func (c *readdingClient) Patch(ctx context.Context, o client.Object, p client.Patch, opts ...client.PatchOption) error {
	if err := c.Client.Patch(ctx, o, p, opts...); err != nil {
		return err
	}
	return c.Client.Patch(ctx, o, finalizerPatch(true))
}

// noFirstCopy is the copy's claim, whose node says no first copy comes
// (no room for the source's snapshot, no reflink).
func noFirstCopy() *corev1.PersistentVolumeClaim {
	c := (&Reconciler{}).cloneFor(copying("node-b"), claim(optedIn))
	c.Status.Conditions = []corev1.PersistentVolumeClaimCondition{{Type: names.PreCopied, Status: corev1.ConditionFalse, Reason: "NotTaken"}}
	return c
}
