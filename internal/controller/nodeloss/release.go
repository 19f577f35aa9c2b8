package nodeloss

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/podvol/podvol/internal/names"
)

// Keeping and releasing the volumes of a deleted Node: its podvol PVs, and
// the deletion of each PV with its claim.

// podvolPVs lists, from the API, the podvol PVs whose node affinity pins them
// to the node.
func (r *Reconciler) podvolPVs(ctx context.Context, nodeName string) ([]*corev1.PersistentVolume, error) {
	pvs := &corev1.PersistentVolumeList{}
	if err := r.APIReader.List(ctx, pvs); err != nil {
		return nil, fmt.Errorf("list PVs of node %s: %w", nodeName, err)
	}
	var on []*corev1.PersistentVolume
	for i := range pvs.Items {
		pv := &pvs.Items[i]
		if pv.Spec.CSI != nil && pv.Spec.CSI.Driver == r.Driver && onNode(pv, nodeName) {
			on = append(on, pv)
		}
	}
	return on, nil
}

// keep tells the users of the volumes of a deleted but live node, and the
// admin, that nothing was released. Users look at their claims (they may
// not read Nodes or the default namespace's events); admins at the Node's
// events (kubectl get events --field-selector involvedObject.name=<node>,
// which outlive the Node).
func (r *Reconciler) keep(ctx context.Context, node *corev1.Node) error {
	pvs, err := r.podvolPVs(ctx, node.Name)
	if err != nil {
		return err
	}
	// A release cut short before this verdict (a failed step, a restart)
	// recorded volumes it did not release: those whose PV is still there
	// and not being deleted come out of the record.
	var intact []string
	for _, pv := range pvs {
		if pv.DeletionTimestamp == nil {
			intact = append(intact, pv.Name)
		}
	}
	if err := r.unrecord(ctx, node.Name, intact); err != nil {
		return err
	}
	for _, pv := range pvs {
		pvc, err := r.claimOf(ctx, pv)
		if err != nil {
			return err
		}
		if pvc == nil {
			continue
		}
		r.Recorder.Eventf(pvc, nil, corev1.EventTypeWarning, ReasonNotLost, "Keep",
			"node %s was deleted while its kubelet still renewed its Lease: the node is not lost, so its local volume %s and this claim are kept, with their data. Pods of this claim run only on %s: they run again once the node registers again (its kubelet does so when restarted). To give the claim up, delete it",
			node.Name, pv.Name, node.Name)
	}
	r.Recorder.Eventf(node, nil, corev1.EventTypeWarning, ReasonNotLost, "Keep",
		"Node deleted while its kubelet still renews its Lease %s/%s: not a lost node, so its %d podvol volumes are kept and nothing was released. A running kubelet does not register its Node again: restart it to bring the node back. To retire the node and release its volumes, stop its kubelet first, then delete the Node",
		corev1.NamespaceNodeLease, node.Name, len(pvs))
	return nil
}

// claimOf returns the PVC bound to the PV, if it still exists and is not
// being deleted.
func (r *Reconciler) claimOf(ctx context.Context, pv *corev1.PersistentVolume) (*corev1.PersistentVolumeClaim, error) {
	ref := pv.Spec.ClaimRef
	if ref == nil {
		return nil, nil
	}
	pvc := &corev1.PersistentVolumeClaim{}
	err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}, pvc)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read PVC %s/%s of PV %s: %w", ref.Namespace, ref.Name, pv.Name, err)
	}
	if pvc.UID != ref.UID || pvc.DeletionTimestamp != nil {
		return nil, nil
	}
	return pvc, nil
}

// release releases the podvol volumes of a node whose Lease went unrenewed
// for wait.
func (r *Reconciler) release(ctx context.Context, nodeName string, wait time.Duration) error {
	pvs, err := r.podvolPVs(ctx, nodeName)
	if err != nil {
		return err
	}
	classes := map[string]bool{} // StorageClass name -> release
	var released []*corev1.PersistentVolume
	for _, pv := range pvs {
		if migrating(pv) {
			continue // the migration re-makes its claim (holdForMigrations)
		}
		release, ok := classes[pv.Spec.StorageClassName]
		if !ok && pv.Spec.StorageClassName == "" {
			// A static PV of no class has none to opt out with (and
			// the client refuses to read an empty name).
			release, ok = true, true
		}
		if !ok {
			sc := &storagev1.StorageClass{}
			err := r.APIReader.Get(ctx, client.ObjectKey{Name: pv.Spec.StorageClassName}, sc)
			if err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("read StorageClass %s of PV %s: %w", pv.Spec.StorageClassName, pv.Name, err)
			}
			release = apierrors.IsNotFound(err) || sc.Parameters[names.ParamReleaseOnNodeLoss] != "false"
			classes[pv.Spec.StorageClassName] = release
		}
		if release {
			released = append(released, pv)
		}
	}
	// Written down before anything is released: a crash in between
	// leaves a record of volumes not yet released, never the reverse.
	if err := r.recordReleased(ctx, nodeName, released); err != nil {
		return err
	}
	for _, pv := range released {
		if err := r.releasePV(ctx, pv, nodeName, wait); err != nil {
			return err
		}
	}
	return nil
}

func (r *Reconciler) releasePV(ctx context.Context, pv *corev1.PersistentVolume, nodeName string, wait time.Duration) error {
	logger := log.FromContext(ctx)
	pvc, err := r.claimOf(ctx, pv)
	if err != nil {
		return err
	}
	if pvc != nil {
		r.Recorder.Eventf(pvc, nil, corev1.EventTypeWarning, ReasonLost, "Release",
			"node %s was deleted and its kubelet has not renewed its Lease for %s: the node is lost, and its local volume %s with it. Deleting this claim so that its owner (e.g. a StatefulSet) creates a new one elsewhere", nodeName, wait, pv.Name)
		if err := r.Client.Delete(ctx, pvc, client.Preconditions{UID: &pvc.UID}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete PVC %s/%s of lost node %s: %w", pvc.Namespace, pvc.Name, nodeName, err)
		}
		logger.Info("Released PVC of a lost node", "pvc", pvc.Namespace+"/"+pvc.Name, "pv", pv.Name, "node", nodeName)
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
			if apierrors.IsNotFound(err) {
				return nil
			}
			return fmt.Errorf("read PV %s of lost node %s: %w", pv.Name, nodeName, err)
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
			if e.Key == names.TopologyKey && e.Operator == corev1.NodeSelectorOpIn && slices.Contains(e.Values, node) {
				return true
			}
		}
	}
	return false
}
