package migration

import corev1 "k8s.io/api/core/v1"

// drainTaints are the taints with which autoscalers mark a node they are
// removing, in place of a cordon: cluster-autoscaler's (unless it runs with
// --cordon-node-before-terminating) and Karpenter's. Both then evict the
// node's pods through the Eviction API.
var drainTaints = []string{"ToBeDeletedByClusterAutoscaler", "karpenter.sh/disrupted"}

// draining: the node is cordoned, or marked by an autoscaler that removes
// it; its volumes that ask to follow their pods move.
func draining(n *corev1.Node) bool {
	if n.Spec.Unschedulable {
		return true
	}
	for _, t := range n.Spec.Taints {
		for _, k := range drainTaints {
			if t.Key == k && t.Effect == corev1.TaintEffectNoSchedule {
				return true
			}
		}
	}
	return false
}
