// Package topology reads where a podvol volume lives from what Kubernetes
// keeps of it: a PV that podvol provisioned is pinned to one node by its
// required node affinity on names.TopologyKey (the topology CreateVolume
// returns).
package topology

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/podvol/podvol/internal/names"
)

// Node is the one node the PV's required node affinity names on the
// topology key, or "" when it names none (or several).
func Node(pv *corev1.PersistentVolume) string {
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		return ""
	}
	for _, t := range pv.Spec.NodeAffinity.Required.NodeSelectorTerms {
		for _, e := range t.MatchExpressions {
			if e.Key == names.TopologyKey && e.Operator == corev1.NodeSelectorOpIn && len(e.Values) == 1 {
				return e.Values[0]
			}
		}
	}
	return ""
}
