// Package migration moves the volumes of claims opted in
// (podvol.io/migrate-on-drain: "true", or the class parameter
// migrateOnDrain) off a node that is cordoned, as kubectl drain does first,
// so that their pods start elsewhere with their data.
//
// The copy is a clone on the target node, made by a claim of the
// controller's (podvol-move-<claim UID>, in the claim's namespace, a clone
// of the claim, placed on the target): the target's plugin pulls the
// volume while the pod still runs, then, once the pod is gone and the
// volume unstaged, what changed since (internal/mobility). The PV being
// moved records the migration (its target, that claim, the phase), marks
// only podvol-controller writes: the source's plugin serves a migration's
// pull only for the claim and node they name.
//
// Once the clone is bound the claim is switched to it. A PV's node affinity
// cannot change, so the claim is re-made the way clone-lifecycle re-makes
// one: both PVs held at Retain, the claim stashed in the controller's
// namespace, the clone's claim deleted, its PV pre-bound to the claim's
// name, the claim deleted and created again from the stash bound to that
// PV (a StatefulSet that re-creates the claim first gets the same PV: it
// is pre-bound by name). The old volume is deleted only once a pod of the
// claim runs on the new node, or the claim has moved on.
package migration

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/podvol/podvol/internal/names"
	"github.com/podvol/podvol/internal/topology"
)

// Reconciler migrates the volumes of cordoned nodes, one PV at a time.
type Reconciler struct {
	Client client.Client
	// APIReader reads the stash (not cached) and, before a step that
	// cannot be taken back, the live objects.
	APIReader client.Reader
	Recorder  events.EventRecorder
	// Driver is podvol's name.
	Driver string
	// StashNamespace is podvol-controller's own namespace; empty:
	// $POD_NAMESPACE, else kube-system.
	StashNamespace string
	// Poll is how often a migration in progress is looked at (5 s if 0):
	// the clone's copy and the pods are not watched.
	Poll time.Duration
	// StuckGrace is how long a pod of a claim being switched may stay on
	// the old node past its deletion's deadline before it is deleted at
	// once (1 minute if 0): its node's kubelet does not finish it.
	StuckGrace time.Duration
}

const stashKey = "pvc.json"

func (r *Reconciler) stashNamespace() string {
	if r.StashNamespace != "" {
		return r.StashNamespace
	}
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	return metav1.NamespaceSystem
}

func (r *Reconciler) poll() time.Duration {
	if r.Poll > 0 {
		return r.Poll
	}
	return 5 * time.Second
}

func (r *Reconciler) stuckGrace() time.Duration {
	if r.StuckGrace > 0 {
		return r.StuckGrace
	}
	return time.Minute
}

// sizeOf is the size a copy of pv for pvc must have: the largest of the
// PV's capacity and the claim's request and status. An expansion shows on
// the claim first, on the PV once external-resizer took it, and grows the
// volume on its node (NodeExpandVolume) while it is staged: a copy of the
// old size could not take the last data.
func sizeOf(pv *corev1.PersistentVolume, pvc *corev1.PersistentVolumeClaim) resource.Quantity {
	q := pv.Spec.Capacity[corev1.ResourceStorage]
	if pvc == nil {
		return q
	}
	for _, c := range []resource.Quantity{pvc.Spec.Resources.Requests[corev1.ResourceStorage], pvc.Status.Capacity[corev1.ResourceStorage]} {
		if c.Cmp(q) > 0 {
			q = c
		}
	}
	return q
}

// stale says whether the cached pv is behind the API server's: a step
// that cannot be taken back (the copy's claim deleted or made) is decided
// on the live one. A cache that lags may not show a switch begun.
func (r *Reconciler) stale(ctx context.Context, pv *corev1.PersistentVolume) (bool, error) {
	live := &corev1.PersistentVolume{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(pv), live); err != nil {
		return true, client.IgnoreNotFound(err)
	}
	return live.ResourceVersion != pv.ResourceVersion, nil
}

// SetupWithManager watches podvol's PVs and the nodes they are on.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("migration").
		For(&corev1.PersistentVolume{}).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			pvs := &corev1.PersistentVolumeList{}
			if err := r.Client.List(ctx, pvs); err != nil {
				log.FromContext(ctx).Error(err, "List PVs for a node's change")
				return nil
			}
			var reqs []reconcile.Request
			for i := range pvs.Items {
				if topology.Node(&pvs.Items[i]) == o.GetName() {
					reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Name: pvs.Items[i].Name}})
				}
			}
			return reqs
		}), builder.WithPredicates(cordonChanged)).
		Complete(r)
}

// cordonChanged passes the Node events that can start or cancel a
// migration (a cordon, or an autoscaler's mark: draining): a node's kubelet
// updates its Node's status every few seconds, and each would otherwise
// list every PV.
var cordonChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, okOld := e.ObjectOld.(*corev1.Node)
		n, okNew := e.ObjectNew.(*corev1.Node)
		return !okOld || !okNew || draining(o) != draining(n)
	},
	GenericFunc: func(event.GenericEvent) bool { return false },
}

// CloneName is the name of the claim that copies claim uid's volume.
func CloneName(uid types.UID) string { return "podvol-move-" + string(uid) }

// Reconcile moves one PV's claim along: start, copy, switch, clean up.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	pv := &corev1.PersistentVolume{}
	if err := r.Client.Get(ctx, req.NamespacedName, pv); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != r.Driver || pv.DeletionTimestamp != nil {
		return reconcile.Result{}, nil
	}
	switch pv.Annotations[names.MigrationPhase] {
	case "":
		return r.start(ctx, pv)
	case names.MigrationCopying:
		return r.copying(ctx, pv)
	case names.MigrationSwitching:
		return r.switching(ctx, pv)
	case names.MigrationSwitched:
		return r.cleanUp(ctx, pv)
	}
	return reconcile.Result{}, nil
}

// claimOf is the claim pv is bound to, if it still is (nil if not).
func (r *Reconciler) claimOf(ctx context.Context, pv *corev1.PersistentVolume) (*corev1.PersistentVolumeClaim, error) {
	ref := pv.Spec.ClaimRef
	if ref == nil {
		return nil, nil
	}
	pvc := &corev1.PersistentVolumeClaim{}
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}, pvc)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if pvc.UID != ref.UID || pvc.Spec.VolumeName != pv.Name {
		return nil, nil
	}
	return pvc, nil
}

// optedIn: the claim, or else its class, asks to follow its pod.
func (r *Reconciler) optedIn(ctx context.Context, pvc *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) (bool, error) {
	if v, ok := pvc.Annotations[names.MigrateOnDrain]; ok {
		return v == "true", nil
	}
	if pv.Spec.StorageClassName == "" {
		return false, nil
	}
	sc := &storagev1.StorageClass{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: pv.Spec.StorageClassName}, sc); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	return sc.Parameters[names.ParamMigrateOnDrain] == "true", nil
}

// start begins the migration of a bound, opted-in PV whose node is
// cordoned: it picks a target and records it on the PV.
func (r *Reconciler) start(ctx context.Context, pv *corev1.PersistentVolume) (reconcile.Result, error) {
	nodeName := topology.Node(pv)
	if nodeName == "" || pv.Status.Phase != corev1.VolumeBound {
		return reconcile.Result{}, nil
	}
	node := &corev1.Node{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: nodeName}, node); err != nil || !draining(node) {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	pvc, err := r.claimOf(ctx, pv)
	if err != nil || pvc == nil || pvc.DeletionTimestamp != nil {
		return reconcile.Result{}, err
	}
	if ok, err := r.optedIn(ctx, pvc, pv); err != nil || !ok {
		return reconcile.Result{}, err
	}
	target, why, err := r.pickTarget(ctx, pv, pvc)
	if err != nil {
		return reconcile.Result{}, err
	}
	if target == "" {
		r.Recorder.Eventf(pvc, pv, corev1.EventTypeWarning, "MigrationNoTarget", "Migrate",
			"node %s is cordoned and this claim asks to follow its pod (%s), but no node can take its volume: %s. It stays on node %s (a drain does not delete it); uncordon the node or make room, and the migration starts",
			nodeName, names.MigrateOnDrain, why, nodeName)
		return reconcile.Result{RequeueAfter: 30 * time.Second}, nil
	}
	patch := client.MergeFromWithOptions(pv.DeepCopy(), client.MergeFromWithOptimisticLock{})
	if pv.Annotations == nil {
		pv.Annotations = map[string]string{}
	}
	pv.Annotations[names.MigrationTarget] = target
	pv.Annotations[names.MigrationClaim] = pvc.Namespace + "/" + CloneName(pvc.UID)
	pv.Annotations[names.MigrationPhase] = names.MigrationCopying
	pv.Annotations[names.MigrationStarted] = time.Now().UTC().Format(time.RFC3339)
	if err := r.Client.Patch(ctx, pv, patch); err != nil {
		return reconcile.Result{}, err
	}
	r.Recorder.Eventf(pvc, pv, corev1.EventTypeNormal, "MigrationStarted", "Migrate",
		"node %s is cordoned: copying this claim's volume (%s) to node %s while its pod runs, the rest once the pod is gone; claim %s shows the copy's progress",
		nodeName, pv.Spec.CSI.VolumeHandle, target, CloneName(pvc.UID))
	log.FromContext(ctx).Info("Migration started", "pv", pv.Name, "claim", pvc.Namespace+"/"+pvc.Name, "from", nodeName, "to", target)
	return reconcile.Result{RequeueAfter: 100 * time.Millisecond}, nil
}

// pickTarget is the schedulable node, other than the PV's, with room for
// the volume in its class (CSIStorageCapacity) that every pod of the claim
// can run on, the one with the most room; "" and why if none.
func (r *Reconciler) pickTarget(ctx context.Context, pv *corev1.PersistentVolume, pvc *corev1.PersistentVolumeClaim) (string, string, error) {
	size := sizeOf(pv, pvc)
	caps := &storagev1.CSIStorageCapacityList{}
	if err := r.Client.List(ctx, caps); err != nil {
		return "", "", fmt.Errorf("list CSIStorageCapacities: %w", err)
	}
	room := map[string]resource.Quantity{}
	for _, c := range caps.Items {
		if c.StorageClassName != pv.Spec.StorageClassName || c.NodeTopology == nil || c.Capacity == nil {
			continue
		}
		n := c.NodeTopology.MatchLabels[names.TopologyKey]
		q := *c.Capacity
		if c.MaximumVolumeSize != nil && c.MaximumVolumeSize.Cmp(q) < 0 {
			q = *c.MaximumVolumeSize
		}
		if n != "" && q.Cmp(size) >= 0 {
			room[n] = q
		}
	}
	pods, err := r.podsOf(ctx, pvc)
	if err != nil {
		return "", "", err
	}
	nodes := &corev1.NodeList{}
	if err := r.Client.List(ctx, nodes); err != nil {
		return "", "", err
	}
	var best string
	var bestRoom resource.Quantity
	var whyNot []string
	for i := range nodes.Items {
		n := &nodes.Items[i]
		if n.Name == topology.Node(pv) {
			continue
		}
		if draining(n) {
			whyNot = append(whyNot, n.Name+": cordoned or being removed")
			continue
		}
		q, ok := room[n.Name]
		if !ok {
			whyNot = append(whyNot, fmt.Sprintf("%s: no room for %s in class %s", n.Name, size.String(), pv.Spec.StorageClassName))
			continue
		}
		fits := true
		for _, p := range pods {
			// The pod as a new one would be: not bound to a node yet.
			p := p.DeepCopy()
			p.Spec.NodeName = ""
			if why := topology.CannotRun(log.FromContext(ctx), p, n); len(why) > 0 {
				whyNot = append(whyNot, fmt.Sprintf("%s: pod %s cannot run there (%s)", n.Name, p.Name, why[0]))
				fits = false
				break
			}
		}
		if fits && (best == "" || q.Cmp(bestRoom) > 0) {
			best, bestRoom = n.Name, q
		}
	}
	if best == "" && len(whyNot) == 0 {
		whyNot = append(whyNot, "no other node")
	}
	return best, fmt.Sprint(whyNot), nil
}

// podsOf are the pods that use the claim and have not finished.
func (r *Reconciler) podsOf(ctx context.Context, pvc *corev1.PersistentVolumeClaim) ([]corev1.Pod, error) {
	pods := &corev1.PodList{}
	if err := r.Client.List(ctx, pods, client.InNamespace(pvc.Namespace)); err != nil {
		return nil, err
	}
	var out []corev1.Pod
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if slices.ContainsFunc(p.Spec.Volumes, func(v corev1.Volume) bool {
			return v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == pvc.Name
		}) {
			out = append(out, p)
		}
	}
	return out, nil
}

// copying makes the clone that copies the volume, and switches once it is
// bound; an uncordoned node, or a claim gone, cancels.
func (r *Reconciler) copying(ctx context.Context, pv *corev1.PersistentVolume) (reconcile.Result, error) {
	pvc, err := r.claimOf(ctx, pv)
	if err != nil {
		return reconcile.Result{}, err
	}
	node := &corev1.Node{}
	err = r.Client.Get(ctx, client.ObjectKey{Name: topology.Node(pv)}, node)
	if err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, err
	}
	if pvc == nil || pvc.DeletionTimestamp != nil {
		return r.cancel(ctx, pv, nil, "its claim is gone")
	}
	if err == nil && !draining(node) {
		return r.cancel(ctx, pv, pvc, fmt.Sprintf("node %s is schedulable again", node.Name))
	}
	clone := &corev1.PersistentVolumeClaim{}
	err = r.Client.Get(ctx, types.NamespacedName{Namespace: pvc.Namespace, Name: CloneName(pvc.UID)}, clone)
	if apierrors.IsNotFound(err) {
		if stale, err := r.stale(ctx, pv); err != nil || stale {
			return reconcile.Result{RequeueAfter: time.Second}, err
		}
		clone = r.cloneFor(pv, pvc)
		if err := r.Client.Create(ctx, clone); err != nil && !apierrors.IsAlreadyExists(err) {
			return reconcile.Result{}, fmt.Errorf("create claim %s/%s to copy volume %s: %w", clone.Namespace, clone.Name, pv.Spec.CSI.VolumeHandle, err)
		}
		return reconcile.Result{RequeueAfter: r.poll()}, nil
	}
	if err != nil {
		return reconcile.Result{}, err
	}
	if clone.Annotations[names.MigrationOf] != pv.Name {
		r.Recorder.Eventf(pvc, pv, corev1.EventTypeWarning, "MigrationBlocked", "Migrate",
			"claim %s/%s is in the way of this claim's migration (it is not podvol-controller's copy of PV %s): delete it, and the migration goes on", clone.Namespace, clone.Name, pv.Name)
		return reconcile.Result{RequeueAfter: 30 * time.Second}, nil
	}
	if clone.DeletionTimestamp != nil {
		// Going (its user deleted it, or a cancel did): never switched
		// to; a new one is made once it is gone.
		return reconcile.Result{RequeueAfter: r.poll()}, nil
	}
	if want, has := sizeOf(pv, pvc), clone.Spec.Resources.Requests[corev1.ResourceStorage]; clone.Spec.VolumeName == "" && want.Cmp(has) > 0 {
		// Expanded during the copy: the volume grows on its node while
		// staged, and its last data would not fit the copy (OUT_OF_RANGE
		// on the target, for ever). A pending claim cannot be resized:
		// the copy is made again at the new size, where it fits.
		return r.end(ctx, pv, pvc, "MigrationRestarted", fmt.Sprintf(
			"this claim grew to %s while its volume was being copied to node %s, into a copy of %s: the copy (claim %s) is made again at %s, on a node chosen anew, and its data copied again",
			want.String(), pv.Annotations[names.MigrationTarget], has.String(), clone.Name, want.String()), time.Second)
	}
	if clone.Spec.VolumeName == "" && clone.Annotations[names.SelectedNode] != pv.Annotations[names.MigrationTarget] {
		// The target's provisioner gave the copy back (no room after
		// all): start again, on a node chosen anew.
		if _, err := r.cancel(ctx, pv, pvc, fmt.Sprintf("node %s gave the copy back (%s is now %q)", pv.Annotations[names.MigrationTarget], names.SelectedNode, clone.Annotations[names.SelectedNode])); err != nil {
			return reconcile.Result{}, err
		}
		return reconcile.Result{RequeueAfter: 30 * time.Second}, nil
	}
	if why := sourceLostCopy(clone); why != "" {
		return r.cancel(ctx, pv, pvc, why)
	}
	if clone.Spec.VolumeName == "" || clone.Status.Phase != corev1.ClaimBound {
		return reconcile.Result{RequeueAfter: r.poll()}, nil
	}
	// The copy is complete: its pull ended only once the volume was no
	// longer staged on its node, and the plugin there stages it no more.
	patch := client.MergeFromWithOptions(pv.DeepCopy(), client.MergeFromWithOptimisticLock{})
	pv.Annotations[names.MigrationPhase] = names.MigrationSwitching
	pv.Annotations[names.MigrationVolume] = clone.Spec.VolumeName
	preCopy := preCopyOnly(clone)
	if _, kept := pv.Annotations[names.MigrationReclaim]; preCopy != "" && !kept {
		// The old volume holds what was written after the pre-copy: kept
		// for good (Retain), should its node come back with its disk.
		pv.Annotations[names.MigrationReclaim] = string(corev1.PersistentVolumeReclaimRetain)
		pv.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimRetain
	}
	if err := r.Client.Patch(ctx, pv, patch); err != nil {
		return reconcile.Result{}, err
	}
	if preCopy != "" {
		r.Recorder.Eventf(pvc, pv, corev1.EventTypeWarning, "MigrationFromPreCopy", "Migrate",
			"switching this claim to its copy on node %s (PV %s), which holds only the first copy: %s. The old volume (PV %s) is kept (reclaim policy Retain): if node %s comes back with its disk, it holds what was written later; delete PV %s once you no longer need it",
			pv.Annotations[names.MigrationTarget], clone.Spec.VolumeName, brief(preCopy), pv.Name, topology.Node(pv), pv.Name)
	}
	r.Recorder.Eventf(pvc, pv, corev1.EventTypeNormal, "MigrationCopied", "Migrate",
		"this claim's volume is copied to node %s (PV %s): switching the claim to it", pv.Annotations[names.MigrationTarget], clone.Spec.VolumeName)
	return reconcile.Result{RequeueAfter: 100 * time.Millisecond}, nil
}

// cloneFor is the claim that copies pv's volume to the target: a clone of
// pvc of its size (sizeOf), class and mode, placed on the target, owned by pvc (a
// claim deleted takes its copy along).
func (r *Reconciler) cloneFor(pv *corev1.PersistentVolume, pvc *corev1.PersistentVolumeClaim) *corev1.PersistentVolumeClaim {
	class := pv.Spec.StorageClassName
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: pvc.Namespace, Name: CloneName(pvc.UID),
			Labels: map[string]string{"app.kubernetes.io/managed-by": "podvol-controller"},
			Annotations: map[string]string{
				names.SelectedNode: pv.Annotations[names.MigrationTarget],
				names.Placement:    names.PlacementScheduler,
				names.MigrationOf:  pv.Name,
			},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "PersistentVolumeClaim", Name: pvc.Name, UID: pvc.UID}},
		},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      slices.Clone(pvc.Spec.AccessModes),
			StorageClassName: &class,
			VolumeMode:       pv.Spec.VolumeMode,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: sizeOf(pv, pvc)}},
			DataSourceRef:    &corev1.TypedObjectReference{Kind: "PersistentVolumeClaim", Name: pvc.Name},
		},
	}
}

// cancel ends a migration before its switch, saying why on the claim.
func (r *Reconciler) cancel(ctx context.Context, pv *corev1.PersistentVolume, pvc *corev1.PersistentVolumeClaim, why string) (reconcile.Result, error) {
	return r.end(ctx, pv, pvc, "MigrationCancelled", fmt.Sprintf("the migration of this claim's volume is cancelled: %s; the volume stays where it is", why), 0)
}

// end ends a migration before its switch: the copy's claim goes (its
// volume with it, and the source's snapshots with the sweep), the PV's
// marks too; an event of reason says so on the claim, and the PV is looked
// at again after requeue (if not 0). Only if the live PV is the cached one:
// a cache that lags may not show the switch begun, whose copy would go
// with its claim.
func (r *Reconciler) end(ctx context.Context, pv *corev1.PersistentVolume, pvc *corev1.PersistentVolumeClaim, reason, msg string, requeue time.Duration) (reconcile.Result, error) {
	if stale, err := r.stale(ctx, pv); err != nil || stale {
		return reconcile.Result{RequeueAfter: time.Second}, err
	}
	if ref := pv.Spec.ClaimRef; ref != nil {
		clone := &corev1.PersistentVolumeClaim{}
		err := r.Client.Get(ctx, types.NamespacedName{Namespace: ref.Namespace, Name: CloneName(ref.UID)}, clone)
		if err == nil && clone.Annotations[names.MigrationOf] == pv.Name {
			if err := r.Client.Delete(ctx, clone, client.Preconditions{UID: &clone.UID}); err != nil && !apierrors.IsNotFound(err) {
				return reconcile.Result{}, err
			}
		} else if err != nil && !apierrors.IsNotFound(err) {
			return reconcile.Result{}, err
		}
	}
	patch := client.MergeFromWithOptions(pv.DeepCopy(), client.MergeFromWithOptimisticLock{})
	for _, k := range []string{names.MigrationTarget, names.MigrationClaim, names.MigrationPhase, names.MigrationStarted, names.MigrationVolume} {
		delete(pv.Annotations, k)
	}
	if err := r.Client.Patch(ctx, pv, patch); err != nil {
		return reconcile.Result{}, err
	}
	if pvc != nil {
		r.Recorder.Eventf(pvc, pv, corev1.EventTypeNormal, reason, "Migrate", "%s", msg)
	}
	log.FromContext(ctx).Info("Migration ended before its switch", "pv", pv.Name, "reason", reason, "because", msg)
	return reconcile.Result{RequeueAfter: requeue}, nil
}

// stashName is the stash of the claim re-made by the migration of pv.
func stashName(pv string) string {
	h := sha256.Sum256([]byte(pv))
	return "podvol-move-" + hex.EncodeToString(h[:16])
}

// dropped are the annotations of a claim that its re-made self does not
// get: those of its binding and placement.
var dropped = map[string]bool{
	"pv.kubernetes.io/bind-completed": true, "pv.kubernetes.io/bound-by-controller": true, names.SelectedNode: true, names.SourceNode: true,
	"volume.kubernetes.io/storage-provisioner": true, "volume.beta.kubernetes.io/storage-provisioner": true, "kubectl.kubernetes.io/last-applied-configuration": true,
}

// remade is the claim that takes pvc's place, bound to volume: its name,
// labels, annotations less those of its binding, owners but pods (a pod
// that owned it is gone: the garbage collector would delete the new one),
// and the spec fields that say what it is.
func remade(pvc *corev1.PersistentVolumeClaim, volume string) *corev1.PersistentVolumeClaim {
	s := &pvc.Spec
	next := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: pvc.Namespace, Name: pvc.Name, Labels: maps.Clone(pvc.Labels), Annotations: map[string]string{}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:               slices.Clone(s.AccessModes),
			Resources:                 *s.Resources.DeepCopy(),
			StorageClassName:          s.StorageClassName,
			VolumeMode:                s.VolumeMode,
			VolumeAttributesClassName: s.VolumeAttributesClassName,
			VolumeName:                volume,
		},
	}
	for k, v := range pvc.Annotations {
		if !dropped[k] {
			next.Annotations[k] = v
		}
	}
	for _, o := range pvc.OwnerReferences {
		if o.Kind != "Pod" {
			next.OwnerReferences = append(next.OwnerReferences, o)
		}
	}
	return next
}

// retain holds pv at Retain, keeping its policy to give back.
func (r *Reconciler) retain(ctx context.Context, pv *corev1.PersistentVolume) error {
	if _, kept := pv.Annotations[names.MigrationReclaim]; kept {
		return nil
	}
	patch := client.MergeFromWithOptions(pv.DeepCopy(), client.MergeFromWithOptimisticLock{})
	if pv.Annotations == nil {
		pv.Annotations = map[string]string{}
	}
	pv.Annotations[names.MigrationReclaim] = string(pv.Spec.PersistentVolumeReclaimPolicy)
	pv.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimRetain
	return r.Client.Patch(ctx, pv, patch)
}

// restoreReclaim gives pv back the policy retain kept.
func (r *Reconciler) restoreReclaim(ctx context.Context, pv *corev1.PersistentVolume) error {
	policy, kept := pv.Annotations[names.MigrationReclaim]
	if !kept {
		return nil
	}
	patch := client.MergeFromWithOptions(pv.DeepCopy(), client.MergeFromWithOptimisticLock{})
	delete(pv.Annotations, names.MigrationReclaim)
	pv.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimPolicy(policy)
	return r.Client.Patch(ctx, pv, patch)
}

// switching re-makes the claim bound to the copy, one idempotent step a
// call: Retain on both PVs, the stash, the copy's claim deleted, its PV
// pre-bound to the claim's name, the claim deleted, made again.
func (r *Reconciler) switching(ctx context.Context, pv *corev1.PersistentVolume) (reconcile.Result, error) {
	logger := log.FromContext(ctx).WithValues("pv", pv.Name)
	ref := pv.Spec.ClaimRef
	if ref == nil {
		return reconcile.Result{}, fmt.Errorf("PV %s, being switched, names no claim any more: left to an admin", pv.Name)
	}
	newPV := &corev1.PersistentVolume{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: pv.Annotations[names.MigrationVolume]}, newPV); err != nil {
		return reconcile.Result{}, fmt.Errorf("read the migration's new PV %s: %w", pv.Annotations[names.MigrationVolume], err)
	}
	// The copy is podvol's, on the target, and bound to the copy's claim
	// (or already pre-bound to this claim): nothing else is ever re-bound.
	cr := newPV.Spec.ClaimRef
	if newPV.Spec.CSI == nil || newPV.Spec.CSI.Driver != r.Driver || topology.Node(newPV) != pv.Annotations[names.MigrationTarget] || cr == nil || cr.Namespace != ref.Namespace ||
		(cr.Name != CloneName(ref.UID) && (cr.Name != ref.Name || newPV.Annotations[names.MigratedFrom] != pv.Name)) {
		return reconcile.Result{}, fmt.Errorf("PV %s is not the copy of PV %s that migration made (a %s PV on node %s bound to claim %s/%s): not switching to it",
			newPV.Name, pv.Name, r.Driver, pv.Annotations[names.MigrationTarget], ref.Namespace, CloneName(ref.UID))
	}
	if err := r.retain(ctx, pv); err != nil {
		return reconcile.Result{}, err
	}
	if err := r.retain(ctx, newPV); err != nil {
		return reconcile.Result{}, err
	}
	key := types.NamespacedName{Namespace: r.stashNamespace(), Name: stashName(pv.Name)}
	stash := &corev1.ConfigMap{}
	err := r.APIReader.Get(ctx, key, stash)
	if apierrors.IsNotFound(err) {
		// Live: a claim seen gone ends the switch.
		pvc := &corev1.PersistentVolumeClaim{}
		err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}, pvc)
		if apierrors.IsNotFound(err) || (err == nil && (pvc.UID != ref.UID || pvc.Spec.VolumeName != pv.Name)) {
			// Deleted before it was stashed (by its user, or with its
			// namespace): there is nothing to make again.
			return r.abandonSwitch(ctx, pv, newPV, nil, fmt.Sprintf("claim %s/%s was deleted before its switch", ref.Namespace, ref.Name))
		}
		if err != nil {
			return reconcile.Result{}, err
		}
		b, err := json.Marshal(remade(pvc, newPV.Name))
		if err != nil {
			return reconcile.Result{}, err
		}
		stash = &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name,
				Labels:      map[string]string{"app.kubernetes.io/managed-by": "podvol-controller", names.StashClaimNamespace: pvc.Namespace},
				Annotations: map[string]string{names.StashClaim: pvc.Namespace + "/" + pvc.Name, names.StashOldUID: string(pvc.UID), names.MigratedFrom: pv.Name}},
			Data: map[string]string{stashKey: string(b)},
		}
		if err := r.Client.Create(ctx, stash); err != nil {
			return reconcile.Result{}, fmt.Errorf("stash claim %s/%s before its switch: %w", pvc.Namespace, pvc.Name, err)
		}
	} else if err != nil {
		return reconcile.Result{}, err
	}
	next := &corev1.PersistentVolumeClaim{}
	if err := json.Unmarshal([]byte(stash.Data[stashKey]), next); err != nil {
		return reconcile.Result{}, fmt.Errorf("stash %s is corrupt: %w", key, err)
	}
	// The copy's claim goes; its PV stays (Retain).
	clone := &corev1.PersistentVolumeClaim{}
	err = r.Client.Get(ctx, types.NamespacedName{Namespace: ref.Namespace, Name: CloneName(ref.UID)}, clone)
	if err == nil {
		if clone.DeletionTimestamp == nil {
			if err := r.Client.Delete(ctx, clone, client.Preconditions{UID: &clone.UID}); err != nil && !apierrors.IsNotFound(err) {
				return reconcile.Result{}, err
			}
		}
		return reconcile.Result{RequeueAfter: time.Second}, nil
	} else if !apierrors.IsNotFound(err) {
		return reconcile.Result{}, err
	}
	// Pre-bound to the claim's name before the claim goes: whoever makes
	// the claim again (this controller, or a StatefulSet first) gets it.
	if cr := newPV.Spec.ClaimRef; cr == nil || cr.Namespace != next.Namespace || cr.Name != next.Name {
		patch := client.MergeFromWithOptions(newPV.DeepCopy(), client.MergeFromWithOptimisticLock{})
		newPV.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: next.Namespace, Name: next.Name}
		delete(newPV.Annotations, "pv.kubernetes.io/bound-by-controller")
		if newPV.Annotations == nil {
			newPV.Annotations = map[string]string{}
		}
		newPV.Annotations[names.MigratedFrom] = pv.Name
		if err := r.Client.Patch(ctx, newPV, patch); err != nil {
			return reconcile.Result{}, err
		}
		logger.Info("Pre-bound the migration's new PV to its claim", "newPV", newPV.Name, "claim", next.Namespace+"/"+next.Name)
	}
	oldUID := stash.Annotations[names.StashOldUID]
	made := pv.Annotations[names.MigrationClaimMade]
	old := &corev1.PersistentVolumeClaim{}
	err = r.APIReader.Get(ctx, types.NamespacedName{Namespace: next.Namespace, Name: next.Name}, old)
	switch {
	case err == nil && string(old.UID) == oldUID:
		if err := r.keepExpansion(ctx, stash, next, old); err != nil {
			return reconcile.Result{}, err
		}
		// pvc-protection holds the claim while a pod on a node uses it.
		if res, waiting, err := r.inTheWay(ctx, pv, old); waiting || err != nil {
			return res, err
		}
		if old.DeletionTimestamp == nil {
			return r.deleteOld(ctx, pv, newPV, old)
		}
		return reconcile.Result{RequeueAfter: time.Second}, nil
	case apierrors.IsNotFound(err) && pv.Annotations[names.MigrationClaimDeleted] != oldUID:
		return r.abandonSwitch(ctx, pv, newPV, stash, fmt.Sprintf("claim %s/%s was deleted by its user during its switch", next.Namespace, next.Name))
	case apierrors.IsNotFound(err) && made != "":
		return r.abandonSwitch(ctx, pv, newPV, stash, fmt.Sprintf("claim %s/%s, made again bound to the copy, was deleted", next.Namespace, next.Name))
	case apierrors.IsNotFound(err):
		if err := r.Client.Create(ctx, next); apierrors.IsNotFound(err) || apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
			return r.abandonSwitch(ctx, pv, newPV, stash, fmt.Sprintf("namespace %s is deleted: claim %s cannot be made again (%v)", next.Namespace, next.Name, err))
		} else if err != nil && !apierrors.IsAlreadyExists(err) {
			return reconcile.Result{}, fmt.Errorf("make claim %s/%s again: %w", next.Namespace, next.Name, err)
		} else if err == nil {
			if err := r.annotate(ctx, pv, names.MigrationClaimMade, string(next.UID)); err != nil {
				return reconcile.Result{}, err
			}
		}
		return reconcile.Result{RequeueAfter: time.Second}, nil
	case err != nil:
		return reconcile.Result{}, err
	case newPV.Spec.ClaimRef.UID != "" && newPV.Spec.ClaimRef.UID != old.UID:
		// The copy was bound to the claim made again, which is gone: this
		// one (its owner's, or its user's) is not this switch's.
		return r.abandonSwitch(ctx, pv, newPV, stash, fmt.Sprintf("claim %s/%s, made again bound to the copy, was deleted (another claim %s has its name)", next.Namespace, next.Name, old.UID))
	}
	// The claim is made again (by this controller or its owner): done once
	// it is bound to the copy.
	if made != string(old.UID) {
		if err := r.annotate(ctx, pv, names.MigrationClaimMade, string(old.UID)); err != nil {
			return reconcile.Result{}, err
		}
	}
	if old.DeletionTimestamp != nil {
		// Deleted by its user: the switch ends once it is gone.
		return reconcile.Result{RequeueAfter: r.poll()}, nil
	}
	if old.Spec.VolumeName != newPV.Name || old.Status.Phase != corev1.ClaimBound {
		if old.Spec.VolumeName != "" && old.Spec.VolumeName != newPV.Name {
			return reconcile.Result{}, fmt.Errorf("claim %s/%s, made again, is bound to PV %s, not the migration's %s: left to an admin", old.Namespace, old.Name, old.Spec.VolumeName, newPV.Name)
		}
		return reconcile.Result{RequeueAfter: time.Second}, nil
	}
	if err := r.restoreReclaim(ctx, newPV); err != nil {
		return reconcile.Result{}, err
	}
	if err := r.annotate(ctx, pv, names.MigrationPhase, names.MigrationSwitched); err != nil {
		return reconcile.Result{}, err
	}
	// If this fails, cleanUp deletes it.
	if err := r.Client.Delete(ctx, stash, client.Preconditions{UID: &stash.UID}); err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, err
	}
	r.Recorder.Eventf(old, newPV, corev1.EventTypeNormal, "MigrationSwitched", "Migrate",
		"this claim is bound to its volume's copy on node %s (PV %s); the old volume (PV %s) is deleted once a pod runs with the copy", pv.Annotations[names.MigrationTarget], newPV.Name, pv.Name)
	logger.Info("Migration switched", "claim", old.Namespace+"/"+old.Name, "newPV", newPV.Name)
	return reconcile.Result{RequeueAfter: 100 * time.Millisecond}, nil
}

// annotate sets one annotation of pv.
func (r *Reconciler) annotate(ctx context.Context, pv *corev1.PersistentVolume, key, value string) error {
	patch := client.MergeFromWithOptions(pv.DeepCopy(), client.MergeFromWithOptimisticLock{})
	if pv.Annotations == nil {
		pv.Annotations = map[string]string{}
	}
	pv.Annotations[key] = value
	return r.Client.Patch(ctx, pv, patch)
}

// deleteOld deletes the claim being switched, recording first that this
// controller did (a claim found gone is made again only then), and only
// as it was read: a claim its user deleted in between is not taken for
// one this controller deleted.
func (r *Reconciler) deleteOld(ctx context.Context, pv, newPV *corev1.PersistentVolume, old *corev1.PersistentVolumeClaim) (reconcile.Result, error) {
	if pv.Annotations[names.MigrationClaimDeleted] != string(old.UID) {
		if err := r.annotate(ctx, pv, names.MigrationClaimDeleted, string(old.UID)); err != nil {
			return reconcile.Result{}, err
		}
	}
	r.Recorder.Eventf(old, pv, corev1.EventTypeNormal, "MigrationSwitch", "Delete", "deleting this claim to make it again bound to its volume's copy on node %s (PV %s)", pv.Annotations[names.MigrationTarget], newPV.Name)
	err := r.Client.Delete(ctx, old, client.Preconditions{UID: &old.UID, ResourceVersion: &old.ResourceVersion})
	if apierrors.IsConflict(err) {
		// Changed since it was read. Deleted by its user meanwhile: not
		// this controller's deletion, not made again.
		live := &corev1.PersistentVolumeClaim{}
		err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(old), live)
		if apierrors.IsNotFound(err) || (err == nil && (live.UID != old.UID || live.DeletionTimestamp != nil)) {
			patch := client.MergeFromWithOptions(pv.DeepCopy(), client.MergeFromWithOptimisticLock{})
			delete(pv.Annotations, names.MigrationClaimDeleted)
			if err := r.Client.Patch(ctx, pv, patch); err != nil {
				return reconcile.Result{}, err
			}
		} else if err != nil {
			return reconcile.Result{}, err
		}
		return reconcile.Result{RequeueAfter: time.Second}, nil
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, err
	}
	return reconcile.Result{RequeueAfter: time.Second}, nil
}

// keepExpansion carries into the stash an expansion of the claim made
// after it was stashed: the claim made again asks for it, and
// external-resizer grows the copy on its node.
func (r *Reconciler) keepExpansion(ctx context.Context, stash *corev1.ConfigMap, next, old *corev1.PersistentVolumeClaim) error {
	want, has := old.Spec.Resources.Requests[corev1.ResourceStorage], next.Spec.Resources.Requests[corev1.ResourceStorage]
	if want.Cmp(has) <= 0 {
		return nil
	}
	if next.Spec.Resources.Requests == nil {
		next.Spec.Resources.Requests = corev1.ResourceList{}
	}
	next.Spec.Resources.Requests[corev1.ResourceStorage] = want
	b, err := json.Marshal(next)
	if err != nil {
		return err
	}
	stash.Data[stashKey] = string(b)
	if err := r.Client.Update(ctx, stash); err != nil {
		return fmt.Errorf("keep claim %s/%s's expansion to %s in its stash: %w", old.Namespace, old.Name, want.String(), err)
	}
	return nil
}

// inTheWay deals with the pods that keep the claim from being switched
// (pvc-protection holds a claim while a pod on a node uses it) and says
// whether any is (then res is when to look again). The volume is marked
// moving on its old node: no pod there has it mounted, or ever will (it was
// marked only once unstaged, which the kubelet does once the pods that used
// it have stopped). So a pod there that has not started is deleted, for
// its owner to make again for the new node; one being deleted that is
// still there StuckGrace past its deadline (its node's kubelet does not
// finish it: the node down, the kubelet stuck) is deleted at once, grace
// period 0, as `kubectl delete --force` does; finalizers that still hold
// it are left to an admin, a Warning says which.
func (r *Reconciler) inTheWay(ctx context.Context, pv *corev1.PersistentVolume, pvc *corev1.PersistentVolumeClaim) (reconcile.Result, bool, error) {
	pods, err := r.runningPods(ctx, pvc)
	if err != nil || len(pods) == 0 {
		return reconcile.Result{}, false, err
	}
	node, target := topology.Node(pv), pv.Annotations[names.MigrationTarget]
	res := reconcile.Result{RequeueAfter: r.poll()}
	for i := range pods {
		p := &pods[i]
		switch {
		case p.Spec.NodeName != node:
			r.Recorder.Eventf(pvc, pv, corev1.EventTypeNormal, "MigrationWaiting", "Migrate", "pod %s on node %s still uses this claim: it is switched to node %s once no pod on a node does", p.Name, p.Spec.NodeName, target)
		case p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodPending:
			r.Recorder.Eventf(p, nil, corev1.EventTypeNormal, "MigrationSwitch", "Delete", "this pod cannot start on node %s: its volume's data has moved to node %s; deleted so that its owner makes it again for the new node", node, target)
			if err := r.Client.Delete(ctx, p, client.Preconditions{UID: &p.UID}); err != nil && !apierrors.IsNotFound(err) {
				return reconcile.Result{}, true, err
			}
			res.RequeueAfter = time.Second
		case p.DeletionTimestamp == nil:
			r.Recorder.Eventf(pvc, pv, corev1.EventTypeNormal, "MigrationWaiting", "Migrate", "pod %s on node %s still uses this claim (%s): it is switched to node %s once the pod is deleted", p.Name, node, p.Status.Phase, target)
		case time.Now().Before(p.DeletionTimestamp.Add(r.stuckGrace())):
			r.Recorder.Eventf(pvc, pv, corev1.EventTypeNormal, "MigrationWaiting", "Migrate", "pod %s on node %s is being deleted: this claim is switched to node %s once it is gone; if it is still there at %s, it is deleted at once",
				p.Name, node, target, p.DeletionTimestamp.Add(r.stuckGrace()).UTC().Format(time.RFC3339))
		default:
			if p.DeletionGracePeriodSeconds == nil || *p.DeletionGracePeriodSeconds != 0 {
				r.Recorder.Eventf(p, pv, corev1.EventTypeWarning, "MigrationForceDelete", "Delete",
					"this pod was to be gone by %s and is still on node %s, whose kubelet does not finish it: deleted at once (grace period 0). It cannot use its claim's volume there (its data has moved to node %s), and its claim is switched only once it is gone",
					p.DeletionTimestamp.UTC().Format(time.RFC3339), node, target)
				if err := r.Client.Delete(ctx, p, client.GracePeriodSeconds(0), client.Preconditions{UID: &p.UID}); err != nil && !apierrors.IsNotFound(err) {
					return reconcile.Result{}, true, err
				}
				res.RequeueAfter = time.Second
			} else if others := slices.DeleteFunc(slices.Clone(p.Finalizers), func(f string) bool { return strings.HasPrefix(f, "podvol.io/") }); len(others) > 0 {
				// podvol's own finalizers go without an admin.
				r.Recorder.Eventf(pvc, pv, corev1.EventTypeWarning, "MigrationBlocked", "Migrate",
					"pod %s on node %s is deleted but finalizers %v hold it: this claim is switched to node %s only once it is gone. Find what they wait for, or remove them: kubectl -n %s patch pod %s --type=json -p '[{\"op\":\"remove\",\"path\":\"/metadata/finalizers\"}]'",
					p.Name, node, others, target, p.Namespace, p.Name)
				res.RequeueAfter = 30 * time.Second
			}
		}
	}
	return res, true, nil
}

// runningPods are the pods on a node that use the claim and have not
// finished.
func (r *Reconciler) runningPods(ctx context.Context, pvc *corev1.PersistentVolumeClaim) ([]corev1.Pod, error) {
	pods, err := r.podsOf(ctx, pvc)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(pods, func(p corev1.Pod) bool { return p.Spec.NodeName == "" }), nil
}

// cleanUp gives the old PV its reclaim policy back (its volume is then
// deleted, if that is the policy) once a pod runs with the copy, or the
// claim has moved on (deleted, made again, moved again by another drain):
// nothing waits for the old volume then.
func (r *Reconciler) cleanUp(ctx context.Context, pv *corev1.PersistentVolume) (reconcile.Result, error) {
	if _, kept := pv.Annotations[names.MigrationReclaim]; !kept {
		return reconcile.Result{}, nil
	}
	// The stash, if the switch's last step could not delete it.
	stash := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: r.stashNamespace(), Name: stashName(pv.Name)}}
	if err := r.Client.Delete(ctx, stash); err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, fmt.Errorf("delete the stash %s/%s of a switched claim: %w", stash.Namespace, stash.Name, err)
	}
	ref := pv.Spec.ClaimRef
	if ref == nil {
		return r.restoreReclaimResult(ctx, pv, "it names no claim")
	}
	// Live, not from the cache: the old volume is the fallback until a
	// pod runs with the copy.
	pvc := &corev1.PersistentVolumeClaim{}
	err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}, pvc)
	switch {
	case apierrors.IsNotFound(err):
		return r.restoreReclaimResult(ctx, pv, "the claim is deleted")
	case err != nil:
		return reconcile.Result{}, err
	case pvc.Spec.VolumeName != pv.Annotations[names.MigrationVolume]:
		// Switched means the claim made again was bound to the copy,
		// and a bound claim's volume never changes: this is another.
		return r.restoreReclaimResult(ctx, pv, fmt.Sprintf("claim %s/%s is another now (bound to %q, not the copy %s)", pvc.Namespace, pvc.Name, pvc.Spec.VolumeName, pv.Annotations[names.MigrationVolume]))
	}
	pods, err := r.runningPods(ctx, pvc)
	if err != nil {
		return reconcile.Result{}, err
	}
	if !slices.ContainsFunc(pods, func(p corev1.Pod) bool {
		return p.Spec.NodeName == pv.Annotations[names.MigrationTarget] && p.Status.Phase == corev1.PodRunning
	}) {
		return reconcile.Result{RequeueAfter: r.poll()}, nil
	}
	return r.restoreReclaimResult(ctx, pv, "a pod runs with the copy")
}

func (r *Reconciler) restoreReclaimResult(ctx context.Context, pv *corev1.PersistentVolume, why string) (reconcile.Result, error) {
	if err := r.restoreReclaim(ctx, pv); err != nil {
		return reconcile.Result{}, err
	}
	log.FromContext(ctx).Info("Migration done: the old volume goes by its reclaim policy", "pv", pv.Name, "policy", pv.Spec.PersistentVolumeReclaimPolicy, "because", why)
	return reconcile.Result{}, nil
}

// abandonSwitch ends a switch whose claim is gone (its user deleted it, or
// the claim made again, or its namespace): nothing is made again; the
// copy's PV is pointed at the deleted claim (so the PV controller releases
// it and, by its policy, deletes it), the copy's claim goes if it is still
// there, both PVs get their policies back, and the stash (if any) goes.
// It cannot be taken back, and each reason for it is read off the PV: a
// cache that lags may not show the switch's own deletion of the claim
// recorded yet, so it acts only on the PV as the API has it.
func (r *Reconciler) abandonSwitch(ctx context.Context, pv, newPV *corev1.PersistentVolume, stash *corev1.ConfigMap, why string) (reconcile.Result, error) {
	if stale, err := r.stale(ctx, pv); err != nil || stale {
		return reconcile.Result{RequeueAfter: time.Second}, err
	}
	ref := pv.Spec.ClaimRef
	oldUID := ref.UID
	if stash != nil {
		oldUID = types.UID(stash.Annotations[names.StashOldUID])
	}
	if cr := newPV.Spec.ClaimRef; cr != nil && cr.UID == "" {
		patch := client.MergeFromWithOptions(newPV.DeepCopy(), client.MergeFromWithOptimisticLock{})
		newPV.Spec.ClaimRef.UID = oldUID
		if err := r.Client.Patch(ctx, newPV, patch); err != nil {
			return reconcile.Result{}, err
		}
	}
	clone := &corev1.PersistentVolumeClaim{}
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: ref.Namespace, Name: CloneName(ref.UID)}, clone)
	if err == nil && clone.Annotations[names.MigrationOf] == pv.Name && clone.DeletionTimestamp == nil {
		if err := r.Client.Delete(ctx, clone, client.Preconditions{UID: &clone.UID}); err != nil && !apierrors.IsNotFound(err) {
			return reconcile.Result{}, err
		}
	} else if err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, err
	}
	if err := r.restoreReclaim(ctx, newPV); err != nil {
		return reconcile.Result{}, err
	}
	if stash != nil {
		if err := r.Client.Delete(ctx, stash, client.Preconditions{UID: &stash.UID}); err != nil && !apierrors.IsNotFound(err) {
			return reconcile.Result{}, err
		}
	}
	if err := r.annotate(ctx, pv, names.MigrationPhase, names.MigrationSwitched); err != nil {
		return reconcile.Result{}, err
	}
	r.Recorder.Eventf(pv, newPV, corev1.EventTypeNormal, "MigrationAbandoned", "Migrate",
		"%s: nothing is made again; both volumes (PVs %s and %s) go by their reclaim policies", why, pv.Name, newPV.Name)
	log.FromContext(ctx).Info("Migration abandoned: its claim is gone", "pv", pv.Name, "newPV", newPV.Name, "because", why)
	return r.restoreReclaimResult(ctx, pv, why)
}
