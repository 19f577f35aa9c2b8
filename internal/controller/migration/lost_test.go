package migration

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/podvol/podvol/internal/names"
)

// A source node lost during the copy: the copy's node says on the copy's
// claim what it kept. Nothing that is one instant: the migration is
// cancelled (node-loss then releases the claim, as any lost node's). The
// pre-copy: the claim is switched to it, with a Warning saying which
// instant it holds, and the old volume is kept for good (Retain).
func TestCopyOfALostSource(t *testing.T) {
	for _, kept := range []bool{false, true} {
		t.Run(map[bool]string{false: "nothing kept", true: "the pre-copy kept"}[kept], func(t *testing.T) {
			old := claim(optedIn)
			clone := (&Reconciler{}).cloneFor(copying("node-b"), old)
			if kept {
				clone.Spec.VolumeName = "pv-new"
				clone.Status.Phase = corev1.ClaimBound
				clone.Status.Conditions = []corev1.PersistentVolumeClaimCondition{{Type: names.DataCopied, Status: corev1.ConditionTrue,
					Reason: names.ReasonPreCopyOnly, Message: "node node-a is lost before the last of volume v's data was copied: this copy holds the volume as it was at 2026-12-03T10:00:00Z"}}
			} else {
				clone.Status.Conditions = []corev1.PersistentVolumeClaimCondition{{Type: names.DataCopied, Status: corev1.ConditionFalse,
					Reason: names.ReasonSourceLost, Message: "node node-a is lost, and this node holds no copy of it that is one instant"}}
			}
			pv := copying("node-b")
			pv.Annotations[names.MigrationSourceLost] = "2026-12-03T10:05:00Z"
			e := newEnv(t, node("node-a", true), node("node-b", false), old, clone, pv)
			e.reconcile(t)
			got := e.pv(t, "pv-old")
			ev := e.events()
			if !kept {
				if err := e.c.Get(context.Background(), client.ObjectKeyFromObject(clone), &corev1.PersistentVolumeClaim{}); !apierrors.IsNotFound(err) {
					t.Errorf("the copy given up by its node: %v, want its claim deleted", err)
				}
				if got.Annotations[names.MigrationPhase] != "" || !strings.Contains(ev, "MigrationCancelled") || !strings.Contains(ev, "no copy of it that is one instant") {
					t.Errorf("PV %v, events %q; want the migration cancelled, saying why", got.Annotations, ev)
				}
				return
			}
			if got.Annotations[names.MigrationPhase] != names.MigrationSwitching || got.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimRetain ||
				got.Annotations[names.MigrationReclaim] != string(corev1.PersistentVolumeReclaimRetain) {
				t.Errorf("PV %v, policy %s; want switching, the old volume kept for good", got.Annotations, got.Spec.PersistentVolumeReclaimPolicy)
			}
			if !strings.Contains(ev, "Warning MigrationFromPreCopy") || !strings.Contains(ev, "2026-12-03T10:00:00Z") {
				t.Errorf("events %q, want a Warning saying which instant the copy holds", ev)
			}
		})
	}
}
