package controller

// migration's switch (issue 40, items 4 and 5) against a real API server:
// a pod scheduled to a node that has no kubelet stays Terminating once
// deleted, as on a node whose kubelet does not finish it, and a claim
// cannot be created in a namespace being deleted (no namespace controller
// here: it stays so). Reconcile is called directly, the test playing the
// PV controller.

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/podvol/podvol/internal/controller/migration"
	"github.com/podvol/podvol/internal/names"
)

const migrationStashNS = "podvol-system"

// switchEnv is a claim data-db-0 of namespace ns, bound to pv-old on
// node-a (cordoned), whose copy pv-new on node-b is bound to the copy's
// claim: the migration in phase Switching.
type switchEnv struct {
	*env
	ns  string
	r   *migration.Reconciler
	rec *events.FakeRecorder
}

func pvOnNode(name, node string, ref *corev1.ObjectReference, handle string) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			StorageClassName:              "podvol",
			ClaimRef:                      ref,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: names.Driver, VolumeHandle: handle}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: names.TopologyKey, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}},
		},
	}
}

func startSwitch(t *testing.T, ns string) *switchEnv {
	e := start(t, "none")
	e.ns(migrationStashNS)
	e.ns(ns)
	e.must(e.c.Create(bg, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}, Spec: corev1.NodeSpec{Unschedulable: true}}))
	e.must(e.c.Create(bg, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-b"}}))
	old := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "data-db-0", Annotations: map[string]string{names.MigrateOnDrain: "true"}}, Spec: spec}
	old.Spec.VolumeName = "pv-old"
	e.must(e.c.Create(bg, old))
	old.Status.Phase = corev1.ClaimBound
	e.must(e.c.Status().Update(bg, old))
	clone := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: migration.CloneName(old.UID),
		Annotations: map[string]string{names.MigrationOf: "pv-old"}}, Spec: spec}
	clone.Spec.VolumeName = "pv-new"
	e.must(e.c.Create(bg, clone))
	clone.Status.Phase = corev1.ClaimBound
	e.must(e.c.Status().Update(bg, clone))
	pvOld := pvOnNode("pv-old", "node-a", &corev1.ObjectReference{Namespace: ns, Name: old.Name, UID: old.UID}, "pv-0123456789abcdef01234567")
	pvOld.Annotations = map[string]string{names.MigrationTarget: "node-b", names.MigrationClaim: ns + "/" + clone.Name,
		names.MigrationPhase: names.MigrationSwitching, names.MigrationVolume: "pv-new"}
	pvNew := pvOnNode("pv-new", "node-b", &corev1.ObjectReference{Namespace: ns, Name: clone.Name, UID: clone.UID}, "pv-0123456789abcdef0123456f")
	for _, pv := range []*corev1.PersistentVolume{pvOld, pvNew} {
		e.must(e.c.Create(bg, pv))
		pv.Status.Phase = corev1.VolumeBound
		e.must(e.c.Status().Update(bg, pv))
	}
	rec := events.NewFakeRecorder(1000)
	r := &migration.Reconciler{Client: e.c, APIReader: e.c, Recorder: rec, Driver: names.Driver, StashNamespace: migrationStashNS,
		Poll: 100 * time.Millisecond, StuckGrace: time.Second}
	return &switchEnv{env: e, ns: ns, r: r, rec: rec}
}

// step is one Reconcile of pv-old.
func (s *switchEnv) step() error {
	_, err := s.r.Reconcile(bg, reconcile.Request{NamespacedName: types.NamespacedName{Name: "pv-old"}})
	return err
}

func (s *switchEnv) pv(name string) *corev1.PersistentVolume {
	pv := &corev1.PersistentVolume{}
	s.must(s.c.Get(bg, client.ObjectKey{Name: name}, pv))
	return pv
}

func (s *switchEnv) events() string {
	var out []string
	for {
		select {
		case ev := <-s.rec.Events:
			out = append(out, ev)
		default:
			return strings.Join(out, "\n")
		}
	}
}

// A pod on the old node whose deletion no kubelet finishes (Terminating for
// ever) is deleted at once, grace period 0, StuckGrace past its deadline:
// the claim is then switched.
func TestMigrationSwitchForceDeletesAStuckPod(t *testing.T) {
	s := startSwitch(t, "migration-stuck")
	pod := podWith(s.ns, "db-0", claimVol("data-db-0"))
	pod.Spec.NodeName = "node-a"
	s.must(s.c.Create(bg, pod))
	pod.Status.Phase = corev1.PodRunning
	s.must(s.c.Status().Update(bg, pod))
	// The eviction: node-a's kubelet never confirms it.
	s.must(s.c.Delete(bg, pod, client.GracePeriodSeconds(1)))
	if err := s.c.Get(bg, client.ObjectKeyFromObject(pod), pod); err != nil || pod.DeletionTimestamp == nil {
		t.Fatalf("the deleted pod on a node without a kubelet: %v, %+v; want it Terminating", err, pod.ObjectMeta)
	}
	remade := func() bool {
		c := s.pvc(s.ns, "data-db-0")
		return c != nil && c.Spec.VolumeName == "pv-new"
	}
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline) && !remade(); time.Sleep(100 * time.Millisecond) {
		if err := s.step(); err != nil {
			t.Fatal(err)
		}
	}
	if !remade() {
		p := &corev1.Pod{}
		err := s.c.Get(bg, client.ObjectKeyFromObject(pod), p)
		t.Fatalf("the claim was not made again bound to the copy in 20 s; the pod: %v %+v; events:\n%s", err, p.ObjectMeta, s.events())
	}
	if err := s.c.Get(bg, client.ObjectKeyFromObject(pod), &corev1.Pod{}); !apierrors.IsNotFound(err) {
		t.Errorf("the stuck pod: %v, want it gone", err)
	}
	if ev := s.events(); !strings.Contains(ev, "MigrationForceDelete") {
		t.Errorf("events %q, want MigrationForceDelete", ev)
	}
}

// A namespace deleted during the switch, once the switch deleted the claim:
// the claim cannot be made again there (Forbidden, NamespaceTerminating):
// the switch is abandoned, both PVs given back their policies, the stash
// deleted.
func TestMigrationSwitchInANamespaceBeingDeleted(t *testing.T) {
	ns := fmt.Sprintf("migration-gone-%d", time.Now().UnixNano())
	s := startSwitch(t, ns)
	s.must(s.c.Delete(bg, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	var err error
	done := func() bool {
		return s.pv("pv-old").Spec.PersistentVolumeReclaimPolicy == corev1.PersistentVolumeReclaimDelete &&
			s.pv("pv-old").Annotations[names.MigrationPhase] == names.MigrationSwitched
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && !done(); time.Sleep(50 * time.Millisecond) {
		err = s.step()
	}
	if !done() {
		t.Fatalf("the switch in a namespace being deleted did not end (last error: %v); events:\n%s", err, s.events())
	}
	if p := s.pv("pv-new").Spec.PersistentVolumeReclaimPolicy; p != corev1.PersistentVolumeReclaimDelete {
		t.Errorf("the copy's PV's policy is %s, want Delete back", p)
	}
	stashes := &corev1.ConfigMapList{}
	s.must(s.c.List(bg, stashes, client.InNamespace(migrationStashNS), client.MatchingLabels{names.StashClaimNamespace: ns}))
	if len(stashes.Items) != 0 {
		t.Errorf("stashes left: %v", stashes.Items)
	}
	if c := s.pvc(ns, "data-db-0"); c != nil {
		t.Errorf("the claim was made again in a namespace being deleted: %+v", c.ObjectMeta)
	}
}
