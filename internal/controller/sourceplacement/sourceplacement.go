package sourceplacement

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
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
	"github.com/podvol/podvol/internal/snaphandle"
	"github.com/podvol/podvol/internal/topology"
)

// Event reasons.
const (
	ReasonPlaced = "PlacedWithSource"
	// ReasonNoRoom: the source's node's provisioner gave the claim back.
	ReasonNoRoom = "SourceNodeFull"
	// ReasonNodeMissing: the node that holds the source is not in the
	// cluster.
	ReasonNodeMissing = "SourceNodeMissing"
	// ReasonNoNode: the source names no node.
	ReasonNoNode = "SourceNodeUnknown"
	// ReasonOtherNamespace: the source is in another namespace.
	ReasonOtherNamespace = "SourceInOtherNamespace"
	// ReasonNoSnapshotAPI: a restore, and VolumeSnapshot was not served
	// when podvol-controller started.
	ReasonNoSnapshotAPI = "SnapshotAPIMissing"
	// ReasonNodeUnfit: a pod that uses the claim cannot run on the
	// source's node, the only one where the claim can be provisioned.
	ReasonNodeUnfit = "SourceNodeUnfit"
	// ReasonDataFollows: with transfers, a restore whose pods cannot run
	// on its snapshot's node, or that the node had no room for, is left to
	// kube-scheduler, and its data pulled from the snapshot's node.
	ReasonDataFollows = "DataFollowsPod"
)

// Defaults of Reconciler.Backoff, Reconciler.MaxBackoff and Reconciler.Wait.
const (
	DefaultBackoff    = 30 * time.Second
	DefaultMaxBackoff = 10 * time.Minute
	DefaultWait       = 10 * time.Second
)

const snapshotGroup = "snapshot.storage.k8s.io"

// SnapshotGVK and ContentGVK are the snapshot kinds read here.
var (
	SnapshotGVK = schema.GroupVersionKind{Group: snapshotGroup, Version: "v1", Kind: "VolumeSnapshot"}
	ContentGVK  = schema.GroupVersionKind{Group: snapshotGroup, Version: "v1", Kind: "VolumeSnapshotContent"}
)

// Field indexes: of candidate PVCs by the source they name in their own
// namespace and by their StorageClass, and of pods by the claims they use.
const (
	claimIndex    = "podvol.source-claim"
	snapshotIndex = "podvol.source-snapshot"
	classIndex    = "podvol.placement-class"
	podClaimIndex = "podvol.placement-pod-claim"
)

// Reconciler places Driver's restores and clones on their source's node.
type Reconciler struct {
	Client   client.Client
	Recorder events.EventRecorder
	Driver   string
	// Backoff is how long a claim whose placement the source node's
	// provisioner gave back (no room) waits before it is placed there
	// again the first time; it doubles with each give-back of the claim,
	// up to MaxBackoff. Also how often a source whose node is not in the
	// cluster is looked at again. Zero means DefaultBackoff.
	Backoff time.Duration
	// MaxBackoff caps the growing waits of Backoff and Wait. Zero means
	// DefaultMaxBackoff.
	MaxBackoff time.Duration
	// Transfers: nodes pull the data of restores and clones from each
	// other (the plugins' --transfer-address), so neither need be
	// provisioned on its source's node: one annotated
	// podvol.io/placement: scheduler is left to kube-scheduler, and one
	// whose pods cannot run there, or that the node had no room for, too.
	Transfers bool
	// Wait is how long a claim whose source is not ready to tell its node
	// (a claim not bound yet, a snapshot not bound or not cut yet) waits
	// before its source is looked at again, besides the events that wake
	// it; it doubles with each look, up to MaxBackoff. Zero means
	// DefaultWait.
	Wait time.Duration

	// snapshots is whether VolumeSnapshots are served (SetupWithManager).
	snapshots bool

	mu sync.Mutex
	// claims: what an unbound claim went through, forgotten once it is
	// bound or gone.
	claims map[types.NamespacedName]*state
}

// state is what the claim of uid went through.
type state struct {
	uid types.UID
	// waits: looks in a row at a source not ready to tell its node.
	waits int
	// giveBacks: how often the provisioner gave back a placement.
	giveBacks int
	// displaced: since when the claim has been without its placement
	// (zero: it has it, or never had).
	displaced time.Time
	// warned: the last Warning recorded, not repeated.
	warned string
}

func (r *Reconciler) backoff() time.Duration {
	if r.Backoff > 0 {
		return r.Backoff
	}
	return DefaultBackoff
}

func (r *Reconciler) maxBackoff() time.Duration {
	if r.MaxBackoff > 0 {
		return r.MaxBackoff
	}
	return DefaultMaxBackoff
}

func (r *Reconciler) wait() time.Duration {
	if r.Wait > 0 {
		return r.Wait
	}
	return DefaultWait
}

// grown is d doubled n times, at most MaxBackoff.
func (r *Reconciler) grown(d time.Duration, n int) time.Duration {
	for ; n > 0 && d < r.maxBackoff(); n-- {
		d *= 2
	}
	return min(d, r.maxBackoff())
}

// SetupWithManager watches the unbound claims that restore or clone, the
// claims they clone (to act once those are bound), the pods that use them
// (to act once one does), the StorageClasses (a claim may come before its
// class) and, when the snapshot CRDs are installed, the VolumeSnapshots
// they restore and their contents. Without the CRDs only clones are placed,
// and restores get a Warning (restart podvol-controller after installing
// them).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	switch _, err := mgr.GetRESTMapper().RESTMapping(SnapshotGVK.GroupKind(), SnapshotGVK.Version); {
	case meta.IsNoMatchError(err):
		mgr.GetLogger().Info("VolumeSnapshot is not served (snapshot CRDs not installed): source-placement places clones only, not restores, until podvol-controller restarts after they are")
	case err != nil:
		return fmt.Errorf("look up %s: %w", SnapshotGVK, err)
	default:
		r.snapshots = true
	}
	ctx := context.Background()
	for name, kind := range map[string]string{claimIndex: "PersistentVolumeClaim", snapshotIndex: "VolumeSnapshot"} {
		err := mgr.GetFieldIndexer().IndexField(ctx, &corev1.PersistentVolumeClaim{}, name, func(o client.Object) []string {
			pvc := o.(*corev1.PersistentVolumeClaim)
			if s, ok := sourceOf(pvc); ok && candidate(pvc) && s.kind == kind && s.namespace == "" {
				return []string{s.name}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	err := mgr.GetFieldIndexer().IndexField(ctx, &corev1.PersistentVolumeClaim{}, classIndex, func(o client.Object) []string {
		pvc := o.(*corev1.PersistentVolumeClaim)
		if c := className(pvc); c != "" && candidate(pvc) {
			return []string{c}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &corev1.Pod{}, podClaimIndex, func(o client.Object) []string {
		return claimsOf(o.(*corev1.Pod))
	}); err != nil {
		return err
	}
	claims := func(index string, key func(o client.Object) (ns, value string)) handler.EventHandler {
		return handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			ns, value := key(o)
			if value == "" {
				return nil
			}
			l := &corev1.PersistentVolumeClaimList{}
			if err := r.Client.List(ctx, l, client.InNamespace(ns), client.MatchingFields{index: value}); err != nil {
				log.FromContext(ctx).Error(err, "List the claims of an object", "index", index, "object", client.ObjectKeyFromObject(o))
				return nil
			}
			var reqs []reconcile.Request
			for _, p := range l.Items {
				reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&p)})
			}
			return reqs
		})
	}
	itself := func(o client.Object) (string, string) { return o.GetNamespace(), o.GetName() }
	isCandidate := func(o client.Object) bool {
		pvc, ok := o.(*corev1.PersistentVolumeClaim)
		return ok && candidate(pvc)
	}
	b := ctrl.NewControllerManagedBy(mgr).
		Named("source-placement").
		For(&corev1.PersistentVolumeClaim{}, builder.WithPredicates(predicate.Funcs{
			CreateFunc: func(e event.CreateEvent) bool { return isCandidate(e.Object) },
			// The update that binds a claim lets the controller forget it.
			UpdateFunc:  func(e event.UpdateEvent) bool { return isCandidate(e.ObjectOld) || isCandidate(e.ObjectNew) },
			DeleteFunc:  func(e event.DeleteEvent) bool { return isCandidate(e.Object) },
			GenericFunc: func(e event.GenericEvent) bool { return isCandidate(e.Object) },
		})).
		// A source claim that gets bound wakes its clones.
		Watches(&corev1.PersistentVolumeClaim{}, claims(claimIndex, itself), builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			return o.(*corev1.PersistentVolumeClaim).Spec.VolumeName != ""
		}))).
		// A pod that starts or stops using a claim wakes it.
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			var reqs []reconcile.Request
			for _, name := range claimsOf(o.(*corev1.Pod)) {
				reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: name}})
			}
			return reqs
		}), builder.WithPredicates(predicate.Funcs{
			CreateFunc: func(e event.CreateEvent) bool { return len(claimsOf(e.Object.(*corev1.Pod))) > 0 },
			UpdateFunc: func(e event.UpdateEvent) bool {
				return live(e.ObjectOld.(*corev1.Pod)) != live(e.ObjectNew.(*corev1.Pod)) && len(claimsOf(e.ObjectNew.(*corev1.Pod))) > 0
			},
			DeleteFunc:  func(e event.DeleteEvent) bool { return len(claimsOf(e.Object.(*corev1.Pod))) > 0 },
			GenericFunc: func(event.GenericEvent) bool { return false },
		})).
		// A StorageClass created after its claims wakes them (its
		// provisioner and binding mode cannot change).
		Watches(&storagev1.StorageClass{}, claims(classIndex, func(o client.Object) (string, string) { return "", o.GetName() }),
			builder.WithPredicates(predicate.Funcs{
				CreateFunc:  func(event.CreateEvent) bool { return true },
				UpdateFunc:  func(event.UpdateEvent) bool { return false },
				DeleteFunc:  func(event.DeleteEvent) bool { return false },
				GenericFunc: func(event.GenericEvent) bool { return false },
			}))
	if r.snapshots {
		vs := &unstructured.Unstructured{}
		vs.SetGroupVersionKind(SnapshotGVK)
		c := &unstructured.Unstructured{}
		c.SetGroupVersionKind(ContentGVK)
		b = b.Watches(vs, claims(snapshotIndex, itself)).
			// A content that gets its handle wakes the restores of its
			// snapshot.
			Watches(c, claims(snapshotIndex, func(o client.Object) (string, string) {
				u, ok := o.(*unstructured.Unstructured)
				if !ok {
					return "", ""
				}
				ns, _, _ := unstructured.NestedString(u.Object, "spec", "volumeSnapshotRef", "namespace")
				name, _, _ := unstructured.NestedString(u.Object, "spec", "volumeSnapshotRef", "name")
				if ns == "" {
					return "", ""
				}
				return ns, name
			}))
	}
	return b.Complete(r)
}

// claimsOf names the claims a pod's volumes use: those of its
// persistentVolumeClaim volumes and of its generic ephemeral volumes
// (<pod>-<volume>).
func claimsOf(pod *corev1.Pod) []string {
	var out []string
	for _, v := range pod.Spec.Volumes {
		switch {
		case v.PersistentVolumeClaim != nil:
			out = append(out, v.PersistentVolumeClaim.ClaimName)
		case v.Ephemeral != nil:
			out = append(out, pod.Name+"-"+v.Name)
		}
	}
	return out
}

// live tells whether a pod may still run: not being deleted, not finished.
func live(pod *corev1.Pod) bool {
	return pod.DeletionTimestamp == nil && pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed
}

// uses tells whether a live pod uses the claim: a persistentVolumeClaim
// volume names it, or it is a generic ephemeral volume's and the pod owns
// it.
func uses(pod *corev1.Pod, pvc *corev1.PersistentVolumeClaim) bool {
	if !live(pod) || pod.Namespace != pvc.Namespace {
		return false
	}
	for _, v := range pod.Spec.Volumes {
		switch {
		case v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == pvc.Name:
			return true
		case v.Ephemeral != nil && pod.Name+"-"+v.Name == pvc.Name && metav1.IsControlledBy(pvc, pod):
			return true
		}
	}
	return false
}

// consumed tells whether the claim has a consumer, as WaitForFirstConsumer
// means it: a live pod uses it, or the scheduler selected a node for it (a
// selected node that podvol did not set).
func (r *Reconciler) consumed(ctx context.Context, pvc *corev1.PersistentVolumeClaim) (bool, error) {
	if s := pvc.Annotations[names.SelectedNode]; s != "" && s != names.AwaitingPlacement && pvc.Annotations[names.SourceNode] == "" {
		return true, nil
	}
	pods := &corev1.PodList{}
	if err := r.Client.List(ctx, pods, client.InNamespace(pvc.Namespace), client.MatchingFields{podClaimIndex: pvc.Name}); err != nil {
		return false, fmt.Errorf("list the pods of PVC %s/%s: %w", pvc.Namespace, pvc.Name, err)
	}
	for i := range pods.Items {
		if uses(&pods.Items[i], pvc) {
			return true, nil
		}
	}
	return false, nil
}

// source is what a claim is made from.
type source struct {
	// kind is PersistentVolumeClaim or VolumeSnapshot.
	kind, name string
	// namespace is dataSourceRef's, "" for the claim's own.
	namespace string
}

func (s source) String() string { return s.kind + "/" + s.name }

// sourceOf returns a claim's source if it is a PVC or a VolumeSnapshot.
// dataSourceRef, when set, is the one that counts (the API server copies
// a same-namespace one to dataSource and back).
func sourceOf(pvc *corev1.PersistentVolumeClaim) (source, bool) {
	var group, kind, name, ns string
	switch ref, ds := pvc.Spec.DataSourceRef, pvc.Spec.DataSource; {
	case ref != nil:
		kind, name = ref.Kind, ref.Name
		if ref.APIGroup != nil {
			group = *ref.APIGroup
		}
		if ref.Namespace != nil && *ref.Namespace != pvc.Namespace {
			ns = *ref.Namespace
		}
	case ds != nil:
		kind, name = ds.Kind, ds.Name
		if ds.APIGroup != nil {
			group = *ds.APIGroup
		}
	default:
		return source{}, false
	}
	s := source{kind: kind, name: name, namespace: ns}
	return s, (group == "" && kind == "PersistentVolumeClaim") || (group == snapshotGroup && kind == "VolumeSnapshot")
}

// candidate tells whether a claim may need placing: unbound, not being
// deleted, made from a PVC or a VolumeSnapshot.
func candidate(pvc *corev1.PersistentVolumeClaim) bool {
	_, ok := sourceOf(pvc)
	return ok && pvc.Spec.VolumeName == "" && pvc.DeletionTimestamp == nil
}

// problem is why a claim cannot be placed, for a Warning event.
type problem struct{ reason, note string }

func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	pvc := &corev1.PersistentVolumeClaim{}
	if err := r.Client.Get(ctx, req.NamespacedName, pvc); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.NamespacedName)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	src, ok := sourceOf(pvc)
	if !ok || !candidate(pvc) {
		r.forget(req.NamespacedName)
		return reconcile.Result{}, nil
	}
	// A claim of a class not there yet is woken when the class comes.
	if ours, err := r.placedByDriver(ctx, pvc); err != nil || !ours {
		return reconcile.Result{}, err
	}
	// A claim nobody uses is woken when a pod does.
	if used, err := r.consumed(ctx, pvc); err != nil || !used {
		r.waited(pvc, false)
		return reconcile.Result{}, err
	}
	if r.Transfers && src.namespace == "" && pvc.Annotations[names.Placement] == names.PlacementScheduler {
		// The user's choice: wherever the pod goes, the data follows.
		return reconcile.Result{}, r.leaveToScheduler(ctx, pvc)
	}
	if src.namespace != "" {
		r.warnOnce(pvc, problem{ReasonOtherNamespace, fmt.Sprintf(
			"its data source %s is in namespace %s: podvol places only claims whose source is in their own namespace on the source's node. Give the pod a node affinity to the node that holds the source (%s of the source's PV), or the claim may be provisioned on a node that does not have it (NOT_FOUND)",
			src, src.namespace, names.TopologyKey)})
		return reconcile.Result{}, nil
	}
	var node string
	var why *problem
	var wait bool
	var err error
	switch src.kind {
	case "PersistentVolumeClaim":
		node, why, wait, err = r.claimNode(ctx, pvc.Namespace, src.name)
	default:
		if !r.snapshots {
			r.warnOnce(pvc, problem{ReasonNoSnapshotAPI, fmt.Sprintf(
				"its data source is %s, and VolumeSnapshot was not served when podvol-controller started (snapshot CRDs not installed): podvol does not place restores until podvol-controller is restarted after installing the snapshot CRDs. Restart it: until then the claim waits, unplaced",
				src)})
			return reconcile.Result{}, nil
		}
		node, why, wait, err = r.snapshotNode(ctx, pvc.Namespace, src.name)
	}
	if err != nil {
		return reconcile.Result{}, err
	}
	// The watches of the source wake the claim once it can tell; the
	// look again, growing, is for what they do not see.
	if after := r.waited(pvc, wait); wait {
		return reconcile.Result{RequeueAfter: after}, nil
	}
	switch {
	case why != nil:
		r.warnOnce(pvc, *why)
		return reconcile.Result{}, r.leaveToScheduler(ctx, pvc)
	case node == "":
		// Another driver's source: not podvol's to place.
		return reconcile.Result{}, r.leaveToScheduler(ctx, pvc)
	}
	n := &corev1.Node{}
	switch err := r.Client.Get(ctx, client.ObjectKey{Name: node}, n); {
	case apierrors.IsNotFound(err):
		r.warnOnce(pvc, problem{ReasonNodeMissing, fmt.Sprintf(
			"its data source %s is on node %s, which is not in the cluster: the claim can only be provisioned there, so podvol does not place it. Bring the node back, or restore from a source on a node that is in the cluster",
			src, node)})
		return reconcile.Result{RequeueAfter: r.backoff()}, nil
	case err != nil:
		return reconcile.Result{}, err
	}
	if r.Transfers {
		if moved, err := r.moveIfUnfit(ctx, pvc, src, n); moved || err != nil {
			return reconcile.Result{}, err
		}
	}
	res, err := r.place(ctx, pvc, src, node)
	if err != nil {
		return res, err
	}
	return res, r.checkFit(ctx, pvc, src, n)
}

// moveIfUnfit leaves a restore or clone not placed yet to kube-scheduler
// when a pod that uses it cannot run on its source's node: the node the pod
// goes to pulls the data.
func (r *Reconciler) moveIfUnfit(ctx context.Context, pvc *corev1.PersistentVolumeClaim, src source, node *corev1.Node) (bool, error) {
	if sel := pvc.Annotations[names.SelectedNode]; sel != "" && sel != names.AwaitingPlacement {
		return false, nil // placed already: moving it now could race its provisioning
	}
	unfit, err := r.unfitPods(ctx, pvc, node)
	if err != nil || len(unfit) == 0 {
		return false, err
	}
	r.event(pvc, corev1.EventTypeNormal, ReasonDataFollows,
		"pod %s cannot run on node %s, which holds its data source %s (%s): the claim is provisioned where kube-scheduler puts the pod, and its data copied from node %s",
		unfit[0].pod.Name, node.Name, src, unfit[0].why, node.Name)
	return true, r.moveToScheduler(ctx, pvc)
}

// moveToScheduler marks a claim podvol.io/placement: scheduler, so that it
// is not placed again, and takes podvol's placeholder off it.
func (r *Reconciler) moveToScheduler(ctx context.Context, pvc *corev1.PersistentVolumeClaim) error {
	patch := client.MergeFromWithOptions(pvc.DeepCopy(), client.MergeFromWithOptimisticLock{})
	if pvc.Annotations == nil {
		pvc.Annotations = map[string]string{}
	}
	if pvc.Annotations[names.SelectedNode] == names.AwaitingPlacement {
		delete(pvc.Annotations, names.SelectedNode)
	}
	pvc.Annotations[names.Placement] = names.PlacementScheduler
	if err := r.Client.Patch(ctx, pvc, patch); err != nil {
		return fmt.Errorf("leave PVC %s/%s to kube-scheduler: %w", pvc.Namespace, pvc.Name, err)
	}
	log.FromContext(ctx).Info("Left a restore to kube-scheduler: its data will be copied", "pvc", client.ObjectKeyFromObject(pvc))
	return nil
}

// checkFit warns, on the claim and on the pod, of each pod that uses the
// claim and cannot run on the source's node: the claim can be provisioned
// only there, so such a pod never starts, and kube-scheduler's own message
// does not say that the volume's source is why. The claim is placed there
// all the same (provisioned anywhere else it would fail); the pod or the node
// is the user's or the admin's to change.
func (r *Reconciler) checkFit(ctx context.Context, pvc *corev1.PersistentVolumeClaim, src source, node *corev1.Node) error {
	unfit, err := r.unfitPods(ctx, pvc, node)
	if err != nil {
		return err
	}
	var podNames []string
	// key: what was warned of, not repeated.
	var key strings.Builder
	for _, u := range unfit {
		podNames = append(podNames, u.pod.Name)
		fmt.Fprintf(&key, "%s/%s: %s\n", u.pod.Name, u.pod.UID, u.why)
	}
	r.mu.Lock()
	st := r.state(pvc)
	last := st.warned
	if len(unfit) > 0 {
		st.warned = ReasonNodeUnfit + key.String()
	} else if strings.HasPrefix(st.warned, ReasonNodeUnfit) {
		// Fits now: a pod that stops fitting again is warned of again.
		st.warned = ""
	}
	r.mu.Unlock()
	if len(unfit) == 0 || last == st.warned {
		return nil
	}
	for _, u := range unfit {
		note := fmt.Sprintf("node %s, which holds its data source %s, cannot run pod %s: %s. The claim can only be provisioned there "+
			"(podvol does not copy data between nodes), so the pod will not start: uncordon the node, let the pod tolerate the taint or "+
			"change its nodeName, nodeSelector or node affinity, or give it a source on a node it can run on",
			node.Name, src, u.pod.Name, u.why)
		r.Recorder.Eventf(pvc, nil, corev1.EventTypeWarning, ReasonNodeUnfit, "Place", "%s", note)
		r.Recorder.Eventf(u.pod, pvc, corev1.EventTypeWarning, ReasonNodeUnfit, "Place", "volume claim %s: %s", pvc.Name, note)
	}
	log.FromContext(ctx).Info("Pods that use a claim cannot run on its source's node", "pvc", client.ObjectKeyFromObject(pvc), "node", node.Name, "pods", podNames)
	return nil
}

type unfitPod struct {
	pod *corev1.Pod
	why string
}

// unfitPods are the pods that use the claim and cannot run on node.
func (r *Reconciler) unfitPods(ctx context.Context, pvc *corev1.PersistentVolumeClaim, node *corev1.Node) ([]unfitPod, error) {
	pods := &corev1.PodList{}
	if err := r.Client.List(ctx, pods, client.InNamespace(pvc.Namespace), client.MatchingFields{podClaimIndex: pvc.Name}); err != nil {
		return nil, fmt.Errorf("list the pods of PVC %s/%s: %w", pvc.Namespace, pvc.Name, err)
	}
	var unfit []unfitPod
	for i := range pods.Items {
		pod := &pods.Items[i]
		if !uses(pod, pvc) {
			continue
		}
		if why := topology.CannotRun(log.FromContext(ctx), pod, node); len(why) > 0 {
			unfit = append(unfit, unfitPod{pod, strings.Join(why, "; ")})
		}
	}
	return unfit, nil
}

// className is the claim's StorageClass.
func className(pvc *corev1.PersistentVolumeClaim) string {
	if pvc.Spec.StorageClassName != nil {
		return *pvc.Spec.StorageClassName
	}
	return pvc.Annotations[corev1.BetaStorageClassAnnotation]
}

// placedByDriver tells whether the claim's StorageClass is Driver's and
// waits for the first consumer (an Immediate claim is placed by whoever
// provisions it first, not by the scheduler).
func (r *Reconciler) placedByDriver(ctx context.Context, pvc *corev1.PersistentVolumeClaim) (bool, error) {
	name := className(pvc)
	if name == "" {
		return false, nil
	}
	sc := &storagev1.StorageClass{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: name}, sc); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	return sc.Provisioner == r.Driver && sc.VolumeBindingMode != nil && *sc.VolumeBindingMode == storagev1.VolumeBindingWaitForFirstConsumer, nil
}

// claimNode is the node of the Driver PV that claim ns/name is bound to.
// wait: not bound (yet). node "" and no problem: not Driver's.
func (r *Reconciler) claimNode(ctx context.Context, ns, name string) (node string, why *problem, wait bool, err error) {
	src := &corev1.PersistentVolumeClaim{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, src); err != nil {
		return "", nil, apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	}
	if src.Spec.VolumeName == "" {
		return "", nil, true, nil
	}
	pv := &corev1.PersistentVolume{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: src.Spec.VolumeName}, pv); err != nil {
		return "", nil, apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	}
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != r.Driver {
		return "", nil, false, nil
	}
	// A claim names its volume, and the volume its claim: a claim that
	// names a PV bound to another (a tenant may write any volumeName) is
	// not bound to it.
	if ref := pv.Spec.ClaimRef; ref == nil || ref.Namespace != ns || ref.Name != name || (ref.UID != "" && ref.UID != src.UID) {
		return "", nil, true, nil
	}
	if node := topology.Node(pv); node != "" {
		return node, nil, false, nil
	}
	return "", &problem{ReasonNoNode, fmt.Sprintf(
		"its data source PersistentVolumeClaim/%s is bound to PV %s, whose node affinity names no node on %s: podvol cannot tell where to provision the clone. Give the pod a node affinity to the node that holds the source",
		name, pv.Name, names.TopologyKey)}, false, nil
}

// snapshotNode is the node that the handle of VolumeSnapshot ns/name's
// Driver content names. wait: not bound or not cut yet. node "" and no
// problem: not Driver's.
func (r *Reconciler) snapshotNode(ctx context.Context, ns, name string) (node string, why *problem, wait bool, err error) {
	vs := &unstructured.Unstructured{}
	vs.SetGroupVersionKind(SnapshotGVK)
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, vs); err != nil {
		return "", nil, apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	}
	contentName, _, _ := unstructured.NestedString(vs.Object, "status", "boundVolumeSnapshotContentName")
	if contentName == "" {
		return "", nil, true, nil
	}
	c := &unstructured.Unstructured{}
	c.SetGroupVersionKind(ContentGVK)
	if err := r.Client.Get(ctx, client.ObjectKey{Name: contentName}, c); err != nil {
		return "", nil, apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	}
	if d, _, _ := unstructured.NestedString(c.Object, "spec", "driver"); d != r.Driver {
		return "", nil, false, nil
	}
	// The content must name the snapshot back (snapshot-controller binds
	// both ways).
	refNS, _, _ := unstructured.NestedString(c.Object, "spec", "volumeSnapshotRef", "namespace")
	refName, _, _ := unstructured.NestedString(c.Object, "spec", "volumeSnapshotRef", "name")
	refUID, _, _ := unstructured.NestedString(c.Object, "spec", "volumeSnapshotRef", "uid")
	if refNS != ns || refName != name || (refUID != "" && types.UID(refUID) != vs.GetUID()) {
		return "", nil, true, nil
	}
	handle, _, _ := unstructured.NestedString(c.Object, "status", "snapshotHandle")
	if handle == "" {
		handle, _, _ = unstructured.NestedString(c.Object, "spec", "source", "snapshotHandle")
	}
	if handle == "" {
		return "", nil, true, nil
	}
	if _, node = snaphandle.Parse(handle); node != "" {
		return node, nil, false, nil
	}
	return "", &problem{ReasonNoNode, fmt.Sprintf(
		"its data source VolumeSnapshot/%s has handle %q, which names no node (made before podvol named nodes in handles): podvol cannot tell where to provision the restore. Give the pod a node affinity to the node that holds the snapshot (%s)",
		name, handle, names.TopologyKey)}, false, nil
}

// place sets the claim's selected node to the source's node, unless the
// source node's provisioner gave it back less than the claim's backoff ago.
func (r *Reconciler) place(ctx context.Context, pvc *corev1.PersistentVolumeClaim, src source, node string) (reconcile.Result, error) {
	key := client.ObjectKeyFromObject(pvc)
	selected := pvc.Annotations[names.SelectedNode]
	if pvc.Annotations[names.SourceNode] == node {
		if selected == node {
			return reconcile.Result{}, nil
		}
		// Placed here before, and the placement is gone (or the
		// scheduler chose again after it went): the node's provisioner
		// asked for another node, which cannot provision it either.
		if r.Transfers {
			r.event(pvc, corev1.EventTypeNormal, ReasonDataFollows,
				"node %s, which holds its data source %s, has no room for this claim (see ProvisioningFailed events): it is provisioned where kube-scheduler puts its pod, and its data copied from node %s",
				node, src, node)
			return reconcile.Result{}, r.moveToScheduler(ctx, pvc)
		}
		at, delay, first := r.givenBack(pvc)
		if first {
			r.event(pvc, corev1.EventTypeWarning, ReasonNoRoom,
				"node %s, which holds its data source %s, has no room for this claim (see ProvisioningFailed events); podvol retries on %s in %s",
				node, src, node, delay)
		}
		if left := time.Until(at.Add(delay)); left > 0 {
			return reconcile.Result{RequeueAfter: left}, nil
		}
	}
	patch := client.MergeFromWithOptions(pvc.DeepCopy(), client.MergeFromWithOptimisticLock{})
	if pvc.Annotations == nil {
		pvc.Annotations = map[string]string{}
	}
	pvc.Annotations[names.SelectedNode] = node
	pvc.Annotations[names.SourceNode] = node
	if err := r.Client.Patch(ctx, pvc, patch); err != nil {
		return reconcile.Result{}, fmt.Errorf("annotate PVC %s %s=%s: %w", key, names.SelectedNode, node, err)
	}
	r.placed(pvc)
	log.FromContext(ctx).Info("Placed a claim on its source's node", "pvc", key, "source", src.String(), "node", node, "was", selected)
	note := ""
	if selected != "" && selected != node && selected != names.AwaitingPlacement {
		note = fmt.Sprintf(" (instead of node %s)", selected)
	}
	r.event(pvc, corev1.EventTypeNormal, ReasonPlaced, "provisioned on node %s%s, which holds its data source %s", node, note, src)
	return reconcile.Result{}, nil
}

// leaveToScheduler hands a claim that podvol cannot place to kube-scheduler:
// admission policy podvol-placement-gate gave it a selected node that no
// node is, which would keep its pods from ever being scheduled. The mark
// keeps the policy from giving it that again.
func (r *Reconciler) leaveToScheduler(ctx context.Context, pvc *corev1.PersistentVolumeClaim) error {
	if pvc.Annotations[names.SelectedNode] != names.AwaitingPlacement {
		return nil
	}
	patch := client.MergeFromWithOptions(pvc.DeepCopy(), client.MergeFromWithOptimisticLock{})
	delete(pvc.Annotations, names.SelectedNode)
	pvc.Annotations[names.Placement] = names.PlacementScheduler
	if err := r.Client.Patch(ctx, pvc, patch); err != nil {
		return fmt.Errorf("leave PVC %s/%s to kube-scheduler: %w", pvc.Namespace, pvc.Name, err)
	}
	log.FromContext(ctx).Info("Left a claim podvol cannot place to kube-scheduler", "pvc", client.ObjectKeyFromObject(pvc))
	return nil
}

// event records an event on the claim and, for a generic ephemeral volume,
// on its pod, where its user looks.
func (r *Reconciler) event(pvc *corev1.PersistentVolumeClaim, typ, reason, note string, args ...any) {
	r.Recorder.Eventf(pvc, nil, typ, reason, "Place", note, args...)
	if o := metav1.GetControllerOf(pvc); o != nil && o.APIVersion == "v1" && o.Kind == "Pod" {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: pvc.Namespace, Name: o.Name, UID: o.UID}}
		r.Recorder.Eventf(pod, pvc, typ, reason, "Place", "volume claim %s: "+note, append([]any{pvc.Name}, args...)...)
	}
}

// warnOnce records a Warning event unless it is the one last recorded for
// this claim.
func (r *Reconciler) warnOnce(pvc *corev1.PersistentVolumeClaim, p problem) {
	r.mu.Lock()
	st := r.state(pvc)
	repeat := st.warned == p.reason+p.note
	st.warned = p.reason + p.note
	r.mu.Unlock()
	if !repeat {
		r.event(pvc, corev1.EventTypeWarning, p.reason, "%s", p.note)
	}
}

// state is the claim's, new if it has none or one of an older claim of
// that name. r.mu is held.
func (r *Reconciler) state(pvc *corev1.PersistentVolumeClaim) *state {
	key := client.ObjectKeyFromObject(pvc)
	if st, ok := r.claims[key]; ok && st.uid == pvc.UID {
		return st
	}
	if r.claims == nil {
		r.claims = map[types.NamespacedName]*state{}
	}
	st := &state{uid: pvc.UID}
	r.claims[key] = st
	return st
}

// waited counts a look at the claim's source that found it not ready
// (wait) or resets the count, and returns when to look again: Wait, doubled
// with each look in a row.
func (r *Reconciler) waited(pvc *corev1.PersistentVolumeClaim, wait bool) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !wait {
		if st, ok := r.claims[client.ObjectKeyFromObject(pvc)]; ok {
			st.waits = 0
		}
		return 0
	}
	st := r.state(pvc)
	st.waits++
	return r.grown(r.wait(), st.waits-1)
}

// givenBack returns since when the claim has been without its placement,
// how long it waits from then (Backoff, doubled with each give-back of the
// claim), and whether that starts now.
func (r *Reconciler) givenBack(pvc *corev1.PersistentVolumeClaim) (at time.Time, delay time.Duration, first bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.state(pvc)
	if st.displaced.IsZero() {
		st.giveBacks++
		st.displaced = time.Now()
		first = true
	}
	return st.displaced, r.grown(r.backoff(), st.giveBacks-1), first
}

// placed notes that the claim has its placement again (its give-backs
// still count), and forgets its warnings.
func (r *Reconciler) placed(pvc *corev1.PersistentVolumeClaim) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.state(pvc)
	st.displaced = time.Time{}
	st.warned = ""
}

// forget forgets a claim that is gone, bound or not a candidate.
func (r *Reconciler) forget(key types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.claims, key)
}
