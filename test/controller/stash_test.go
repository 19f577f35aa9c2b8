package controller

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/podvol/podvol/internal/controller/clonelifecycle"
	"github.com/podvol/podvol/internal/names"
)

// The ConfigMap a tenant may create in their own namespace under the name
// podvol-controller once kept its reset stash by: podvol-reset-<claim>.
func tenantStashName(claim string) string { return "podvol-reset-" + claim }

// hostile is a PVC as an attacker would describe it: somewhere else, bound
// to someone else's volume, in a class and size of their choosing.
func hostile(ns, name string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolumeClaim"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"planted": "yes"},
			Annotations: map[string]string{names.Lifecycle: names.ResetOnDetach},
			Finalizers:  []string{"evil.example.com/keep"}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			StorageClassName: ptr.To("podvol-direct"),
			VolumeName:       "pv-of-another-tenant",
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("500Gi")}},
		},
	}
}

// plant writes the tenant's ConfigMap podvol-reset-<claim> in ns describing
// pvc, as the controller's own stash looked: created if missing, its data
// replaced if the controller (or anyone) made one already.
func (e *env) plant(ns, claim string, pvc *corev1.PersistentVolumeClaim, oldUID types.UID) {
	e.t.Helper()
	b, err := json.Marshal(pvc)
	e.must(err)
	cm := &corev1.ConfigMap{}
	err = e.c.Get(bg, client.ObjectKey{Namespace: ns, Name: tenantStashName(claim)}, cm)
	if apierrors.IsNotFound(err) {
		cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: tenantStashName(claim),
			// Every marker the controller ever put on its stash: a tenant
			// can write them all.
			Labels:      map[string]string{"app.kubernetes.io/managed-by": "podvol-controller"},
			Annotations: map[string]string{names.StashOldUID: string(oldUID)}},
			Data: map[string]string{"pvc.json": string(b)}}
		e.must(e.c.Create(bg, cm))
		return
	}
	e.must(err)
	cm.Data = map[string]string{"pvc.json": string(b)}
	e.must(e.c.Update(bg, cm))
}

// pvcsIn lists the PVCs of a namespace by name.
func (e *env) pvcsIn(ns string) []string {
	l := &corev1.PersistentVolumeClaimList{}
	e.must(e.c.List(bg, l, client.InNamespace(ns)))
	var out []string
	for _, p := range l.Items {
		out = append(out, p.Name)
	}
	return out
}

// stashesFor lists the controller's stashes, wherever it keeps them, for
// claims of namespace ns.
func (e *env) stashesFor(ns string) []string {
	l := &corev1.ConfigMapList{}
	e.must(e.c.List(bg, l, client.MatchingLabels{names.StashClaimNamespace: ns}))
	var out []string
	for _, cm := range l.Items {
		out = append(out, cm.Namespace+"/"+cm.Name)
	}
	return out
}

func (e *env) unhold(ns, name string) {
	e.t.Helper()
	p := e.pvc(ns, name)
	if p == nil {
		return
	}
	p.Finalizers = nil
	e.must(e.c.Update(bg, p))
}

// ephemeralClone creates PVC golden and the reset-on-detach clone work of it
// in ns, held by a finalizer of the test so that a reset's window between
// the delete and the re-create stays open until the test closes it.
func (e *env) ephemeralClone(ns string, used bool) *corev1.PersistentVolumeClaim {
	e.t.Helper()
	e.must(e.c.Create(bg, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "golden"}, Spec: spec}))
	cs := spec.DeepCopy()
	cs.DataSource = &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "golden"}
	ann := map[string]string{names.Lifecycle: names.ResetOnDetach, "note": "kept"}
	if used {
		ann[names.Used] = "true"
	}
	clone := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "work", Labels: map[string]string{"app": "ci"},
		Annotations: ann, Finalizers: []string{"test.podvol.io/hold"}}, Spec: *cs}
	e.must(e.c.Create(bg, clone))
	e.t.Cleanup(func() { e.unhold(ns, "work") })
	return clone
}

// checkOwnDerivation checks that PVC ns/work is the controller's fresh clone
// of the original, whatever the tenant wrote meanwhile.
func (e *env) checkOwnDerivation(ns string, old types.UID, count string) {
	e.t.Helper()
	p := e.pvc(ns, "work")
	if p == nil || p.UID == old {
		e.t.Fatalf("PVC %s/work not created again: %+v", ns, p)
	}
	s := p.Spec
	if s.StorageClassName == nil || *s.StorageClassName != "podvol" || s.VolumeName != "" ||
		len(s.AccessModes) != 1 || s.AccessModes[0] != corev1.ReadWriteOnce ||
		!s.Resources.Requests.Storage().Equal(resource.MustParse("1Gi")) ||
		s.DataSource == nil || s.DataSource.Name != "golden" {
		e.t.Fatalf("the PVC created again does not have the original's spec: %+v", s)
	}
	if p.Labels["app"] != "ci" || p.Labels["planted"] != "" || len(p.Finalizers) != 0 || len(p.OwnerReferences) != 0 ||
		p.Annotations[names.Lifecycle] != names.ResetOnDetach || p.Annotations["note"] != "kept" ||
		p.Annotations[names.Used] != "" || p.Annotations[names.ResetCount] != count {
		e.t.Fatalf("the PVC created again does not have the original's metadata: %+v", p.ObjectMeta)
	}
}

// A tenant who may create ConfigMaps and Pods in their namespace plants
// stashes naming a PVC in another namespace and one in their own, with a
// spec of their choosing, then creates pods that name the missing claims.
// Nothing is created, the ConfigMaps are left alone, and the pods' events
// say why.
func TestResetStashForgedIsIgnored(t *testing.T) {
	e := start(t)
	a, b := e.ns("tenant-a"), e.ns("tenant-b")

	e.plant(a, "data-db-0", hostile(b, "data-db-0"), "0b4e1d8e-5a3c-4f6e-9d2a-7c1b3e5f9a01")
	e.plant(a, "scratch", hostile(a, "scratch"), "0b4e1d8e-5a3c-4f6e-9d2a-7c1b3e5f9a02")
	e.must(e.c.Create(bg, podWith(a, "squat", claimVol("data-db-0"))))
	e.must(e.c.Create(bg, podWith(a, "steal", claimVol("scratch"))))

	e.never("a PVC created from a forged stash", func() bool { return len(e.pvcsIn(a)) > 0 || len(e.pvcsIn(b)) > 0 })
	for pod, claim := range map[string]string{"squat": "data-db-0", "steal": "scratch"} {
		e.eventually("a Warning event on pod "+pod, func() bool {
			ev := e.events(a, pod)
			return strings.Contains(ev, "ResetStashIgnored") && strings.Contains(ev, tenantStashName(claim))
		})
		cm := &corev1.ConfigMap{}
		if err := e.c.Get(bg, client.ObjectKey{Namespace: a, Name: tenantStashName(claim)}, cm); err != nil {
			t.Fatalf("the tenant's ConfigMap was not left alone: %v", err)
		}
	}
	t.Logf("events of pod squat:\n%s", e.events(a, "squat"))
	if got := e.pvcsIn(a); len(got) > 0 {
		t.Fatalf("PVCs created in %s: %v", a, got)
	}
	if got := e.pvcsIn(b); len(got) > 0 {
		t.Fatalf("PVCs created in %s: %v", b, got)
	}
}

// A tenant rewrites the stash while a real reset is under way (the old
// PVC is deleted but not gone yet): the PVC created again is the
// controller's own derivation of the original, in its namespace, and the
// tenant's ConfigMap is left alone. Then a second reset, tampered to name
// another namespace, ends the same way.
func TestResetStashTamperedDuringReset(t *testing.T) {
	e := start(t)
	a, b := e.ns("tenant-a"), e.ns("tenant-b")
	e.ephemeralClone(a, false)
	first := e.pvc(a, "work").UID

	user := podWith(a, "user", claimVol("work"))
	e.must(e.c.Create(bg, user))
	setPhase(e, user, corev1.PodRunning)
	e.eventually("the clone marked used", func() bool { return e.pvc(a, "work").Annotations[names.Used] == "true" })

	for i, tamper := range []*corev1.PersistentVolumeClaim{hostile(a, "work"), hostile(b, "work")} {
		old := e.pvc(a, "work").UID
		e.must(e.c.Delete(bg, user, client.GracePeriodSeconds(0)))
		e.eventually("the reset started", func() bool { p := e.pvc(a, "work"); return p != nil && p.DeletionTimestamp != nil })
		e.plant(a, "work", tamper, old)
		e.unhold(a, "work")

		e.eventually("the clone created again", func() bool {
			p := e.pvc(a, "work")
			return (p != nil && p.UID != old) || len(e.pvcsIn(b)) > 0
		})
		if got := e.pvcsIn(b); len(got) > 0 {
			t.Fatalf("reset %d: PVCs created in %s from a tampered stash: %v", i+1, b, got)
		}
		e.checkOwnDerivation(a, old, []string{"1", "2"}[i])
		if err := e.c.Get(bg, client.ObjectKey{Namespace: a, Name: tenantStashName("work")}, &corev1.ConfigMap{}); err != nil {
			t.Fatalf("reset %d: the tenant's ConfigMap was not left alone: %v", i+1, err)
		}
		e.eventually("a Warning event on the PVC about the tenant's ConfigMap", func() bool {
			return strings.Contains(e.events(a, "work"), "ResetStashIgnored")
		})
		e.eventually("the controller's stash removed", func() bool { return len(e.stashesFor(a)) == 0 })

		// Hold the new clone too and use it again.
		p := e.pvc(a, "work")
		p.Finalizers = []string{"test.podvol.io/hold"}
		e.must(e.c.Update(bg, p))
		user = podWith(a, "user", claimVol("work"))
		e.must(e.c.Create(bg, user))
		setPhase(e, user, corev1.PodRunning)
		e.eventually("the new clone marked used", func() bool { return e.pvc(a, "work").Annotations[names.Used] == "true" })
	}
	if e.pvc(a, "work").UID == first {
		t.Fatal("never reset")
	}
}

// noPodsCache is a reconciler's cache that sees no pods (the live reads go
// to the API server): a reconciler built on it acts at once.
func noPodsCache(c client.WithWatch) client.WithWatch {
	return interceptor.NewClient(c, interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if _, ok := list.(*corev1.PodList); ok {
				return nil
			}
			return c.List(ctx, list, opts...)
		},
	})
}

// A reset is started by one controller and finished by another (the first
// restarted) while the tenant has rewritten the stash to name another
// namespace: the second creates the controller's own derivation of the
// original, where it was.
func TestResetStashAcrossRestart(t *testing.T) {
	e := start(t, "node-loss")
	a, b := e.ns("tenant-a"), e.ns("tenant-b")
	e.ephemeralClone(a, true)
	old := e.pvc(a, "work").UID
	key := ctrl.Request{NamespacedName: client.ObjectKey{Namespace: a, Name: "work"}}

	before := &clonelifecycle.Reconciler{Client: noPodsCache(e.c), APIReader: e.c, Recorder: e.rec}
	if _, err := before.Reconcile(bg, key); err != nil {
		t.Fatal(err)
	}
	if p := e.pvc(a, "work"); p == nil || p.DeletionTimestamp == nil {
		t.Fatalf("the reset did not start: %+v", p)
	}
	t.Logf("stashed in %v", e.stashesFor(a))
	e.plant(a, "work", hostile(b, "work"), old)
	e.unhold(a, "work")
	e.eventually("the old clone gone", func() bool { return e.pvc(a, "work") == nil })

	after := &clonelifecycle.Reconciler{Client: noPodsCache(e.c), APIReader: e.c, Recorder: e.rec}
	if _, err := after.Reconcile(bg, key); err != nil {
		t.Fatal(err)
	}
	if got := e.pvcsIn(b); len(got) > 0 {
		t.Fatalf("PVCs created in %s from a tampered stash: %v", b, got)
	}
	e.checkOwnDerivation(a, old, "1")
	if got := e.stashesFor(a); len(got) > 0 {
		t.Fatalf("stashes left after the reset: %v", got)
	}
	// Once the new clone exists, the reset is over: nothing left to do.
	if _, err := after.Reconcile(bg, key); err != nil {
		t.Fatal(err)
	}
	if p := e.pvc(a, "work"); p == nil || p.DeletionTimestamp != nil {
		t.Fatalf("the new clone was touched: %+v", p)
	}
}
