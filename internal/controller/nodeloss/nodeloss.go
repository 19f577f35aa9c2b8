// Package nodeloss releases node-local volumes of nodes that are gone: when a
// Node that runs podvol is deleted and its kubelet has stopped renewing its
// Lease for a grace period, the PVCs bound to podvol volumes on it are
// deleted with their PVs, so that StatefulSets create them again and their
// pods schedule elsewhere instead of waiting forever for a node that will not
// come back. A Node deleted while its kubelet is alive (a routine `kubectl
// delete node`, a cloud integration re-creating Node objects) is not lost:
// its volumes are kept. A finalizer on each podvol Node makes sure no
// deletion is missed.
//
// What this relies on in the kubelet (k8s.io/kubernetes v1.37.2):
//   - The kubelet renews its Lease kube-node-lease/<node> every
//     nodeLeaseDurationSeconds/4 (40 s/4 = 10 s by default, 4 % jitter),
//     setting spec.renewTime from its clock; it never deletes the Lease
//     (it runs the lease controller with Run, not Start/Stop), so a dead
//     kubelet leaves a Lease that is no longer renewed.
//   - The Lease is owned by the Node (ownerReference, no blockOwnerDeletion).
//     The garbage collector deletes it only once the Node is gone, or while
//     a foreground deletion of the Node waits for its dependents. While our
//     finalizer holds a Node deleted in the background (kubectl's and the
//     cloud node lifecycle controller's default), its Lease stays, and a live
//     kubelet keeps renewing it: renewing updates the Lease it has and does
//     not need the Node. A kubelet whose Lease is missing creates it again
//     within seconds, but only while its Node exists (the owner reference
//     needs the Node's UID): so while we hold the Node, a live kubelet always
//     shows a renewal within its renew interval.
//   - A running kubelet does not register its Node again once it is gone
//     (registrationCompleted is never reset); only a restarted kubelet does.
//     So "the kubelet registers the Node again" cannot be waited for, and a
//     Node of the same name cannot be created while we hold the old one.
//
// Hence the rule: once a podvol Node is being deleted, the controller reads
// its Lease from the API (not the cache) every few seconds. A renewal seen
// after the deletion (renewTime or the Lease's UID changed, or a Lease
// appeared) means the node is alive: the finalizer is dropped and nothing is
// released. A Lease left unchanged (or missing) for the whole grace period,
// or for the Lease's own duration if that is longer (a shorter wait could
// end before the kubelet's next renewal was due), measured on this
// controller's own clock from when it first saw the deletion, means the
// node is gone: its volumes are released. renewTime is
// compared only with earlier readings of itself, never with this clock: the
// kubelet's clock may be skewed.
package nodeloss

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/podvol/podvol/internal/names"
)

// Finalizer keeps a deleted Node until its volumes are released.
const Finalizer = "podvol.io/release-local-volumes"

// DefaultGrace is how long a deleted Node's Lease must go unrenewed before
// its volumes are released. The kubelet renews every 10 s (a quarter of its
// default 40 s lease duration); kube-controller-manager calls a node
// unreachable after 50 s without a renewal (--node-monitor-grace-period) and
// evicts its pods 300 s after that (the default NoExecute toleration of the
// DefaultTolerationSeconds admission plugin). Five minutes is 30 missed
// renewals, six times the node monitor's grace: a kubelet restart, a node
// reboot or a control-plane upgrade does not get near it, and podvol deletes
// data no sooner than Kubernetes itself gives up on the node's pods.
const DefaultGrace = 5 * time.Minute

// DefaultLeaseDuration is the kubelet's default nodeLeaseDurationSeconds,
// for a Lease that does not say (or is missing: Reconciler.LeaseDuration).
const DefaultLeaseDuration = 40 * time.Second

// Event reasons.
const (
	// ReasonLost: the node is gone, the claim is released.
	ReasonLost = "NodeLost"
	// ReasonNotLost: the Node was deleted while its kubelet lives; nothing
	// was released.
	ReasonNotLost = "NodeNotLost"
	// ReasonWaiting: the Node was deleted; the controller watches its Lease.
	ReasonWaiting = "WaitingForNodeLease"
	// ReasonReleaseFailed: the node is lost, but its volumes could not be
	// released (or written down first) yet; the Node is held until they are.
	ReasonReleaseFailed = "NodeLossReleaseFailed"
)

// Reconciler releases the volumes of lost nodes.
type Reconciler struct {
	Client client.Client
	// APIReader reads PVs, PVCs, StorageClasses and Leases past the cache:
	// the release happens once, and what a stale cache misses then is never
	// released; a Lease read from a lagging cache could look unrenewed.
	// SetupWithManager fills it in.
	APIReader client.Reader
	Recorder  events.EventRecorder
	Driver    string
	// Grace is how long the Lease of a deleted Node must stay unrenewed
	// before its volumes are released (DefaultGrace if zero). The wait is
	// never shorter than the Lease's own duration (see observe).
	Grace time.Duration
	// LeaseDuration is the kubelets' nodeLeaseDurationSeconds, assumed
	// for a Lease that is missing when the deletion is first seen (a
	// present Lease says its own); 40 s, the kubelet's default, if zero.
	LeaseDuration time.Duration
	// Namespace holds the records of released volumes (podvol's own
	// namespace, where tenants cannot write); "" keeps none.
	Namespace string

	mu       sync.Mutex
	watching map[string]*leaseWatch // deleted Nodes by name
	gauged   map[string]bool        // nodes with a podvol_node_loss_released_volumes value
}

// SetupWithManager watches Nodes and CSINodes.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	// A CSINode has its Node's name: podvol registering on a node, or
	// going from it, adds or removes the finalizer.
	sameName := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: o.GetName()}}}
	})
	if r.Namespace != "" {
		if err := mgr.Add(r.gaugeRunnable()); err != nil {
			return err
		}
	}
	return ctrl.NewControllerManagedBy(mgr).Named("node-loss").For(&corev1.Node{}).
		Watches(&storagev1.CSINode{}, sameName).Complete(r)
}

func (r *Reconciler) grace() time.Duration {
	if r.Grace > 0 {
		return r.Grace
	}
	return DefaultGrace
}

// poll is how often a deleted Node's Lease is read: often enough to see a
// kubelet's renewal (every 10 s by default) within seconds.
func (r *Reconciler) poll() time.Duration {
	return min(max(r.grace()/10, 100*time.Millisecond), 5*time.Second)
}

// Reconcile keeps the finalizer on nodes that run podvol and decides, for a
// deleted one, between releasing its volumes and letting it go.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	logger := log.FromContext(ctx)
	node := &corev1.Node{}
	if err := r.Client.Get(ctx, req.NamespacedName, node); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.Name)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if node.DeletionTimestamp == nil {
		r.forget(node.Name)
		return ctrl.Result{}, r.holdIfPodvol(ctx, node)
	}
	if !controllerutil.ContainsFinalizer(node, Finalizer) {
		r.forget(node.Name)
		return ctrl.Result{}, nil
	}

	lease, err := r.readLease(ctx, node.Name)
	if err != nil {
		// Keep polling at the same pace rather than backing off: a
		// reading missed is accounted for as a blind spot (leaseWatch).
		logger.Error(err, "Cannot read the Lease of a deleted node; trying again", "node", node.Name)
		return ctrl.Result{RequeueAfter: r.poll()}, nil
	}
	w, first := r.watch(node)
	v := w.observe(time.Now(), lease, r.grace(), 3*r.poll())
	wait := w.wait(r.grace())
	switch v {
	case waiting:
		if first {
			logger.Info("Node deleted: waiting for its kubelet to renew its Lease before releasing its volumes",
				"node", node.Name, "lease", lease, "grace", r.grace(), "wait", wait)
			r.Recorder.Eventf(node, nil, corev1.EventTypeNormal, ReasonWaiting, "Wait",
				"Node deleted: podvol releases its local volumes only if its kubelet does not renew its Lease %s/%s for %s (a node that is gone); a renewal means the node lives, and its volumes are kept",
				corev1.NamespaceNodeLease, node.Name, wait)
		}
		return ctrl.Result{RequeueAfter: r.poll()}, nil
	case alive:
		logger.Info("Node deleted while its kubelet renews its Lease: not a lost node, keeping its volumes",
			"node", node.Name, "lease", lease)
		if err := r.keep(ctx, node); err != nil {
			return ctrl.Result{}, err
		}
	case lost:
		logger.Info("Node deleted and its Lease not renewed for the grace period: releasing its volumes",
			"node", node.Name, "lease", lease, "grace", r.grace(), "wait", wait)
		if err := r.release(ctx, node.Name, wait); err != nil {
			// Retried with backoff; without an event the Node would
			// only look stuck in Terminating.
			r.Recorder.Eventf(node, nil, corev1.EventTypeWarning, ReasonReleaseFailed, "Release",
				"Node lost, but its podvol volumes cannot be released yet, so the Node stays (Terminating) and podvol retries: %s", brief(err))
			return ctrl.Result{}, err
		}
	}
	if err := r.dropFinalizer(ctx, node); err != nil {
		return ctrl.Result{}, err
	}
	r.forget(node.Name)
	return ctrl.Result{}, nil
}

// brief is an error's message cut to fit an event (whose message the API
// limits to 1 kB).
func brief(err error) string {
	const most = 700
	if m := err.Error(); len(m) > most {
		return strings.ToValidUTF8(m[:most], "") + "..."
	}
	return err.Error()
}

// holdIfPodvol adds the finalizer to a live node whose CSINode lists the
// driver, and removes it from one whose CSINode does not (or that has none):
// nodes without podvol are never held. The cache may lag; its answer is
// corrected by the CSINode event that follows.
func (r *Reconciler) holdIfPodvol(ctx context.Context, node *corev1.Node) error {
	runs, err := r.runsDriver(ctx, node.Name)
	if err != nil {
		return err
	}
	has := controllerutil.ContainsFinalizer(node, Finalizer)
	switch {
	case runs && !has:
		if err := r.Client.Patch(ctx, node, finalizerPatch(true)); err != nil {
			return fmt.Errorf("add finalizer %s to node %s, which runs %s: %w", Finalizer, node.Name, r.Driver, err)
		}
		log.FromContext(ctx).Info("Holding a node that runs podvol until its volumes are dealt with", "node", node.Name)
		r.announceReturn(ctx, node)
	case !runs && has:
		// Confirm past the cache that the Node is not being deleted: a
		// foreground deletion deletes its CSINode (owned by the Node)
		// too, and that Node is to be dealt with, not let go.
		current := &corev1.Node{}
		if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(node), current); err != nil {
			if apierrors.IsNotFound(err) {
				return nil
			}
			return fmt.Errorf("read node %s: %w", node.Name, err)
		}
		if current.DeletionTimestamp != nil {
			return nil // its update event follows
		}
		if err := r.dropFinalizer(ctx, current); err != nil {
			return err
		}
		log.FromContext(ctx).Info("Node no longer runs podvol: not holding it", "node", node.Name, "driver", r.Driver)
	}
	return nil
}

func (r *Reconciler) runsDriver(ctx context.Context, nodeName string) (bool, error) {
	cn := &storagev1.CSINode{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: nodeName}, cn); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("read CSINode %s: %w", nodeName, err)
	}
	return slices.ContainsFunc(cn.Spec.Drivers, func(d storagev1.CSINodeDriver) bool { return d.Name == r.Driver }), nil
}

func (r *Reconciler) dropFinalizer(ctx context.Context, node *corev1.Node) error {
	return removeFinalizer(ctx, r.Client, node)
}

func removeFinalizer(ctx context.Context, c client.Client, node *corev1.Node) error {
	if !controllerutil.ContainsFinalizer(node, Finalizer) {
		return nil
	}
	if err := c.Patch(ctx, node, finalizerPatch(false)); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove finalizer %s from node %s: %w", Finalizer, node.Name, err)
	}
	return nil
}

// finalizerPatch adds or removes our finalizer alone: a strategic merge patch
// of metadata.finalizers (a set) carries no resourceVersion, so it does not
// conflict with the kubelet's frequent Node updates, and touches no other
// finalizer even when our copy of the Node is stale.
func finalizerPatch(add bool) client.Patch {
	key := "$deleteFromPrimitiveList/finalizers"
	if add {
		key = "finalizers"
	}
	b, _ := json.Marshal(map[string]any{"metadata": map[string]any{key: []string{Finalizer}}})
	return client.RawPatch(types.StrategicMergePatchType, b)
}

// leaseState is what one reading of a node's Lease showed.
type leaseState struct {
	Present  bool
	UID      types.UID
	Renewed  time.Time // spec.renewTime, on the kubelet's clock
	Duration time.Duration
}

func (l leaseState) String() string {
	if !l.Present {
		return "missing"
	}
	return fmt.Sprintf("renewed %s (uid %s)", l.Renewed.UTC().Format(time.RFC3339Nano), l.UID)
}

func (r *Reconciler) readLease(ctx context.Context, nodeName string) (leaseState, error) {
	l := &coordinationv1.Lease{}
	if err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: corev1.NamespaceNodeLease, Name: nodeName}, l); err != nil {
		if apierrors.IsNotFound(err) {
			return leaseState{}, nil
		}
		return leaseState{}, fmt.Errorf("read Lease %s/%s: %w", corev1.NamespaceNodeLease, nodeName, err)
	}
	s := leaseState{Present: true, UID: l.UID, Duration: DefaultLeaseDuration}
	if l.Spec.RenewTime != nil {
		s.Renewed = l.Spec.RenewTime.Time
	}
	if d := l.Spec.LeaseDurationSeconds; d != nil && *d > 0 {
		s.Duration = time.Duration(*d) * time.Second
	}
	return s, nil
}

// leaseWatch follows the Lease of one deleted Node. It lives in memory: a
// restarted controller (or a new leader) starts watching again, which only
// delays a release, never hastens one.
type leaseWatch struct {
	node     types.UID
	last     leaseState
	assumed  time.Duration // the duration of a Lease missing at the first reading (DefaultLeaseDuration if zero)
	duration time.Duration // the Lease's duration, while it was there
	since    time.Time     // first reading: when the deletion was first seen
	clear    time.Time     // start of the current run of readings without a blind spot
	lastRead time.Time
}

type verdict int

const (
	waiting verdict = iota
	alive
	lost
)

// observe takes one reading of the Lease at now (a monotonic clock reading).
//
// Alive: the Lease now present differs from the last reading (renewed, or
// created again): only the kubelet writes it, and it did so after the
// deletion was seen. A Lease gone missing is not a renewal (the garbage
// collector deletes it in a foreground deletion).
//
// Lost: no renewal for max(grace, lease duration) since the first reading,
// and the last lease duration of it seen without a blind spot. A grace
// shorter than the Lease's duration does not shorten the wait: the kubelet
// renews every quarter of that duration (10 s of 40 s), so a shorter wait
// could judge a live node before its next renewal was due, and a full
// duration holds four renewals a live kubelet would have made. A blind spot
// is a gap between readings longer than maxGap (an API outage, a stalled
// controller): the kubelet may have been unable to renew through it as well,
// so after one it gets a full lease duration again.
func (w *leaseWatch) observe(now time.Time, cur leaseState, grace, maxGap time.Duration) verdict {
	if w.lastRead.IsZero() {
		w.last, w.since, w.clear, w.lastRead = cur, now, now, now
		w.duration = w.assumed
		if w.duration <= 0 {
			w.duration = DefaultLeaseDuration
		}
		if cur.Present {
			w.duration = cur.Duration
		}
		return waiting
	}
	if now.Sub(w.lastRead) > maxGap {
		w.clear = now
	}
	w.lastRead = now
	if cur.Present && (!w.last.Present || cur.UID != w.last.UID || !cur.Renewed.Equal(w.last.Renewed)) {
		return alive
	}
	w.last = cur // unchanged, or gone missing
	if now.Sub(w.since) >= w.wait(grace) && now.Sub(w.clear) >= w.duration {
		return lost
	}
	return waiting
}

// wait is how long the Lease must go unrenewed: the grace, or the Lease's
// duration if longer (see observe).
func (w *leaseWatch) wait(grace time.Duration) time.Duration {
	return max(grace, w.duration)
}

func (r *Reconciler) watch(node *corev1.Node) (*leaseWatch, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.watching == nil {
		r.watching = map[string]*leaseWatch{}
	}
	w := r.watching[node.Name]
	if w == nil || w.node != node.UID {
		w = &leaseWatch{node: node.UID, assumed: r.LeaseDuration}
		r.watching[node.Name] = w
		return w, true
	}
	return w, false
}

func (r *Reconciler) forget(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.watching, name)
}

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
		release, ok := classes[pv.Spec.StorageClassName]
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

// ErrStillAdded is returned by RemoveFinalizers when the finalizer came back:
// a podvol-controller still runs node-loss.
var ErrStillAdded = errors.New("the finalizer was added again: podvol-controller still runs node-loss (scale deployment podvol-controller to 0 first)")

// RemoveFinalizers removes the finalizer from every Node, for an uninstall:
// Nodes deleted meanwhile go without their volumes being released. After
// settle it checks that nobody added it again (a podvol-controller left
// running would, at the next event of each podvol Node) and returns
// ErrStillAdded, naming the nodes, if someone did. It returns the number of
// Nodes it removed the finalizer from.
func RemoveFinalizers(ctx context.Context, c client.Client, settle time.Duration) (int, error) {
	logger := log.FromContext(ctx)
	held := func() ([]corev1.Node, error) {
		nodes := &corev1.NodeList{}
		if err := c.List(ctx, nodes); err != nil {
			return nil, fmt.Errorf("list nodes: %w", err)
		}
		return slices.DeleteFunc(nodes.Items, func(n corev1.Node) bool { return !controllerutil.ContainsFinalizer(&n, Finalizer) }), nil
	}
	nodes, err := held()
	if err != nil {
		return 0, err
	}
	var errs []error
	removed := 0
	for i := range nodes {
		n := &nodes[i]
		if err := removeFinalizer(ctx, c, n); err != nil {
			errs = append(errs, err)
			continue
		}
		removed++
		logger.Info("Removed podvol's finalizer", "node", n.Name, "deleting", n.DeletionTimestamp != nil)
	}
	if len(errs) > 0 {
		return removed, errors.Join(errs...)
	}
	select {
	case <-ctx.Done():
		return removed, ctx.Err()
	case <-time.After(settle):
	}
	again, err := held()
	if err != nil {
		return removed, err
	}
	if len(again) > 0 {
		names := make([]string, 0, len(again))
		for _, n := range again {
			names = append(names, n.Name)
		}
		sort.Strings(names)
		return removed, fmt.Errorf("nodes %v: %w", names, ErrStillAdded)
	}
	return removed, nil
}
