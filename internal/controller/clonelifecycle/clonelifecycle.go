// Package clonelifecycle gives PVCs the "ephemeral clone" lifecycle
// (destroyOnDetach): a PVC annotated podvol.io/lifecycle: reset-on-detach
// with a data source is a clone that lives only while it is used. Once a pod
// has used it and no pod uses it any more, it is deleted and created again
// with the same name and spec, so the next pod gets a fresh clone of the
// source as it is when the new claim is provisioned. Nothing here is
// podvol-specific: any CSI driver that clones works. One thing is podvol's: a
// claim that podvol-controller's source-placement placed on the node that
// holds its source is created again already placed there, and so provisioned
// at once (see derive).
package clonelifecycle

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/podvol/podvol/internal/names"
)

// The stash.
//
// A reset deletes a PVC and creates it again; the PVC to create is stashed
// in a ConfigMap first, so that a controller restart between the two steps
// loses nothing. podvol-controller creates whatever a stash describes, with
// its cluster-wide right to create PVCs, so a stash must be something only
// podvol-controller can have written, and this is why it is not kept in the
// claim's namespace (as it once was, in podvol-reset-<claim>): whoever may
// create ConfigMaps there can write one with any content, labels,
// annotations and owner references (the API server does not check that an
// owner exists, nor, without OwnerReferencesPermissionEnforcement, who names
// it). Recording the deleted PVC's UID there proves nothing either: a tenant
// may read UIDs, and once that PVC is gone a restarted controller has
// nothing left to check the UID against (the restart is what the stash is
// for). So the stash lives in the controller's own namespace
// (Reconciler.StashNamespace), which tenants cannot write: a stash there was
// written by podvol-controller, for the PVC whose UID it records, before it
// deleted that PVC. Even so, the PVC created from it is rebuilt by derive
// (the claim's own namespace and name, the fields that say what to
// provision, nothing that binds it to an existing volume), never taken
// wholesale. A ConfigMap podvol-reset-<claim> in the claim's namespace is
// never acted on and never deleted: it is the tenant's; a Warning event
// ResetStashIgnored says so.
const (
	stashKey = "pvc.json"
)

// stashName is the name of the stash of claim key in the stash namespace:
// namespace and name do not fit in one object name, a hash of them does.
func stashName(key types.NamespacedName) string {
	h := sha256.Sum256([]byte(key.Namespace + "/" + key.Name))
	return "podvol-reset-" + hex.EncodeToString(h[:16])
}

// tenantStashName is where an older podvol-controller kept the stash, in
// the claim's namespace: what a tenant forges.
func tenantStashName(claim string) string { return "podvol-reset-" + claim }

var referenceGrantList = schema.GroupVersionKind{Group: "gateway.networking.k8s.io", Version: "v1beta1", Kind: "ReferenceGrantList"}

// Reconciler resets ephemeral clones.
type Reconciler struct {
	Client client.Client
	// APIReader reads past the cache before steps that cannot be taken
	// back (deleting a clone), for the stash, which is not watched, and
	// for ReferenceGrants (one just created must count).
	// SetupWithManager fills it in.
	APIReader client.Reader
	Recorder  events.EventRecorder
	// StashNamespace is where resets are stashed: podvol-controller's own
	// namespace, where tenants cannot write (see stashName). Empty means
	// $POD_NAMESPACE (deploy/base sets it), or else kube-system (a run
	// outside a pod; the envtest tests).
	StashNamespace string
}

func (r *Reconciler) stashNamespace() string {
	if r.StashNamespace != "" {
		return r.StashNamespace
	}
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	return metav1.NamespaceSystem
}

// claimIndex indexes pods by the PVCs they use.
const claimIndex = "podvol.claims"

// SetupWithManager watches PVCs and the pods that use them.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	err := mgr.GetFieldIndexer().IndexField(context.Background(), &corev1.Pod{}, claimIndex, func(o client.Object) []string {
		return claimsOf(o.(*corev1.Pod))
	})
	if err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("clone-lifecycle").
		For(&corev1.PersistentVolumeClaim{}).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			var reqs []reconcile.Request
			for _, c := range claimsOf(o.(*corev1.Pod)) {
				reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: c}})
			}
			return reqs
		})).
		Complete(r)
}

func claimsOf(p *corev1.Pod) []string {
	var out []string
	for _, v := range p.Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			out = append(out, v.PersistentVolumeClaim.ClaimName)
		}
	}
	return out
}

// Reconcile drives one PVC through use and reset.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	pvc := &corev1.PersistentVolumeClaim{}
	err := r.Client.Get(ctx, req.NamespacedName, pvc)
	if err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, err
	}
	gone := apierrors.IsNotFound(err)
	if done, res, err := r.finishReset(ctx, req.NamespacedName, pvc, gone); done {
		return res, err
	}
	if gone || pvc.Annotations[names.Lifecycle] != names.ResetOnDetach || pvc.DeletionTimestamp != nil {
		return ctrl.Result{}, nil
	}
	if pvc.Spec.DataSourceRef == nil && pvc.Spec.DataSource == nil {
		r.Recorder.Eventf(pvc, nil, corev1.EventTypeWarning, "NoDataSource", "Reset", "%s=%s needs a dataSource or dataSourceRef to clone from", names.Lifecycle, names.ResetOnDetach)
		return ctrl.Result{}, nil
	}
	if ok, why, err := r.granted(ctx, pvc); err != nil {
		return ctrl.Result{}, err
	} else if !ok {
		r.Recorder.Eventf(pvc, nil, corev1.EventTypeWarning, "ReferenceGrantMissing", "Reset", "%s", why)
		return ctrl.Result{}, nil
	}
	inUse, err := r.inUse(ctx, pvc)
	if err != nil {
		return ctrl.Result{}, err
	}
	if !inUse && pvc.Annotations[names.Used] == "true" {
		// A pod the cache has not seen yet may be about to use it.
		if inUse, err = r.inUseLive(ctx, pvc); err != nil {
			return ctrl.Result{}, err
		}
	}
	if inUse {
		if pvc.Annotations[names.Used] != "true" {
			patch := client.MergeFrom(pvc.DeepCopy())
			pvc.Annotations[names.Used] = "true"
			return ctrl.Result{}, r.Client.Patch(ctx, pvc, patch)
		}
		return ctrl.Result{}, nil
	}
	// Bound but never used, or not used yet since the last reset: a fresh
	// clone already.
	if pvc.Annotations[names.Used] != "true" {
		return ctrl.Result{}, nil
	}
	return ctrl.Result{}, r.reset(ctx, pvc)
}

// inUse reports whether a pod that has not finished uses the PVC. A pod that
// is gone from the API has had its volumes unmounted: kubelet removes a pod
// only after tearing its volumes down.
func (r *Reconciler) inUse(ctx context.Context, pvc *corev1.PersistentVolumeClaim) (bool, error) {
	pods := &corev1.PodList{}
	if err := r.Client.List(ctx, pods, client.InNamespace(pvc.Namespace), client.MatchingFields{claimIndex: pvc.Name}); err != nil {
		return false, err
	}
	return slices.ContainsFunc(pods.Items, running), nil
}

// inUseLive is inUse asked of the API rather than the cache.
func (r *Reconciler) inUseLive(ctx context.Context, pvc *corev1.PersistentVolumeClaim) (bool, error) {
	pods := &corev1.PodList{}
	if err := r.APIReader.List(ctx, pods, client.InNamespace(pvc.Namespace)); err != nil {
		return false, err
	}
	return slices.ContainsFunc(pods.Items, func(p corev1.Pod) bool {
		return running(p) && slices.Contains(claimsOf(&p), pvc.Name)
	}), nil
}

func running(p corev1.Pod) bool {
	return p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}

// dropped are the annotations of a PVC that its successor does not get:
// the binding of the old one, and Used. The placement (names.SelectedNode,
// names.SourceNode) is derive's to decide.
var dropped = map[string]bool{
	names.Used: true, "pv.kubernetes.io/bind-completed": true, "pv.kubernetes.io/bound-by-controller": true, names.SelectedNode: true, names.SourceNode: true,
	"volume.kubernetes.io/storage-provisioner": true, "volume.beta.kubernetes.io/storage-provisioner": true, "kubectl.kubernetes.io/last-applied-configuration": true,
}

// derive is the PVC a reset creates in place of claim key, built from src
// (the old PVC, or the stash made from it): key's namespace and name, src's
// labels and annotations less those of its binding, and the fields of its
// spec that say what to provision. Nothing that would bind it to an
// existing volume (volumeName, selector), no finalizers, no owners.
//
// A claim that source-placement placed on its source's node (its mark and
// the selected node agree) is created placed there: its clone can be
// provisioned nowhere else, and a claim that kept only the mark would read
// to source-placement as one whose placement the node's provisioner gave
// back (a SourceNodeFull warning and a backoff), while the scheduler picked
// another node for the next pod. The node's provisioner provisions it at
// once, ready for the next pod. Any other selected node (the scheduler's
// choice for the last pod, or a placement given back) is not the next
// pod's: dropped, with the mark.
func derive(key types.NamespacedName, src *corev1.PersistentVolumeClaim) *corev1.PersistentVolumeClaim {
	s := &src.Spec
	next := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name, Labels: maps.Clone(src.Labels), Annotations: map[string]string{}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:               slices.Clone(s.AccessModes),
			Resources:                 *s.Resources.DeepCopy(),
			StorageClassName:          copyPtr(s.StorageClassName),
			VolumeMode:                copyPtr(s.VolumeMode),
			DataSource:                s.DataSource.DeepCopy(),
			DataSourceRef:             s.DataSourceRef.DeepCopy(),
			VolumeAttributesClassName: copyPtr(s.VolumeAttributesClassName),
		},
	}
	for k, v := range src.Annotations {
		if !dropped[k] {
			next.Annotations[k] = v
		}
	}
	if node := src.Annotations[names.SourceNode]; node != "" && src.Annotations[names.SelectedNode] == node {
		next.Annotations[names.SelectedNode] = node
		next.Annotations[names.SourceNode] = node
	}
	return next
}

func copyPtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

// reset stashes the PVC to be, then deletes the old one.
func (r *Reconciler) reset(ctx context.Context, pvc *corev1.PersistentVolumeClaim) error {
	key := client.ObjectKeyFromObject(pvc)
	count, _ := strconv.Atoi(pvc.Annotations[names.ResetCount])
	next := derive(key, pvc)
	next.Annotations[names.ResetCount] = strconv.Itoa(count + 1)
	next.Annotations[names.LastReset] = time.Now().UTC().Format(time.RFC3339)
	b, err := json.Marshal(next)
	if err != nil {
		return err
	}
	// Stashed before the delete, with the UID of the PVC about to be
	// deleted: finishReset creates a PVC only from a stash it finds here.
	stash := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: stashName(key), Namespace: r.stashNamespace(),
			Labels:      map[string]string{"app.kubernetes.io/managed-by": "podvol-controller", names.StashClaimNamespace: key.Namespace},
			Annotations: map[string]string{names.StashClaim: key.String(), names.StashOldUID: string(pvc.UID)}},
		Data: map[string]string{stashKey: string(b)},
	}
	err = r.Client.Create(ctx, stash)
	if apierrors.IsAlreadyExists(err) {
		// From an earlier try at this reset whose delete did not happen
		// (finishReset has removed any stash of another PVC of this name).
		err = r.APIReader.Get(ctx, client.ObjectKeyFromObject(stash), stash)
		if err == nil && (stash.Annotations[names.StashClaim] != key.String() || stash.Annotations[names.StashOldUID] != string(pvc.UID)) {
			err = fmt.Errorf("stash %s/%s is for %s (UID %s), not this PVC (UID %s)",
				stash.Namespace, stash.Name, stash.Annotations[names.StashClaim], stash.Annotations[names.StashOldUID], pvc.UID)
		}
	}
	if err != nil {
		return fmt.Errorf("stash PVC %s before its reset: %w", key, err)
	}
	// The action (Delete, then Create) tells the two steps of a reset apart.
	r.Recorder.Eventf(pvc, nil, corev1.EventTypeNormal, "ResetOnDetach", "Delete",
		"no pod uses this ephemeral clone any more: deleting it and creating it again as a fresh clone (reset %d)", count+1)
	err = r.Client.Delete(ctx, pvc, client.Preconditions{UID: &pvc.UID})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	log.FromContext(ctx).Info("Reset ephemeral clone", "pvc", key.String(), "reset", count+1)
	return err
}

// finishReset creates the stashed PVC once the old one is gone. done means
// the reconcile is over.
func (r *Reconciler) finishReset(ctx context.Context, key types.NamespacedName, pvc *corev1.PersistentVolumeClaim, gone bool) (bool, ctrl.Result, error) {
	if !gone && pvc.Annotations[names.Lifecycle] != names.ResetOnDetach {
		return false, ctrl.Result{}, nil
	}
	// ConfigMaps are not watched (nor cached): the stash is read live.
	stash := &corev1.ConfigMap{}
	err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: r.stashNamespace(), Name: stashName(key)}, stash)
	if apierrors.IsNotFound(err) {
		if gone {
			r.warnTenantStash(ctx, key, nil)
		}
		return false, ctrl.Result{}, nil
	}
	if err != nil {
		return true, ctrl.Result{}, err
	}
	oldUID := stash.Annotations[names.StashOldUID]
	if stash.Annotations[names.StashClaim] != key.String() || oldUID == "" {
		// Not written by reset for this claim (edited by hand?): left to
		// an admin.
		log.FromContext(ctx).Error(nil, "Stash is not this claim's: ignored", "stash", stash.Namespace+"/"+stash.Name,
			"claim", key.String(), "stashClaim", stash.Annotations[names.StashClaim], "oldUID", oldUID)
		return false, ctrl.Result{}, nil
	}
	if !gone {
		if string(pvc.UID) == oldUID {
			if pvc.DeletionTimestamp != nil {
				// Still being deleted (finalizers): look again soon.
				return true, ctrl.Result{RequeueAfter: 2 * time.Second}, nil
			}
			// Stashed, but not deleted (a restart in between, or a
			// delete that failed). A stash left here would bring the
			// claim back once a user deletes it, so it goes, if the
			// live PVC (not a cache that may not show the delete yet)
			// confirms; the reset writes it again if it starts over.
			live := &corev1.PersistentVolumeClaim{}
			if err := r.APIReader.Get(ctx, key, live); err != nil {
				return true, ctrl.Result{}, client.IgnoreNotFound(err)
			}
			if live.UID != pvc.UID || live.DeletionTimestamp != nil {
				return true, ctrl.Result{RequeueAfter: 2 * time.Second}, nil
			}
			if err := r.Client.Delete(ctx, stash, client.Preconditions{UID: &stash.UID}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				return true, ctrl.Result{}, err
			}
			return false, ctrl.Result{}, nil
		}
		// The new PVC exists: the stash has served, and the PVC goes on
		// through its lifecycle.
		if err := r.Client.Delete(ctx, stash, client.Preconditions{UID: &stash.UID}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return true, ctrl.Result{}, err
		}
		return false, ctrl.Result{}, nil
	}
	stashed := &corev1.PersistentVolumeClaim{}
	if err := json.Unmarshal([]byte(stash.Data[stashKey]), stashed); err != nil {
		return true, ctrl.Result{}, fmt.Errorf("stash %s/%s is corrupt: %w", stash.Namespace, stash.Name, err)
	}
	next := derive(key, stashed)
	err = r.Client.Create(ctx, next)
	switch {
	case apierrors.IsNotFound(err) || apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause):
		// The claim's namespace is gone or going: so is the reset.
		log.FromContext(ctx).Info("Namespace of an ephemeral clone being reset is gone: reset dropped", "pvc", key.String())
	case apierrors.IsAlreadyExists(err):
		// Created meanwhile, by us or by someone else: the stash has
		// served.
	case err != nil:
		return true, ctrl.Result{}, fmt.Errorf("create PVC %s again: %w", key, err)
	default:
		r.Recorder.Eventf(next, nil, corev1.EventTypeNormal, "ResetOnDetach", "Create", "created again as a fresh clone (reset %s)", next.Annotations[names.ResetCount])
		r.warnTenantStash(ctx, key, next)
	}
	return true, ctrl.Result{}, client.IgnoreNotFound(r.Client.Delete(ctx, stash, client.Preconditions{UID: &stash.UID}))
}

// warnTenantStash leaves a Warning event when the claim's namespace holds a
// ConfigMap podvol-reset-<claim> that looks like a stash (an older
// podvol-controller's, or a forgery): it is ignored and left alone. The
// event goes on the PVC created again, or else on the pods that name the
// claim, or else on the ConfigMap.
func (r *Reconciler) warnTenantStash(ctx context.Context, key types.NamespacedName, created *corev1.PersistentVolumeClaim) {
	cm := &corev1.ConfigMap{}
	if err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: key.Namespace, Name: tenantStashName(key.Name)}, cm); err != nil {
		if !apierrors.IsNotFound(err) {
			log.FromContext(ctx).Error(err, "Read a ConfigMap that may pose as a reset stash", "configmap", key.Namespace+"/"+tenantStashName(key.Name))
		}
		return
	}
	if _, ok := cm.Data[stashKey]; !ok {
		return
	}
	var regarding []client.Object
	if created != nil {
		regarding = append(regarding, created)
	} else {
		pods := &corev1.PodList{}
		if err := r.Client.List(ctx, pods, client.InNamespace(key.Namespace), client.MatchingFields{claimIndex: key.Name}); err != nil {
			log.FromContext(ctx).Error(err, "List the pods that name a claim", "pvc", key.String())
		}
		for i := range pods.Items {
			regarding = append(regarding, &pods.Items[i])
		}
		if len(regarding) == 0 {
			regarding = append(regarding, cm)
		}
	}
	what := fmt.Sprintf("no PVC %s was created from it (if an older podvol-controller was resetting that PVC, create it again yourself)", key.Name)
	if created != nil {
		what = "this PVC was created again from podvol-controller's own stash, not from it"
	}
	for _, o := range regarding {
		r.Recorder.Eventf(o, cm, corev1.EventTypeWarning, "ResetStashIgnored", "Reset",
			"ConfigMap %s/%s looks like a reset stash, but podvol-controller keeps its stashes in its own namespace (%s), where tenants cannot write, "+
				"and never acts on a ConfigMap in a claim's namespace: ignored and left alone; %s", cm.Namespace, cm.Name, r.stashNamespace(), what)
	}
}

// granted checks a data source in another namespace against the
// ReferenceGrants there.
func (r *Reconciler) granted(ctx context.Context, pvc *corev1.PersistentVolumeClaim) (bool, string, error) {
	ref := pvc.Spec.DataSourceRef
	if ref == nil || ref.Namespace == nil || *ref.Namespace == "" || *ref.Namespace == pvc.Namespace {
		return true, "", nil
	}
	group := ""
	if ref.APIGroup != nil {
		group = *ref.APIGroup
	}
	grants := &unstructured.UnstructuredList{}
	grants.SetGroupVersionKind(referenceGrantList)
	// Past the cache: a grant just created must count (and the grants are
	// unstructured, which podvol-controller's client may cache).
	if err := r.APIReader.List(ctx, grants, client.InNamespace(*ref.Namespace)); err != nil && !apierrors.IsNotFound(err) {
		return false, "", fmt.Errorf("list ReferenceGrants in %s: %w", *ref.Namespace, err)
	}
	for _, g := range grants.Items {
		from, _, _ := unstructured.NestedSlice(g.Object, "spec", "from")
		to, _, _ := unstructured.NestedSlice(g.Object, "spec", "to")
		if matches(from, map[string]string{"group": "", "kind": "PersistentVolumeClaim", "namespace": pvc.Namespace}) &&
			matches(to, map[string]string{"group": group, "kind": ref.Kind, "name": ref.Name}) {
			return true, "", nil
		}
	}
	return false, fmt.Sprintf("no ReferenceGrant in namespace %s lets PersistentVolumeClaims of namespace %s use %s %s: create one there (gateway.networking.k8s.io/v1beta1, from {group: \"\", kind: PersistentVolumeClaim, namespace: %s} to {group: %q, kind: %s}); nothing is cloned until then",
		*ref.Namespace, pvc.Namespace, ref.Kind, ref.Name, pvc.Namespace, group, ref.Kind), nil
}

// matches reports whether an entry of a grant's from/to list matches want; a
// missing or empty name in the grant matches any name.
func matches(entries []any, want map[string]string) bool {
	for _, e := range entries {
		m, _ := e.(map[string]any)
		ok := true
		for k, v := range want {
			got, _ := m[k].(string)
			if k == "name" && got == "" {
				continue
			}
			if got != v {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}
