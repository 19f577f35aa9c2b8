// Package topology reads where a podvol volume lives from what Kubernetes
// keeps of it: a PV that podvol provisioned is pinned to one node by its
// required node affinity on names.TopologyKey (the topology CreateVolume
// returns).
package topology

import (
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"

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

// CannotRun says why kube-scheduler would not put the pod on the node (or
// why a pod bound to another node cannot be there), as its NodeName,
// NodeUnschedulable, TaintToleration and NodeAffinity filters judge; none
// when it could.
func CannotRun(logger klog.Logger, pod *corev1.Pod, node *corev1.Node) []string {
	if pod.Spec.NodeName != "" {
		if pod.Spec.NodeName != node.Name {
			return []string{fmt.Sprintf("it is bound to node %s (spec.nodeName)", pod.Spec.NodeName)}
		}
		return nil
	}
	tolerated := func(t *corev1.Taint) bool {
		return slices.ContainsFunc(pod.Spec.Tolerations, func(tol corev1.Toleration) bool {
			// Lt and Gt are compared where the API server admits
			// them.
			return tol.ToleratesTaint(logger, t, true)
		})
	}
	var why []string
	cordoned := node.Spec.Unschedulable
	if cordoned && !tolerated(&corev1.Taint{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule}) {
		why = append(why, "the node is cordoned (unschedulable: drained or being drained)")
	}
	for i := range node.Spec.Taints {
		t := &node.Spec.Taints[i]
		if t.Effect == corev1.TaintEffectPreferNoSchedule || (cordoned && t.Key == corev1.TaintNodeUnschedulable) {
			continue
		}
		if !tolerated(t) {
			why = append(why, fmt.Sprintf("taint %s, which the pod does not tolerate", t.ToString()))
		}
	}
	if ok, err := nodeaffinity.GetRequiredNodeAffinity(pod).Match(node); err == nil && !ok {
		why = append(why, "the pod's nodeSelector or required node affinity excludes the node")
	}
	return why
}
