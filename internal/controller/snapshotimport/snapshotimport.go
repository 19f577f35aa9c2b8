// Package snapshotimport routes imported snapshots, and the members of group
// snapshots, to their node. podvol's snapshots live in one node's pool, and
// each node's csi-snapshotter (--node-deployment) takes only the
// VolumeSnapshotContents labelled with its node. snapshot-controller labels
// the contents it creates for a VolumeSnapshot, but a content an admin
// creates for an existing snapshot handle (a pre-provisioned snapshot: an
// import, a restore from a retained content) carries no label, nor do the
// contents snapshot-controller creates for a VolumeGroupSnapshot's members,
// and no sidecar would ever process them. podvol's snapshot handles name
// their node (package snaphandle): this controller reads it (a member's from
// its group's handle) and labels such contents.
package snapshotimport

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/podvol/podvol/internal/names"
	"github.com/podvol/podvol/internal/snaphandle"
)

// ManagedBy is the label by which a node's csi-snapshotter picks its
// contents (external-snapshotter's distributed snapshotting).
const ManagedBy = names.SnapshotManagedBy

// Event reasons.
const (
	ReasonRouted      = "SnapshotRoutedToNode"
	ReasonNoNode      = "SnapshotNodeUnknown"
	ReasonNodeMissing = "SnapshotNodeMissing"
)

// ContentGVK is the kind this controller labels.
var ContentGVK = schema.GroupVersionKind{Group: "snapshot.storage.k8s.io", Version: "v1", Kind: "VolumeSnapshotContent"}

// Reconciler labels Driver's imported VolumeSnapshotContents.
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

// SetupWithManager watches VolumeSnapshotContents. A cluster without the
// snapshot CRDs has no snapshots to route: the controller then stays idle
// (restart podvol-controller after installing them).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if _, err := mgr.GetRESTMapper().RESTMapping(ContentGVK.GroupKind(), ContentGVK.Version); meta.IsNoMatchError(err) {
		mgr.GetLogger().Info("VolumeSnapshotContent is not served (snapshot CRDs not installed): snapshot-import is idle until podvol-controller restarts after they are")
		return nil
	} else if err != nil {
		return fmt.Errorf("look up %s: %w", ContentGVK, err)
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("snapshot-import").
		For(content(), builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			u, ok := o.(*unstructured.Unstructured)
			if !ok {
				return false
			}
			_, ok = unrouted(u, r.Driver)
			return ok
		}))).
		Complete(r)
}

// GroupHandleAnnotation marks a member of a group snapshot: the contents
// snapshot-controller makes for a VolumeGroupSnapshot's members carry the
// group's handle in it, and no label (it labels only the contents of single
// snapshots).
const GroupHandleAnnotation = "groupsnapshot.storage.k8s.io/volumeGroupSnapshotHandle"

// unrouted tells whether a content is one of ours that no node takes yet,
// and the handle that names its node: an imported snapshot's, or the group's
// of a group snapshot's member (whose own handle comes later, in its status;
// the group's handle names the same node, as a group never spans two).
func unrouted(u *unstructured.Unstructured, driver string) (handle string, ok bool) {
	d, _, _ := unstructured.NestedString(u.Object, "spec", "driver")
	handle, _, _ = unstructured.NestedString(u.Object, "spec", "source", "snapshotHandle")
	if handle == "" {
		handle = u.GetAnnotations()[GroupHandleAnnotation]
	}
	return handle, d == driver && handle != "" && u.GetLabels()[ManagedBy] == "" && u.GetDeletionTimestamp() == nil
}

func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	u := content()
	if err := r.Client.Get(ctx, req.NamespacedName, u); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	handle, ok := unrouted(u, r.Driver)
	if !ok {
		return reconcile.Result{}, nil
	}
	_, node := snaphandle.Parse(handle)
	if node == "" {
		r.Recorder.Eventf(u, nil, corev1.EventTypeWarning, ReasonNoNode, "Route",
			"snapshot handle %q names no node (made before podvol named nodes in handles), so podvol cannot tell which node's pool holds it: label this content %s=<that node> and its node's csi-snapshotter will take it", handle, ManagedBy)
		return reconcile.Result{}, nil
	}
	if errs := validation.IsValidLabelValue(node); len(errs) > 0 {
		// csi-snapshotter finds its contents by this label: a node whose
		// name cannot be one cannot take any (nor can it run distributed
		// snapshotting at all), and a retry would not change that.
		r.Recorder.Eventf(u, nil, corev1.EventTypeWarning, ReasonNoNode, "Route",
			"snapshot handle %q names node %q, which cannot be the value of label %s (%s): no csi-snapshotter can take this content; check the handle",
			handle, node, ManagedBy, strings.Join(errs, "; "))
		return reconcile.Result{}, nil
	}
	patch := client.MergeFrom(u.DeepCopy())
	labels := u.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels[ManagedBy] = node
	u.SetLabels(labels)
	if err := r.Client.Patch(ctx, u, patch); err != nil {
		return reconcile.Result{}, fmt.Errorf("label VolumeSnapshotContent %s %s=%s: %w", u.GetName(), ManagedBy, node, err)
	}
	log.FromContext(ctx).Info("Routed an imported snapshot to its node", "content", u.GetName(), "handle", handle, "node", node)
	var n corev1.Node
	switch err := r.Client.Get(ctx, client.ObjectKey{Name: node}, &n); {
	case apierrors.IsNotFound(err):
		r.Recorder.Eventf(u, nil, corev1.EventTypeWarning, ReasonNodeMissing, "Route",
			"snapshot handle %q lives on node %s, which is not in the cluster: the content stays unprocessed until that node (and its pool) is back", handle, node)
	case err != nil:
		return reconcile.Result{}, err
	default:
		r.Recorder.Eventf(u, nil, corev1.EventTypeNormal, ReasonRouted, "Route",
			"snapshot handle %q lives on node %s: labelled %s=%s for that node's csi-snapshotter", handle, node, ManagedBy, node)
	}
	return reconcile.Result{}, nil
}
