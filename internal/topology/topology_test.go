package topology

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/podvol/podvol/internal/names"
)

func TestNode(t *testing.T) {
	pv := func(key string, op corev1.NodeSelectorOperator, values ...string) *corev1.PersistentVolume {
		return &corev1.PersistentVolume{Spec: corev1.PersistentVolumeSpec{NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: key, Operator: op, Values: values}}}}}}}}
	}
	for _, c := range []struct {
		what string
		pv   *corev1.PersistentVolume
		want string
	}{
		{"podvol's", pv(names.TopologyKey, corev1.NodeSelectorOpIn, "node-1"), "node-1"},
		{"no affinity", &corev1.PersistentVolume{}, ""},
		{"another key", pv("kubernetes.io/hostname", corev1.NodeSelectorOpIn, "node-1"), ""},
		{"NotIn", pv(names.TopologyKey, corev1.NodeSelectorOpNotIn, "node-1"), ""},
		{"several nodes", pv(names.TopologyKey, corev1.NodeSelectorOpIn, "node-1", "node-2"), ""},
	} {
		if got := Node(c.pv); got != c.want {
			t.Errorf("%s: %q, want %q", c.what, got, c.want)
		}
	}
}
