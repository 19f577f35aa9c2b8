package migration

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/podvol/podvol/internal/names"
)

// The edges of a migration: a claim expanded or deleted during it, a copy's
// claim deleted, a pod stuck on the old node, a namespace deleted, a cache
// that lags, a step that fails, a second drain.

// newEnvWith is newEnv with the fake API server's calls intercepted, and
// UIDs given to the objects created, as the API server does.
func newEnvWith(t *testing.T, funcs interceptor.Funcs, objs ...client.Object) *env {
	t.Helper()
	create := funcs.Create
	funcs.Create = func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
		if obj.GetUID() == "" {
			obj.SetUID(types.UID(fmt.Sprintf("uid-%d", uids.Add(1))))
		}
		if create != nil {
			return create(ctx, c, obj, opts...)
		}
		return c.Create(ctx, obj, opts...)
	}
	c := interceptor.NewClient(fake.NewClientBuilder().WithObjects(objs...).
		WithStatusSubresource(&corev1.PersistentVolumeClaim{}, &corev1.PersistentVolume{}, &corev1.Pod{}).Build(), funcs)
	rec := events.NewFakeRecorder(100)
	return &env{c: c, rec: rec, r: &Reconciler{Client: c, APIReader: c, Recorder: rec, Driver: names.Driver, StashNamespace: stashNS}}
}

var uids atomic.Int64

// try is one Reconcile, its error returned.
func (e *env) try() (reconcile.Result, error) {
	return e.r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Name: "pv-old"}})
}

func (e *env) gone(t *testing.T, obj client.Object) bool {
	t.Helper()
	err := e.c.Get(context.Background(), client.ObjectKeyFromObject(obj), obj)
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	return apierrors.IsNotFound(err)
}

func sized(pvc *corev1.PersistentVolumeClaim, size string) *corev1.PersistentVolumeClaim {
	pvc.Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse(size)
	return pvc
}

// switchingFrom is the state a switch starts from: the copy bound to the
// copy's claim, the PV in phase Switching.
func switchingFrom(old *corev1.PersistentVolumeClaim) []client.Object {
	pv := copying("node-b")
	pv.Annotations[names.MigrationPhase] = names.MigrationSwitching
	pv.Annotations[names.MigrationVolume] = "pv-new"
	clone := (&Reconciler{}).cloneFor(pv, old)
	clone.Spec.VolumeName = "pv-new"
	clone.Status.Phase = corev1.ClaimBound
	clone.UID = "clone-uid"
	newPV := pvOn("pv-new", "node-b", "pv-0123456789abcdef0123456f", &corev1.ObjectReference{Namespace: ns, Name: clone.Name, UID: clone.UID})
	return []client.Object{node("node-a", true), node("node-b", false), old, clone, pv, newPV}
}

// bindRemade plays the PV controller: a claim made again, pre-bound to the
// copy, is bound to it.
func (e *env) bindRemade(t *testing.T) *corev1.PersistentVolumeClaim {
	t.Helper()
	ctx := context.Background()
	remade := &corev1.PersistentVolumeClaim{}
	err := e.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "data-db-0"}, remade)
	if err != nil || remade.UID == claimID {
		return nil
	}
	if remade.Status.Phase != corev1.ClaimBound && remade.DeletionTimestamp == nil {
		pv := e.pv(t, "pv-new")
		pv.Spec.ClaimRef.UID = remade.UID
		if err := e.c.Update(ctx, pv); err != nil {
			t.Fatal(err)
		}
		remade.Status.Phase = corev1.ClaimBound
		if err := e.c.Status().Update(ctx, remade); err != nil {
			t.Fatal(err)
		}
	}
	return remade
}

// Item 2: a claim expanded during the pre-copy grows the volume on its node
// past the copy's size (the last copy would be refused OUT_OF_RANGE for
// ever): the copy is made again at the new size, on a node chosen anew.
func TestClaimGrownDuringTheCopyStartsItAgain(t *testing.T) {
	ctx := context.Background()
	old := claim(optedIn)
	clone := (&Reconciler{}).cloneFor(copying("node-b"), old)
	grown := sized(claim(optedIn), "2Gi")
	e := newEnv(t, node("node-a", true), node("node-b", false), node("node-c", false), capacity("node-b", "5Gi"), capacity("node-c", "1536Mi"),
		grown, clone, copying("node-b"))
	e.reconcile(t)
	if !e.gone(t, clone) {
		t.Fatalf("the copy of 1Gi of a claim grown to 2Gi is kept (events: %s)", e.events())
	}
	if ev := e.events(); !strings.Contains(ev, "MigrationRestarted") || !strings.Contains(ev, "grew to 2Gi") {
		t.Errorf("events %q, want MigrationRestarted saying the claim grew", ev)
	}
	for range 3 {
		e.reconcile(t)
	}
	again := &corev1.PersistentVolumeClaim{}
	if err := e.c.Get(ctx, client.ObjectKeyFromObject(clone), again); err != nil {
		t.Fatalf("the copy made again: %v", err)
	}
	if got := again.Spec.Resources.Requests[corev1.ResourceStorage]; got.Cmp(resource.MustParse("2Gi")) != 0 || again.Annotations[names.SelectedNode] != "node-b" {
		t.Errorf("the copy made again asks %s on %s, want 2Gi on node-b (node-c has no room for 2Gi)", got.String(), again.Annotations[names.SelectedNode])
	}
}

// Item 2, later: a claim expanded once its copy is done (stashed for the
// switch) is made again with its new size; external-resizer then grows the
// copy on its node.
func TestSwitchKeepsAnExpansion(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, switchingFrom(claim(optedIn))...)
	stash := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: stashNS, Name: stashName("pv-old")}}
	for i := 0; i < 20 && e.gone(t, stash); i++ {
		e.reconcile(t)
	}
	if e.gone(t, stash) {
		t.Fatal("no stash")
	}
	cur := &corev1.PersistentVolumeClaim{}
	if err := e.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "data-db-0"}, cur); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Update(ctx, sized(cur, "3Gi")); err != nil {
		t.Fatal(err)
	}
	var remade *corev1.PersistentVolumeClaim
	for i := 0; i < 20 && remade == nil; i++ {
		e.reconcile(t)
		remade = e.bindRemade(t)
	}
	if remade == nil {
		t.Fatalf("the claim was not made again (events: %s)", e.events())
	}
	if got := remade.Spec.Resources.Requests[corev1.ResourceStorage]; got.Cmp(resource.MustParse("3Gi")) != 0 {
		t.Errorf("the claim made again asks %s, want the 3Gi it was expanded to", got.String())
	}
}

// Item 3: a copy's claim being deleted (by its user, or a cancel) is never
// switched to, even bound: its PV goes with it. A new one is made once it
// is gone.
func TestCopyBeingDeletedIsNotSwitchedTo(t *testing.T) {
	old := claim(optedIn)
	clone := (&Reconciler{}).cloneFor(copying("node-b"), old)
	clone.Spec.VolumeName = "pv-new"
	clone.Status.Phase = corev1.ClaimBound
	clone.Finalizers = []string{"kubernetes.io/pvc-protection"}
	clone.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	e := newEnv(t, node("node-a", true), node("node-b", false), old, clone, copying("node-b"))
	e.reconcile(t)
	if got := e.pv(t, "pv-old").Annotations[names.MigrationPhase]; got != names.MigrationCopying {
		t.Fatalf("phase %q with the copy's claim being deleted, want %s", got, names.MigrationCopying)
	}
	clone.Finalizers = nil
	if err := e.c.Update(context.Background(), clone); err != nil {
		t.Fatal(err)
	}
	e.reconcile(t)
	again := &corev1.PersistentVolumeClaim{}
	if err := e.c.Get(context.Background(), client.ObjectKeyFromObject(clone), again); err != nil || again.Spec.VolumeName != "" {
		t.Fatalf("the copy's claim once the deleted one is gone: %+v, %v; want a new one", again.Spec, err)
	}
}

// Item 4: pods on the old node keep the claim being switched Terminating
// (pvc-protection). One that has not started is deleted; one whose
// deletion its kubelet does not finish is deleted at once a grace after its
// deadline; finalizers that still hold it are named in a Warning.
func TestSwitchDealsWithPodsStuckOnTheOldNode(t *testing.T) {
	old := claim(optedIn)
	old.Finalizers = []string{"kubernetes.io/pvc-protection"}
	old.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	objs := switchingFrom(old)
	pv := objs[4].(*corev1.PersistentVolume)
	pv.Annotations[names.MigrationClaimDeleted] = string(claimID)
	uses := []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data-db-0"}}}}
	pod := func(name string, phase corev1.PodPhase, deleted time.Duration, finalizers ...string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name), Finalizers: finalizers},
			Spec: corev1.PodSpec{NodeName: "node-a", Volumes: uses}, Status: corev1.PodStatus{Phase: phase}}
		if deleted != 0 {
			p.DeletionTimestamp = &metav1.Time{Time: time.Now().Add(-deleted)}
			p.DeletionGracePeriodSeconds = ptr.To[int64](30)
		}
		return p
	}
	// "podvol.test/kubelet" stands for a kubelet that does not finish
	// the pod: a deletion with grace period 0 does without it.
	const kubelet = "podvol.test/kubelet"
	force := interceptor.Funcs{Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
		do := &client.DeleteOptions{}
		do.ApplyOptions(opts)
		if p, ok := obj.(*corev1.Pod); ok && do.GracePeriodSeconds != nil && *do.GracePeriodSeconds == 0 {
			live := &corev1.Pod{}
			if err := c.Get(ctx, client.ObjectKeyFromObject(p), live); err != nil {
				return err
			}
			if live.DeletionTimestamp != nil {
				// Its deletion cut short; a finalizer still holds it.
				live.Finalizers = slicesDelete(live.Finalizers, kubelet)
				live.DeletionGracePeriodSeconds = ptr.To[int64](0)
				return c.Update(ctx, live)
			}
		}
		return c.Delete(ctx, obj, opts...)
	}}
	pending := pod("db-0-again", corev1.PodPending, 0)
	recent := pod("db-0-recent", corev1.PodRunning, 10*time.Second, kubelet)
	stuck := pod("db-0", corev1.PodRunning, 2*time.Minute, kubelet)
	held := pod("db-0-held", corev1.PodRunning, 2*time.Minute, kubelet, "example.com/backup")
	e := newEnvWith(t, force, append(objs, pending, recent, stuck, held)...)
	for range 5 {
		if _, err := e.try(); err != nil {
			t.Fatal(err)
		}
	}
	if !e.gone(t, pending) {
		t.Error("a pod that cannot start on the old node was not deleted")
	}
	if !e.gone(t, stuck) {
		t.Error("a pod stuck being deleted on the old node past its deadline and the grace was not deleted at once")
	}
	if e.gone(t, recent) || recent.DeletionGracePeriodSeconds == nil || *recent.DeletionGracePeriodSeconds != 30 {
		t.Error("a pod being deleted on the old node within the grace was deleted at once")
	}
	if e.gone(t, held) || held.DeletionGracePeriodSeconds == nil || *held.DeletionGracePeriodSeconds != 0 {
		t.Errorf("a pod held by a finalizer: %+v, want it deleted at once, and still there", held.ObjectMeta)
	}
	ev := e.events()
	for _, want := range []string{"MigrationForceDelete", "MigrationBlocked", "example.com/backup", "kubectl -n team-a patch pod db-0-held"} {
		if !strings.Contains(ev, want) {
			t.Errorf("events %q, want %s", ev, want)
		}
	}
}

func slicesDelete(s []string, v string) []string {
	var out []string
	for _, x := range s {
		if x != v {
			out = append(out, x)
		}
	}
	return out
}

// switchedTo is a PV whose claim was switched to pv-new, waiting for a pod
// on node-b to give its policy back.
func switchedTo() *corev1.PersistentVolume {
	pv := copying("node-b")
	pv.Annotations[names.MigrationPhase] = names.MigrationSwitched
	pv.Annotations[names.MigrationVolume] = "pv-new"
	pv.Annotations[names.MigrationReclaim] = "Delete"
	pv.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimRetain
	return pv
}

// Item 5: once switched, the old volume waits for a pod running with the
// copy only while the claim is the one made again: a claim drained again
// (bound to a third PV), or deleted and made anew by its user, lets it go.
func TestOldVolumeGoesOnceTheClaimMovedOn(t *testing.T) {
	for _, c := range []struct {
		name string
		now  *corev1.PersistentVolumeClaim
	}{
		{"drained again", &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "data-db-0", UID: "uid-third"},
			Spec: corev1.PersistentVolumeClaimSpec{VolumeName: "pv-newer"}, Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound}}},
		{"made anew", &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "data-db-0", UID: "uid-anew"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, node("node-a", true), node("node-b", true), switchedTo(), c.now)
			e.reconcile(t)
			if p := e.pv(t, "pv-old").Spec.PersistentVolumeReclaimPolicy; p != corev1.PersistentVolumeReclaimDelete {
				t.Fatalf("the old PV's policy is %s, want Delete back", p)
			}
		})
	}
}

// Item 5: the stash goes even if deleting it fails right after the switch.
func TestStashGoesWhenTheLastStepFails(t *testing.T) {
	failed := false
	once := interceptor.Funcs{Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
		if _, ok := obj.(*corev1.ConfigMap); ok && !failed {
			failed = true
			return apierrors.NewServiceUnavailable("etcd is away")
		}
		return c.Delete(ctx, obj, opts...)
	}}
	e := newEnvWith(t, once, switchingFrom(claim(optedIn))...)
	for range 20 {
		_, _ = e.try()
		e.bindRemade(t)
	}
	if !failed {
		t.Fatal("the stash was never deleted")
	}
	if got := e.pv(t, "pv-old").Annotations[names.MigrationPhase]; got != names.MigrationSwitched {
		t.Fatalf("phase %q", got)
	}
	if !e.gone(t, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: stashNS, Name: stashName("pv-old")}}) {
		t.Error("the stash is left behind")
	}
}

// Item 5: a claim gone during the switch ends it with nothing made again
// and both volumes given back to their policies: deleted before it was
// stashed, or its namespace deleted once it was (the claim cannot be made
// again there).
func TestSwitchOfAClaimWhoseNamespaceGoes(t *testing.T) {
	terminating := apierrors.NewForbidden(schema.GroupResource{Resource: "persistentvolumeclaims"}, "data-db-0",
		errors.New("unable to create new content in namespace team-a because it is being terminated"))
	terminating.ErrStatus.Details.Causes = []metav1.StatusCause{{Type: corev1.NamespaceTerminatingCause, Field: "metadata.namespace"}}
	for _, c := range []struct {
		name string
		// gone: when the claim goes (the n-th Reconcile), 0 before any.
		gone int
	}{{"before the stash", 0}, {"after its deletion by the switch", -1}} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			objs := switchingFrom(claim(optedIn))
			if c.gone == 0 {
				objs = append(objs[:2], objs[3:]...)
			}
			e := newEnvWith(t, interceptor.Funcs{Create: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
				if _, ok := obj.(*corev1.PersistentVolumeClaim); ok {
					return terminating
				}
				return cl.Create(ctx, obj, opts...)
			}}, objs...)
			var err error
			for range 20 {
				if _, err = e.try(); err == nil && e.pv(t, "pv-old").Spec.PersistentVolumeReclaimPolicy == corev1.PersistentVolumeReclaimDelete {
					break
				}
			}
			if err != nil {
				t.Fatalf("the switch: %v", err)
			}
			for _, name := range []string{"pv-old", "pv-new"} {
				if p := e.pv(t, name).Spec.PersistentVolumeReclaimPolicy; p != corev1.PersistentVolumeReclaimDelete {
					t.Errorf("%s's policy is %s, want Delete back", name, p)
				}
			}
			if !e.gone(t, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: stashNS, Name: stashName("pv-old")}}) {
				t.Error("the stash is left behind")
			}
			if err := e.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: CloneName(claimID)}, &corev1.PersistentVolumeClaim{}); !apierrors.IsNotFound(err) {
				t.Errorf("the copy's claim: %v, want it gone", err)
			}
			if ev := e.events(); !strings.Contains(ev, "MigrationAbandoned") {
				t.Errorf("events %q", ev)
			}
		})
	}
}

// Item 5: a user's deletion during the switch is not undone: neither of
// the claim as the switch was about to delete it, nor of the claim made
// again.
func TestSwitchDoesNotUndoAUsersDeletion(t *testing.T) {
	ctx := context.Background()
	t.Run("the claim made again", func(t *testing.T) {
		e := newEnvWith(t, interceptor.Funcs{}, switchingFrom(claim(optedIn))...)
		var remade *corev1.PersistentVolumeClaim
		for i := 0; i < 20 && remade == nil; i++ {
			e.reconcile(t)
			remade = e.bindRemade(t)
		}
		if remade == nil {
			t.Fatalf("the claim was not made again (events: %s)", e.events())
		}
		// The PV controller had not bound it yet: undo the binding.
		pv := e.pv(t, "pv-new")
		pv.Spec.ClaimRef.UID = ""
		if err := e.c.Update(ctx, pv); err != nil {
			t.Fatal(err)
		}
		if err := e.c.Delete(ctx, remade); err != nil {
			t.Fatal(err)
		}
		for range 5 {
			e.reconcile(t)
		}
		if err := e.c.Get(ctx, client.ObjectKeyFromObject(remade), &corev1.PersistentVolumeClaim{}); !apierrors.IsNotFound(err) {
			t.Fatalf("the claim made again, deleted by its user: %v, want it not made again", err)
		}
		if p := e.pv(t, "pv-new").Spec; p.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete || p.ClaimRef.UID != claimID {
			t.Errorf("the copy's PV: policy %s, claimRef %+v; want Delete, pointed at a deleted claim", p.PersistentVolumeReclaimPolicy, p.ClaimRef)
		}
	})
	t.Run("the claim as the switch deletes it", func(t *testing.T) {
		old := claim(optedIn)
		old.Finalizers = []string{"kubernetes.io/pvc-protection"}
		userFirst := false
		e := newEnvWith(t, interceptor.Funcs{Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			if p, ok := obj.(*corev1.PersistentVolumeClaim); ok && p.Name == "data-db-0" && !userFirst {
				// Its user deletes it just before the switch does.
				userFirst = true
				if err := c.Delete(ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "data-db-0"}}); err != nil {
					return err
				}
			}
			return c.Delete(ctx, obj, opts...)
		}}, switchingFrom(old)...)
		for i := 0; i < 20 && !userFirst; i++ {
			_, _ = e.try()
		}
		if !userFirst {
			t.Fatal("the switch never deleted the claim")
		}
		// pvc-protection lets it go.
		cur := &corev1.PersistentVolumeClaim{}
		if err := e.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "data-db-0"}, cur); err != nil {
			t.Fatal(err)
		}
		cur.Finalizers = nil
		if err := e.c.Update(ctx, cur); err != nil {
			t.Fatal(err)
		}
		for range 5 {
			_, _ = e.try()
		}
		if err := e.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "data-db-0"}, &corev1.PersistentVolumeClaim{}); !apierrors.IsNotFound(err) {
			t.Fatalf("the claim its user deleted: %v, want it not made again", err)
		}
	})
}

// laggingCache is a client whose reads of pv-old return an older copy, as
// controller-runtime's cache does until its watch catches up; writes go to
// the API server.
type laggingCache struct {
	client.Client
	old *corev1.PersistentVolume
}

func (l laggingCache) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if pv, ok := obj.(*corev1.PersistentVolume); ok && key.Name == l.old.Name {
		l.old.DeepCopyInto(pv)
		return nil
	}
	return l.Client.Get(ctx, key, obj, opts...)
}

// Item 5: a cancel decided on a cache that does not show the switch begun
// (the node uncordoned just then) leaves the copy's claim alone: deleting
// it would delete the copy, its PV not yet held at Retain.
func TestStaleCancelLeavesTheSwitchAlone(t *testing.T) {
	ctx := context.Background()
	old := claim(optedIn)
	objs := switchingFrom(old)
	objs[0] = node("node-a", false)
	pv := objs[4].(*corev1.PersistentVolume)
	pv.Annotations[names.MigrationPhase] = names.MigrationCopying
	delete(pv.Annotations, names.MigrationVolume)
	e := newEnv(t, objs...)
	stale := e.pv(t, "pv-old")
	switched := stale.DeepCopy()
	switched.Annotations[names.MigrationPhase] = names.MigrationSwitching
	switched.Annotations[names.MigrationVolume] = "pv-new"
	if err := e.c.Update(ctx, switched); err != nil {
		t.Fatal(err)
	}
	e.r.Client = laggingCache{Client: e.c, old: stale}
	_, _ = e.try()
	if e.gone(t, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: CloneName(claimID)}}) {
		t.Fatal("a cancel read from a stale cache deleted the copy's claim after the switch began")
	}
	if got := e.pv(t, "pv-old").Annotations[names.MigrationPhase]; got != names.MigrationSwitching {
		t.Errorf("phase %q, want the switch to go on", got)
	}
}
