package nodeloss

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/podvol/podvol/internal/names"
)

// A deleted Node and podvol-controller's migrations (internal/controller/
// migration): the Node is held while a volume is moved off it, and a lost
// node's migrations are told so.

// migrating: the PV's migration copies it or switches its claim to the
// copy. Its claim is the migration's to re-make, not node-loss's to
// release.
func migrating(pv *corev1.PersistentVolume) bool {
	p := pv.Annotations[names.MigrationPhase]
	return p == names.MigrationCopying || p == names.MigrationSwitching
}

// holdForMigrations reports whether a deleted Node must stay for the
// migrations of its volumes still in flight: the copy's node reads the
// source's address from the Node, and a migration that loses its source
// gets on only once told. For a lost node (lost), it marks those still
// copying (names.MigrationSourceLost: the copy's node then keeps what it
// holds if that is one instant, a pre-copy, and gives it up if not), and
// deletes at once the pods on the node of their claims: nothing runs them
// any more, and a pod left scheduled there keeps the claim the switch
// re-makes (pvc-protection), as PodGC would not delete it before the Node
// is gone.
func (r *Reconciler) holdForMigrations(ctx context.Context, node *corev1.Node, w *leaseWatch, lost bool) (bool, error) {
	pvs, err := r.podvolPVs(ctx, node.Name)
	if err != nil {
		return false, err
	}
	pvs = slices.DeleteFunc(pvs, func(pv *corev1.PersistentVolume) bool { return !migrating(pv) })
	if len(pvs) == 0 {
		return false, nil
	}
	if lost {
		for _, pv := range pvs {
			if err := r.tellLost(ctx, pv, node.Name); err != nil {
				return true, err
			}
		}
	}
	var which []string
	for _, pv := range pvs {
		which = append(which, pv.Name)
	}
	if !w.toldMigrations {
		w.toldMigrations = true
		r.Recorder.Eventf(node, nil, corev1.EventTypeNormal, ReasonHeldForMigration, "Hold",
			"Node deleted while %d of its podvol volumes are being moved to other nodes (PVs %s): the Node is kept until they are (or their migrations are given up), as their copies read the node's address from it",
			len(pvs), strings.Join(which, ", "))
	}
	log.FromContext(ctx).Info("Deleted node held: volumes are being moved off it", "node", node.Name, "pvs", which, "lost", lost)
	return true, nil
}

// tellLost marks a PV still copying off a lost node, and deletes the pods
// of its claim on that node.
func (r *Reconciler) tellLost(ctx context.Context, pv *corev1.PersistentVolume, nodeName string) error {
	if pv.Annotations[names.MigrationPhase] == names.MigrationCopying && pv.Annotations[names.MigrationSourceLost] == "" {
		patch := client.MergeFromWithOptions(pv.DeepCopy(), client.MergeFromWithOptimisticLock{})
		pv.Annotations[names.MigrationSourceLost] = time.Now().UTC().Format(time.RFC3339)
		if err := r.Client.Patch(ctx, pv, patch); err != nil {
			return fmt.Errorf("mark PV %s, being moved off lost node %s: %w", pv.Name, nodeName, err)
		}
		log.FromContext(ctx).Info("Told a migration its source node is lost", "pv", pv.Name, "node", nodeName)
	}
	ref := pv.Spec.ClaimRef
	if ref == nil {
		return nil
	}
	pods := &corev1.PodList{}
	if err := r.APIReader.List(ctx, pods, client.InNamespace(ref.Namespace)); err != nil {
		return fmt.Errorf("list the pods of claim %s/%s: %w", ref.Namespace, ref.Name, err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName != nodeName || p.DeletionGracePeriodSeconds != nil && *p.DeletionGracePeriodSeconds == 0 ||
			!slices.ContainsFunc(p.Spec.Volumes, func(v corev1.Volume) bool {
				return v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == ref.Name
			}) {
			continue
		}
		if err := r.Client.Delete(ctx, p, client.GracePeriodSeconds(0), client.Preconditions{UID: &p.UID}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("delete pod %s/%s of lost node %s: %w", p.Namespace, p.Name, nodeName, err)
		}
		log.FromContext(ctx).Info("Deleted a pod of a lost node whose claim is being moved", "pod", p.Namespace+"/"+p.Name, "node", nodeName)
	}
	return nil
}
