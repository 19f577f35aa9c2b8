package controller

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/podvol/podvol/internal/controller/migration"
	"github.com/podvol/podvol/internal/names"
)

// migration's holds on a real API server, through its Eviction API: the
// pod of a claim opted in carries the finalizer before any drain; while
// its migration's first copy is not in, its budget makes an eviction fail
// with 429 (what kubectl drain retries); once it is, the eviction goes
// through and the pod stays (Terminating) until the copy is bound; then
// it goes.
func TestMigrationHolds(t *testing.T) {
	e := start(t, "migration-holds")
	ns := e.ns("move")
	kc, err := kubernetes.NewForConfig(api.Config)
	e.must(err)
	e.must(e.c.Create(bg, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "podvol"}, Provisioner: "podvol.io",
		Parameters: map[string]string{names.ParamMigrateOnDrain: "true"}}))
	e.boundOn(ns, "data-db-0", "podvol", "n1")
	pvc := e.pvc(ns, "data-db-0")
	pvc.Spec.VolumeName = "pv-data-db-0" // as the PV controller binds it
	e.must(e.c.Update(bg, pvc))
	pod := podWith(ns, "db-0", claimVol("data-db-0"))
	pod.Spec.NodeName = "n1"
	e.must(e.c.Create(bg, pod))
	setPhase(e, pod, corev1.PodRunning)
	get := func() *corev1.Pod {
		p := &corev1.Pod{}
		if err := e.c.Get(bg, client.ObjectKeyFromObject(pod), p); err != nil {
			if apierrors.IsNotFound(err) {
				return nil
			}
			t.Fatal(err)
		}
		return p
	}
	e.eventually("the finalizer on the pod of a claim opted in", func() bool {
		return controllerutil.ContainsFinalizer(get(), names.MigrationFinalizer)
	})

	// The node is drained: the migration starts (as migration records it).
	pv := &corev1.PersistentVolume{}
	e.must(e.c.Get(bg, client.ObjectKey{Name: "pv-data-db-0"}, pv))
	pv.Annotations = map[string]string{names.MigrationTarget: "n2", names.MigrationPhase: names.MigrationCopying,
		names.MigrationClaim: ns + "/" + migration.CloneName(pvc.UID), names.MigrationStarted: time.Now().UTC().Format(time.RFC3339)}
	e.must(e.c.Update(bg, pv))
	clone := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: migration.CloneName(pvc.UID)}, Spec: *spec.DeepCopy()}
	e.must(e.c.Create(bg, clone))
	pdb := &policyv1.PodDisruptionBudget{}
	e.eventually("the pod's budget", func() bool {
		return e.c.Get(bg, client.ObjectKey{Namespace: ns, Name: migration.PDBName(pod.UID)}, pdb) == nil && get().Labels[names.MigrationLabel] == string(pod.UID)
	})
	// An eviction as kubectl drain asks it, once (client-go would retry a
	// 429 by itself ten times, each after its Retry-After).
	evict := func() error {
		return kc.CoreV1().RESTClient().Post().Namespace(ns).Resource("pods").Name("db-0").SubResource("eviction").MaxRetries(0).
			Body(&policyv1.Eviction{TypeMeta: metav1.TypeMeta{APIVersion: "policy/v1", Kind: "Eviction"}, ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db-0"},
				DeleteOptions: &metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}}).Do(bg).Error()
	}
	if err := evict(); !apierrors.IsTooManyRequests(err) {
		t.Fatalf("an eviction before the first copy: %v, want 429 Too Many Requests", err)
	}

	// The first copy is in (as the copy's node says it).
	e.must(e.c.Get(bg, client.ObjectKeyFromObject(clone), clone))
	clone.Status.Conditions = []corev1.PersistentVolumeClaimCondition{{Type: names.PreCopied, Status: corev1.ConditionTrue, Reason: "Verified"}}
	e.must(e.c.Status().Update(bg, clone))
	e.eventually("the budget gone", func() bool {
		return apierrors.IsNotFound(e.c.Get(bg, client.ObjectKey{Namespace: ns, Name: migration.PDBName(pod.UID)}, &policyv1.PodDisruptionBudget{}))
	})
	e.must(evict())
	if p := get(); p == nil || p.DeletionTimestamp == nil {
		t.Fatalf("the evicted pod: %+v, want it held, being deleted", p)
	}
	e.neverFor(time.Second, "the evicted pod gone before its copy is bound", func() bool { return get() == nil })
	if ev := e.events(ns, "db-0"); !strings.Contains(ev, "MigrationHoldsPod") {
		t.Errorf("the pod's events: %q", ev)
	}

	// The copy is bound: the migration switches; the pod goes.
	e.must(e.c.Get(bg, client.ObjectKeyFromObject(pv), pv))
	pv.Annotations[names.MigrationPhase] = names.MigrationSwitching
	e.must(e.c.Update(bg, pv))
	e.eventually("the pod gone", func() bool { return get() == nil })
}
