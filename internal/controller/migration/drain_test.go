package migration

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/podvol/podvol/internal/names"
)

func tainted(name, key string) *corev1.Node {
	n := node(name, false)
	n.Spec.Taints = []corev1.Taint{{Key: key, Effect: corev1.TaintEffectNoSchedule}}
	return n
}

// cluster-autoscaler and Karpenter mark the node they remove with a taint,
// not a cordon: that starts a migration too (and their evictions then wait
// as a drain's do), and such a node is no target; their taints coming and
// going wake the node's PVs.
func TestAutoscalersDrainToo(t *testing.T) {
	class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "podvol"}, Provisioner: names.Driver}
	for _, key := range drainTaints {
		t.Run(key, func(t *testing.T) {
			e := newEnv(t, tainted("node-a", key), tainted("node-b", key), node("node-c", false), class, claim(optedIn),
				capacity("node-b", "9Gi"), capacity("node-c", "5Gi"), pvOn("pv-old", "node-a", "pv-0123456789abcdef01234567", oldRef))
			e.reconcile(t)
			if got := e.pv(t, "pv-old").Annotations[names.MigrationTarget]; got != "node-c" {
				t.Fatalf("target %q, want node-c (node-b is being removed too) (events: %s)", got, e.events())
			}
			up := event.UpdateEvent{ObjectOld: node("node-a", false), ObjectNew: tainted("node-a", key)}
			down := event.UpdateEvent{ObjectOld: tainted("node-a", key), ObjectNew: node("node-a", false)}
			if !cordonChanged.Update(up) || !cordonChanged.Update(down) {
				t.Error("the autoscaler's taint coming or going does not wake the node's PVs")
			}
		})
	}
	// A taint of another key, or a softer effect, is no drain.
	soft := tainted("node-a", "DeletionCandidateOfClusterAutoscaler")
	soft.Spec.Taints[0].Effect = corev1.TaintEffectPreferNoSchedule
	for _, n := range []*corev1.Node{tainted("node-a", "example.com/maintenance"), soft} {
		if draining(n) {
			t.Errorf("%v counts as a drain", n.Spec.Taints)
		}
	}
}
