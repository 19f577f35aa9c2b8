// Package nodeloss releases node-local volumes of nodes that are gone: when a
// Node is deleted, the PVCs bound to podvol volumes on it are deleted with
// their PVs, so that StatefulSets create them again and their pods schedule
// elsewhere instead of waiting forever for a node that will not come back. A
// finalizer on each Node makes sure no deletion is missed.
package nodeloss

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"
)

// Finalizer keeps a deleted Node until its volumes are released.
const Finalizer = "podvol.io/release-local-volumes"

// OptOut is the StorageClass parameter that keeps volumes of lost nodes.
const OptOut = "releaseOnNodeLoss"

// TopologyKey is the node-affinity key of podvol volumes.
const TopologyKey = "topology.podvol.io/node"

// Reconciler releases the volumes of deleted nodes.
type Reconciler struct {
	Client client.Client
	// APIReader reads PVs, PVCs and StorageClasses past the cache: the
	// release happens once, and what a stale cache misses then is never
	// released. SetupWithManager fills it in.
	APIReader client.Reader
	Recorder  events.EventRecorder
	Driver    string
}

// SetupWithManager watches Nodes.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	return ctrl.NewControllerManagedBy(mgr).Named("node-loss").For(&corev1.Node{}).Complete(r)
}

// Reconcile adds the finalizer to live nodes and releases the volumes of
// deleted ones.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	node := &corev1.Node{}
	if err := r.Client.Get(ctx, req.NamespacedName, node); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if node.DeletionTimestamp == nil {
		if controllerutil.AddFinalizer(node, Finalizer) {
			return ctrl.Result{}, r.Client.Update(ctx, node)
		}
		return ctrl.Result{}, nil
	}
	if !controllerutil.ContainsFinalizer(node, Finalizer) {
		return ctrl.Result{}, nil
	}
	if err := r.release(ctx, node.Name); err != nil {
		return ctrl.Result{}, err
	}
	controllerutil.RemoveFinalizer(node, Finalizer)
	return ctrl.Result{}, r.Client.Update(ctx, node)
}

func (r *Reconciler) release(ctx context.Context, nodeName string) error {
	pvs := &corev1.PersistentVolumeList{}
	if err := r.APIReader.List(ctx, pvs); err != nil {
		return err
	}
	classes := map[string]bool{} // StorageClass name -> release
	for i := range pvs.Items {
		pv := &pvs.Items[i]
		if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != r.Driver || !onNode(pv, nodeName) {
			continue
		}
		release, ok := classes[pv.Spec.StorageClassName]
		if !ok {
			sc := &storagev1.StorageClass{}
			err := r.APIReader.Get(ctx, client.ObjectKey{Name: pv.Spec.StorageClassName}, sc)
			release = apierrors.IsNotFound(err) || (err == nil && sc.Parameters[OptOut] != "false")
			if err != nil && !apierrors.IsNotFound(err) {
				return err
			}
			classes[pv.Spec.StorageClassName] = release
		}
		if !release {
			continue
		}
		if err := r.releasePV(ctx, pv, nodeName); err != nil {
			return err
		}
	}
	return nil
}

func (r *Reconciler) releasePV(ctx context.Context, pv *corev1.PersistentVolume, nodeName string) error {
	logger := log.FromContext(ctx)
	if ref := pv.Spec.ClaimRef; ref != nil {
		pvc := &corev1.PersistentVolumeClaim{}
		err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}, pvc)
		if err == nil && pvc.UID == ref.UID && pvc.DeletionTimestamp == nil {
			r.Recorder.Eventf(pvc, nil, corev1.EventTypeWarning, "NodeLost", "Release",
				"node %s was deleted and its local volume %s with it: deleting this claim so that its owner (e.g. a StatefulSet) creates a new one elsewhere", nodeName, pv.Name)
			if err := r.Client.Delete(ctx, pvc, client.Preconditions{UID: &pvc.UID}); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("delete PVC %s/%s of lost node %s: %w", pvc.Namespace, pvc.Name, nodeName, err)
			}
			logger.Info("Released PVC of a lost node", "pvc", ref.Namespace+"/"+ref.Name, "pv", pv.Name, "node", nodeName)
		} else if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	// Nobody can delete the volume on a node that is gone: delete the PV,
	// then drop the finalizers that wait for that volume. In that order:
	// external-provisioner and the PV protection controller add their
	// finalizer again to a bound PV that is not being deleted.
	if pv.DeletionTimestamp == nil {
		if err := r.Client.Delete(ctx, pv); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete PV %s of lost node %s: %w", pv.Name, nodeName, err)
		}
		deleting := &corev1.PersistentVolume{}
		if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(pv), deleting); err != nil {
			return client.IgnoreNotFound(err)
		}
		pv = deleting
	}
	kept := slices.DeleteFunc(slices.Clone(pv.Finalizers), func(f string) bool {
		return f == "kubernetes.io/pv-protection" || f == "external-provisioner.volume.kubernetes.io/finalizer"
	})
	if len(kept) == len(pv.Finalizers) {
		return nil
	}
	// If the PV changed meanwhile (another finalizer removed), the patch
	// fails on its resourceVersion and the node is looked at again.
	patch := client.MergeFromWithOptions(pv.DeepCopy(), client.MergeFromWithOptimisticLock{})
	pv.Finalizers = kept
	if err := r.Client.Patch(ctx, pv, patch); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("drop the finalizers of PV %s of lost node %s: %w", pv.Name, nodeName, err)
	}
	return nil
}

// onNode reports whether the PV's node affinity pins it to the node.
func onNode(pv *corev1.PersistentVolume, node string) bool {
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		return false
	}
	for _, t := range pv.Spec.NodeAffinity.Required.NodeSelectorTerms {
		for _, e := range t.MatchExpressions {
			if e.Key == TopologyKey && e.Operator == corev1.NodeSelectorOpIn && slices.Contains(e.Values, node) {
				return true
			}
		}
	}
	return false
}
