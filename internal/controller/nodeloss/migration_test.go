package nodeloss

import (
	"context"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/podvol/podvol/internal/names"
)

// until reconciles the node (sleeping between passes, as the poll would)
// until done says so, for at most 5 s.
func (e *env) until(node string, renew func(), done func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !done() {
		if time.Now().After(deadline) {
			e.t.Fatalf("not done after 5 s of passes (events: %s)", e.events())
		}
		if _, err := e.reconcile(node); err != nil {
			e.t.Fatal(err)
		}
		if renew != nil {
			renew()
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A deleted Node is held while a volume is being moved off it, whatever
// its Lease says: lost, the migrations still copying are told so (their
// copies' nodes keep a pre-copy), the pods there of their claims are
// deleted, and the node's other volumes are released meanwhile; once the
// migrations have switched, the old volumes go as any lost node's, and
// the Node is let go. Alive, nothing is marked or deleted.
func TestDeletedNodeHeldForMigrations(t *testing.T) {
	for _, lost := range []bool{true, false} {
		t.Run(map[bool]string{true: "lost", false: "alive"}[lost], func(t *testing.T) {
			ctx := context.Background()
			moving, pvMoving := volume("data-1", names.Driver, "node-a", "")
			pvMoving.Annotations = map[string]string{names.MigrationPhase: names.MigrationCopying}
			switching, pvSwitching := volume("data-2", names.Driver, "node-a", "")
			pvSwitching.Annotations = map[string]string{names.MigrationPhase: names.MigrationSwitching}
			other, pvOther := volume("data-3", names.Driver, "node-a", "")
			pod := func(name, claim string) *corev1.Pod {
				return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)}, Spec: corev1.PodSpec{NodeName: "node-a",
					Volumes: []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}}}}
			}
			objs := []client.Object{podvolNode("node-a", true, true), moving, pvMoving, switching, pvSwitching, other, pvOther, pod("db-0", "data-1"), pod("db-1", "data-2")}
			var ev *env
			var renew func()
			if !lost {
				objs = append(objs, lease("node-a", time.Unix(1000, 0)))
				renew = func() {
					l := &coordinationv1.Lease{}
					if err := ev.c.Get(ctx, types.NamespacedName{Namespace: corev1.NamespaceNodeLease, Name: "node-a"}, l); err == nil {
						l.Spec.RenewTime = &metav1.MicroTime{Time: l.Spec.RenewTime.Add(10 * time.Second)}
						_ = ev.c.Update(ctx, l)
					}
				}
			}
			ev = newEnv(t, interceptor.Funcs{}, objs...)
			podGone := func(name string) bool {
				err := ev.c.Get(ctx, types.NamespacedName{Namespace: "ns", Name: name}, &corev1.Pod{})
				return apierrors.IsNotFound(err)
			}
			pv := func(name string) *corev1.PersistentVolume {
				got := &corev1.PersistentVolume{}
				if err := ev.c.Get(ctx, client.ObjectKey{Name: name}, got); err != nil {
					t.Fatal(err)
				}
				return got
			}
			if lost {
				ev.until("node-a", renew, func() bool {
					return pv("pv-data-1").Annotations[names.MigrationSourceLost] != "" && podGone("db-0") && podGone("db-1") && !ev.exists(pvOther)
				})
				if pv("pv-data-2").Annotations[names.MigrationSourceLost] != "" {
					t.Error("a migration past its copy was told its source is lost")
				}
			} else {
				deadline := time.Now().Add(10 * ev.r.grace())
				ev.until("node-a", renew, func() bool { return time.Now().After(deadline) })
				if pv("pv-data-1").Annotations[names.MigrationSourceLost] != "" || podGone("db-0") || !ev.exists(pvOther) {
					t.Fatal("a live node's migration was told it is lost, or its pods deleted, or its volumes released")
				}
			}
			if n := ev.node("node-a"); !controllerutil.ContainsFinalizer(n, names.NodeLossFinalizer) {
				t.Fatal("the node was let go while volumes are moved off it")
			}
			if !ev.exists(moving) || !ev.exists(switching) {
				t.Fatal("a claim being moved was released")
			}
			if ev := ev.events(); !strings.Contains(ev, "Normal "+ReasonHeldForMigration) {
				t.Errorf("events %q, want %s", ev, ReasonHeldForMigration)
			}
			// Both switch: each claim is made again bound to its copy (a new
			// UID), the old PVs keep their phase Switched.
			for _, c := range []struct {
				pvc *corev1.PersistentVolumeClaim
				pv  string
			}{{moving, "pv-data-1"}, {switching, "pv-data-2"}} {
				gone := c.pvc.DeepCopy()
				gone.Finalizers = nil
				if err := ev.c.Update(ctx, gone); err != nil {
					t.Fatal(err)
				}
				if err := ev.c.Delete(ctx, gone); err != nil {
					t.Fatal(err)
				}
				remade := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: c.pvc.Name, UID: "uid-remade"}, Spec: corev1.PersistentVolumeClaimSpec{VolumeName: "pv-new"}}
				if err := ev.c.Create(ctx, remade); err != nil {
					t.Fatal(err)
				}
				old := pv(c.pv)
				old.Annotations[names.MigrationPhase] = names.MigrationSwitched
				if err := ev.c.Update(ctx, old); err != nil {
					t.Fatal(err)
				}
			}
			ev.until("node-a", renew, func() bool {
				return ev.node("node-a") == nil || !controllerutil.ContainsFinalizer(ev.node("node-a"), names.NodeLossFinalizer)
			})
			for _, name := range []string{"data-1", "data-2"} {
				if err := ev.c.Get(ctx, types.NamespacedName{Namespace: "ns", Name: name}, &corev1.PersistentVolumeClaim{}); err != nil {
					t.Errorf("claim %s made again by its migration: %v, want it kept", name, err)
				}
			}
			if gone := !ev.exists(pvMoving); gone != lost {
				t.Errorf("the moved volume's old PV released: %v, want %v", gone, lost)
			}
		})
	}
}
