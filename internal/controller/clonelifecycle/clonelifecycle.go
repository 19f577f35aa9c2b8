// Package clonelifecycle gives PVCs the "ephemeral clone" lifecycle
// (destroyOnDetach): a PVC annotated podvol.io/lifecycle: reset-on-detach
// with a data source is a clone that lives only while it is used. Once a pod
// has used it and no pod uses it any more, it is deleted and created again
// with the same name and spec, so the next pod gets a fresh clone of the
// source as it is then. Nothing here is podvol-specific: any CSI driver that
// clones works.
package clonelifecycle

import (
	"context"
	"encoding/json"
	"fmt"
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
)

// Annotations.
const (
	Lifecycle     = "podvol.io/lifecycle"
	ResetOnDetach = "reset-on-detach"
	// Used marks a PVC a pod has used since it was (re)created.
	Used = "podvol.io/used"
	// ResetCount and LastReset make resets visible.
	ResetCount = "podvol.io/reset-count"
	LastReset  = "podvol.io/last-reset"
)

// stashKey holds the PVC to create again while the old one is deleted: the
// reset survives a controller restart in between.
const stashKey = "pvc.json"

func stashName(pvc string) string { return "podvol-reset-" + pvc }

var referenceGrantList = schema.GroupVersionKind{Group: "gateway.networking.k8s.io", Version: "v1beta1", Kind: "ReferenceGrantList"}

// Reconciler resets ephemeral clones.
type Reconciler struct {
	Client client.Client
	// APIReader reads past the cache before steps that cannot be taken
	// back (deleting a clone) and for the stash, which is not watched.
	// SetupWithManager fills it in.
	APIReader client.Reader
	Recorder  events.EventRecorder
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
	if gone || pvc.Annotations[Lifecycle] != ResetOnDetach || pvc.DeletionTimestamp != nil {
		return ctrl.Result{}, nil
	}
	if pvc.Spec.DataSourceRef == nil && pvc.Spec.DataSource == nil {
		r.Recorder.Eventf(pvc, nil, corev1.EventTypeWarning, "NoDataSource", "Reset", "%s=%s needs a dataSource or dataSourceRef to clone from", Lifecycle, ResetOnDetach)
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
	if !inUse && pvc.Annotations[Used] == "true" {
		// A pod the cache has not seen yet may be about to use it.
		if inUse, err = r.inUseLive(ctx, pvc); err != nil {
			return ctrl.Result{}, err
		}
	}
	if inUse {
		if pvc.Annotations[Used] != "true" {
			patch := client.MergeFrom(pvc.DeepCopy())
			pvc.Annotations[Used] = "true"
			return ctrl.Result{}, r.Client.Patch(ctx, pvc, patch)
		}
		return ctrl.Result{}, nil
	}
	// Bound but never used, or not used yet since the last reset: a fresh
	// clone already.
	if pvc.Annotations[Used] != "true" {
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

// reset stashes the PVC to be, then deletes the old one.
func (r *Reconciler) reset(ctx context.Context, pvc *corev1.PersistentVolumeClaim) error {
	count, _ := strconv.Atoi(pvc.Annotations[ResetCount])
	next := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: pvc.Name, Namespace: pvc.Namespace, Labels: pvc.Labels, Annotations: map[string]string{}},
		Spec:       *pvc.Spec.DeepCopy(),
	}
	for k, v := range pvc.Annotations {
		switch k {
		case Used, "pv.kubernetes.io/bind-completed", "pv.kubernetes.io/bound-by-controller", "volume.kubernetes.io/selected-node",
			"volume.kubernetes.io/storage-provisioner", "volume.beta.kubernetes.io/storage-provisioner", "kubectl.kubernetes.io/last-applied-configuration":
		default:
			next.Annotations[k] = v
		}
	}
	next.Annotations[ResetCount] = strconv.Itoa(count + 1)
	next.Annotations[LastReset] = time.Now().UTC().Format(time.RFC3339)
	next.Spec.VolumeName = ""
	b, err := json.Marshal(next)
	if err != nil {
		return err
	}
	stash := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: stashName(pvc.Name), Namespace: pvc.Namespace, Labels: map[string]string{"app.kubernetes.io/managed-by": "podvol-controller"},
			Annotations: map[string]string{"podvol.io/old-uid": string(pvc.UID)}},
		Data: map[string]string{stashKey: string(b)},
	}
	if err := r.Client.Create(ctx, stash); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("stash PVC %s/%s before its reset: %w", pvc.Namespace, pvc.Name, err)
	}
	// The action (Delete, then Create) tells the two steps of a reset apart.
	r.Recorder.Eventf(pvc, nil, corev1.EventTypeNormal, "ResetOnDetach", "Delete",
		"no pod uses this ephemeral clone any more: deleting it and creating it again as a fresh clone (reset %d)", count+1)
	err = r.Client.Delete(ctx, pvc, client.Preconditions{UID: &pvc.UID})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	log.FromContext(ctx).Info("Reset ephemeral clone", "pvc", pvc.Namespace+"/"+pvc.Name, "reset", count+1)
	return err
}

// finishReset creates the stashed PVC once the old one is gone. done means
// the reconcile is over.
func (r *Reconciler) finishReset(ctx context.Context, key types.NamespacedName, pvc *corev1.PersistentVolumeClaim, gone bool) (bool, ctrl.Result, error) {
	if !gone && pvc.Annotations[Lifecycle] != ResetOnDetach {
		return false, ctrl.Result{}, nil
	}
	// ConfigMaps are not watched (nor cached): the stash is read live.
	stash := &corev1.ConfigMap{}
	err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: key.Namespace, Name: stashName(key.Name)}, stash)
	if apierrors.IsNotFound(err) {
		return false, ctrl.Result{}, nil
	}
	if err != nil {
		return true, ctrl.Result{}, err
	}
	if !gone {
		if string(pvc.UID) == stash.Annotations["podvol.io/old-uid"] {
			// Still being deleted (finalizers): look again soon.
			return true, ctrl.Result{RequeueAfter: 2 * time.Second}, nil
		}
		// The new PVC exists: the stash has served, and the PVC goes on
		// through its lifecycle.
		if err := r.Client.Delete(ctx, stash); err != nil && !apierrors.IsNotFound(err) {
			return true, ctrl.Result{}, err
		}
		return false, ctrl.Result{}, nil
	}
	next := &corev1.PersistentVolumeClaim{}
	if err := json.Unmarshal([]byte(stash.Data[stashKey]), next); err != nil {
		return true, ctrl.Result{}, fmt.Errorf("stash %s/%s is corrupt: %w", stash.Namespace, stash.Name, err)
	}
	if err := r.Client.Create(ctx, next); err != nil && !apierrors.IsAlreadyExists(err) {
		return true, ctrl.Result{}, fmt.Errorf("create PVC %s/%s again: %w", next.Namespace, next.Name, err)
	}
	r.Recorder.Eventf(next, nil, corev1.EventTypeNormal, "ResetOnDetach", "Create", "created again as a fresh clone (reset %s)", next.Annotations[ResetCount])
	return true, ctrl.Result{}, client.IgnoreNotFound(r.Client.Delete(ctx, stash))
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
	if err := r.Client.List(ctx, grants, client.InNamespace(*ref.Namespace)); err != nil && !apierrors.IsNotFound(err) {
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
