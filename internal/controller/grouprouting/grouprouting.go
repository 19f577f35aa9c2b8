// Package grouprouting routes VolumeGroupSnapshotContents to the node whose
// pool holds their volumes. snapshot-controller labels the content of a
// single snapshot with its volume's node (distributed snapshotting), so that
// only that node's csi-snapshotter takes it; it labels no group content. This
// controller does, with the label podvol-group-snapshotter selects on: the
// node of the members' PVs for a content snapshot-controller made, the node
// the handle names for one an admin made from an existing group snapshot.
// A group whose volumes live on several nodes cannot be one podvol snapshot
// (each pool freezes and reflinks only its own): it is left unlabelled, with
// a Warning on the content and on the VolumeGroupSnapshot naming the nodes.
package grouprouting

import (
	"context"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/podvol/podvol/internal/controller/snapshotimport"
	"github.com/podvol/podvol/internal/snaphandle"
	"github.com/podvol/podvol/internal/topology"
)

// Event reasons.
const (
	ReasonRouted     = "GroupSnapshotRoutedToNode"
	ReasonSpansNodes = "GroupSnapshotSpansNodes"
	ReasonNoNode     = "GroupSnapshotNodeUnknown"
	ReasonWaiting    = "GroupSnapshotVolumeNotFound"
)

// Kinds this controller reads and labels.
var (
	ContentGVK = schema.GroupVersionKind{Group: "groupsnapshot.storage.k8s.io", Version: "v1", Kind: "VolumeGroupSnapshotContent"}
	GroupGVK   = schema.GroupVersionKind{Group: "groupsnapshot.storage.k8s.io", Version: "v1", Kind: "VolumeGroupSnapshot"}
)

// Reconciler labels Driver's VolumeGroupSnapshotContents with their node.
type Reconciler struct {
	Client   client.Client
	Recorder events.EventRecorder
	Driver   string
}

func content() *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(ContentGVK)
	return u
}

// SetupWithManager watches VolumeGroupSnapshotContents, and PVs: a content
// can name a volume whose PV the cache has not seen yet. A cluster without
// the group snapshot CRDs has nothing to route.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if _, err := mgr.GetRESTMapper().RESTMapping(ContentGVK.GroupKind(), ContentGVK.Version); meta.IsNoMatchError(err) {
		mgr.GetLogger().Info("VolumeGroupSnapshotContent is not served (group snapshot CRDs not installed): group-snapshot-routing is idle until podvol-controller restarts after they are")
		return nil
	} else if err != nil {
		return fmt.Errorf("look up %s: %w", ContentGVK, err)
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("group-snapshot-routing").
		For(content(), builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			u, ok := o.(*unstructured.Unstructured)
			return ok && r.unrouted(u)
		}))).
		Watches(&corev1.PersistentVolume{}, handler.EnqueueRequestsFromMapFunc(r.contentsOf)).
		Complete(r)
}

// contentsOf maps a PV of ours to the unrouted contents that name it.
func (r *Reconciler) contentsOf(ctx context.Context, o client.Object) []reconcile.Request {
	pv, ok := o.(*corev1.PersistentVolume)
	if !ok || pv.Spec.CSI == nil || pv.Spec.CSI.Driver != r.Driver {
		return nil
	}
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(ContentGVK.GroupVersion().WithKind(ContentGVK.Kind + "List"))
	if err := r.Client.List(ctx, list); err != nil {
		log.FromContext(ctx).Error(err, "list VolumeGroupSnapshotContents for a PV", "pv", pv.Name)
		return nil
	}
	var out []reconcile.Request
	for i := range list.Items {
		u := &list.Items[i]
		if !r.unrouted(u) {
			continue
		}
		handles, _, _ := unstructured.NestedStringSlice(u.Object, "spec", "source", "volumeHandles")
		for _, h := range handles {
			if h == pv.Spec.CSI.VolumeHandle {
				out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Name: u.GetName()}})
				break
			}
		}
	}
	return out
}

// unrouted tells whether a content is one of ours that no node takes yet.
func (r *Reconciler) unrouted(u *unstructured.Unstructured) bool {
	d, _, _ := unstructured.NestedString(u.Object, "spec", "driver")
	return d == r.Driver && u.GetLabels()[snapshotimport.ManagedBy] == "" && u.GetDeletionTimestamp() == nil
}

func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	u := content()
	if err := r.Client.Get(ctx, req.NamespacedName, u); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !r.unrouted(u) {
		return reconcile.Result{}, nil
	}
	node, err := r.nodeOf(ctx, u)
	if err != nil || node == "" {
		return reconcile.Result{}, err
	}
	if errs := validation.IsValidLabelValue(node); len(errs) > 0 {
		r.warn(u, ReasonNoNode, "its volumes live on node %q, which cannot be the value of label %s (%s): no node can take this group snapshot",
			node, snapshotimport.ManagedBy, strings.Join(errs, "; "))
		return reconcile.Result{}, nil
	}
	patch := client.MergeFrom(u.DeepCopy())
	labels := u.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels[snapshotimport.ManagedBy] = node
	u.SetLabels(labels)
	if err := r.Client.Patch(ctx, u, patch); err != nil {
		return reconcile.Result{}, fmt.Errorf("label VolumeGroupSnapshotContent %s %s=%s: %w", u.GetName(), snapshotimport.ManagedBy, node, err)
	}
	log.FromContext(ctx).Info("Routed a group snapshot to its node", "content", u.GetName(), "node", node)
	r.Recorder.Eventf(u, nil, corev1.EventTypeNormal, ReasonRouted, "Route",
		"its volumes live on node %s: labelled %s=%s for that node's podvol-group-snapshotter", node, snapshotimport.ManagedBy, node)
	return reconcile.Result{}, nil
}

// nodeOf returns the node of a content's volumes, or "" after saying on
// the content (and its VolumeGroupSnapshot) why there is none yet.
func (r *Reconciler) nodeOf(ctx context.Context, u *unstructured.Unstructured) (string, error) {
	if h, _, _ := unstructured.NestedString(u.Object, "spec", "source", "groupSnapshotHandles", "volumeGroupSnapshotHandle"); h != "" {
		if _, node := snaphandle.Parse(h); node != "" {
			return node, nil
		}
		r.warn(u, ReasonNoNode, "group snapshot handle %q names no node, so podvol cannot tell which node's pool holds it: label this content %s=<that node>", h, snapshotimport.ManagedBy)
		return "", nil
	}
	handles, _, _ := unstructured.NestedStringSlice(u.Object, "spec", "source", "volumeHandles")
	if len(handles) == 0 {
		return "", nil
	}
	var pvs corev1.PersistentVolumeList
	if err := r.Client.List(ctx, &pvs); err != nil {
		return "", fmt.Errorf("list PVs: %w", err)
	}
	byHandle := map[string]*corev1.PersistentVolume{}
	for i := range pvs.Items {
		pv := &pvs.Items[i]
		if pv.Spec.CSI != nil && pv.Spec.CSI.Driver == r.Driver {
			byHandle[pv.Spec.CSI.VolumeHandle] = pv
		}
	}
	nodes := map[string][]string{} // node -> its members (claims, or PVs)
	for _, h := range handles {
		pv := byHandle[h]
		if pv == nil {
			// The PV watch brings the content back when it appears.
			r.warn(u, ReasonWaiting, "volume %s has no PersistentVolume of driver %s: waiting for it", h, r.Driver)
			return "", nil
		}
		node := topology.Node(pv)
		if node == "" {
			r.warn(u, ReasonNoNode, "PersistentVolume %s names no node in its node affinity, so podvol cannot tell which node's pool holds it", pv.Name)
			return "", nil
		}
		member := pv.Name
		if c := pv.Spec.ClaimRef; c != nil {
			member = c.Namespace + "/" + c.Name
		}
		nodes[node] = append(nodes[node], member)
	}
	if len(nodes) > 1 {
		var parts []string
		for n, m := range nodes {
			sort.Strings(m)
			parts = append(parts, fmt.Sprintf("%s (%s)", n, strings.Join(m, ", ")))
		}
		sort.Strings(parts)
		r.warn(u, ReasonSpansNodes, "its volumes live on %d nodes: %s. A podvol group snapshot captures volumes of one node's pool at one instant; "+
			"delete this VolumeGroupSnapshot and select claims of one node (pods that share a node share their claims' node: place the claims with a pod that uses them all)",
			len(nodes), strings.Join(parts, "; "))
		return "", nil
	}
	for n := range nodes {
		return n, nil
	}
	return "", nil
}

// warn records a Warning on the content and on the VolumeGroupSnapshot it
// was made for: the user looks at the latter.
func (r *Reconciler) warn(u *unstructured.Unstructured, reason, format string, args ...any) {
	r.Recorder.Eventf(u, nil, corev1.EventTypeWarning, reason, "Route", format, args...)
	name, _, _ := unstructured.NestedString(u.Object, "spec", "volumeGroupSnapshotRef", "name")
	ns, _, _ := unstructured.NestedString(u.Object, "spec", "volumeGroupSnapshotRef", "namespace")
	uid, _, _ := unstructured.NestedString(u.Object, "spec", "volumeGroupSnapshotRef", "uid")
	if name == "" || ns == "" {
		return
	}
	g := &unstructured.Unstructured{}
	g.SetGroupVersionKind(GroupGVK)
	g.SetName(name)
	g.SetNamespace(ns)
	g.SetUID(types.UID(uid))
	r.Recorder.Eventf(g, nil, corev1.EventTypeWarning, reason, "Route", "group snapshot content %s: "+format, append([]any{u.GetName()}, args...)...)
}
