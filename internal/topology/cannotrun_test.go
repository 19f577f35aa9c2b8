package topology

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
)

// CannotRun judges as kube-scheduler's filters do; test/controller runs it
// in the reconciler against a real API server, this its edges.
func TestCannotRun(t *testing.T) {
	unschedulable := corev1.Taint{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule}
	node := func(cordoned bool, taints ...corev1.Taint) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{"zone": "a"}},
			Spec: corev1.NodeSpec{Unschedulable: cordoned, Taints: taints}}
	}
	for _, c := range []struct {
		what string
		pod  corev1.PodSpec
		node *corev1.Node
		want []string
	}{
		{"fits", corev1.PodSpec{NodeSelector: map[string]string{"zone": "a"}}, node(false), nil},
		{"PreferNoSchedule is a preference", corev1.PodSpec{}, node(false, corev1.Taint{Key: "k", Effect: corev1.TaintEffectPreferNoSchedule}), nil},
		{"NoExecute", corev1.PodSpec{}, node(false, corev1.Taint{Key: "k", Value: "v", Effect: corev1.TaintEffectNoExecute}),
			[]string{"taint k=v:NoExecute, which the pod does not tolerate"}},
		{"tolerated by Exists", corev1.PodSpec{Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}}},
			node(true, unschedulable, corev1.Taint{Key: "k", Effect: corev1.TaintEffectNoSchedule}), nil},
		{"cordoned, said once", corev1.PodSpec{}, node(true, unschedulable), []string{"the node is cordoned (unschedulable: drained or being drained)"}},
		{"its taint without the cordon", corev1.PodSpec{}, node(false, unschedulable),
			[]string{"taint node.kubernetes.io/unschedulable:NoSchedule, which the pod does not tolerate"}},
		{"bound to the node: not scheduled", corev1.PodSpec{NodeName: "node-a", NodeSelector: map[string]string{"zone": "b"}}, node(true), nil},
		{"bound elsewhere", corev1.PodSpec{NodeName: "node-b"}, node(false), []string{"it is bound to node node-b (spec.nodeName)"}},
		{"several", corev1.PodSpec{NodeSelector: map[string]string{"zone": "b"}}, node(true, corev1.Taint{Key: "k", Effect: corev1.TaintEffectNoSchedule}),
			[]string{"the node is cordoned (unschedulable: drained or being drained)", "taint k:NoSchedule, which the pod does not tolerate",
				"the pod's nodeSelector or required node affinity excludes the node"}},
	} {
		got := CannotRun(klog.Background(), &corev1.Pod{Spec: c.pod}, c.node)
		if strings.Join(got, "\n") != strings.Join(c.want, "\n") {
			t.Errorf("%s: got %q, want %q", c.what, got, c.want)
		}
	}
}
