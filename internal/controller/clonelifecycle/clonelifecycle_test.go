package clonelifecycle

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/podvol/podvol/internal/names"
)

// derive keeps the placement on the source's node of a claim that podvol
// placed there (its mark and the selected node agree), and no other
// selected node: the scheduler's choice for an earlier pod, or a placement
// the provisioner gave back, is not the next pod's.
func TestDerivePlacement(t *testing.T) {
	for _, c := range []struct {
		what           string
		ann            map[string]string
		selected, mark string
	}{
		{"placed on its source's node", map[string]string{names.SelectedNode: "node-a", names.SourceNode: "node-a"}, "node-a", "node-a"},
		{"placed by the scheduler", map[string]string{names.SelectedNode: "node-c"}, "", ""},
		{"placement given back", map[string]string{names.SourceNode: "node-a"}, "", ""},
		{"given back, and the scheduler chose another node", map[string]string{names.SelectedNode: "node-c", names.SourceNode: "node-a"}, "", ""},
		{"never placed", nil, "", ""},
	} {
		ann := map[string]string{names.Lifecycle: names.ResetOnDetach, names.Used: "true"}
		for k, v := range c.ann {
			ann[k] = v
		}
		old := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "work", Annotations: ann},
			Spec: corev1.PersistentVolumeClaimSpec{VolumeName: "pv-1",
				DataSource: &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "golden"}}}
		next := derive(types.NamespacedName{Namespace: "ns", Name: "work"}, old)
		// Derived again from the stash, as finishReset does.
		next = derive(types.NamespacedName{Namespace: "ns", Name: "work"}, next)
		if got := next.Annotations[names.SelectedNode]; got != c.selected {
			t.Errorf("%s: %s=%q, want %q", c.what, names.SelectedNode, got, c.selected)
		}
		if got := next.Annotations[names.SourceNode]; got != c.mark {
			t.Errorf("%s: %s=%q, want %q", c.what, names.SourceNode, got, c.mark)
		}
		if next.Annotations[names.Lifecycle] != names.ResetOnDetach || next.Annotations[names.Used] != "" || next.Spec.VolumeName != "" {
			t.Errorf("%s: %v %+v", c.what, next.Annotations, next.Spec)
		}
	}
}
