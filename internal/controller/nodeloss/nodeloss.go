package nodeloss

import (
	"context"
	"strings"
	"sync"
	"time"

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
	// ReasonHeldForMigration: the Node was deleted while volumes are being
	// moved off it; it is held until they are.
	ReasonHeldForMigration = "NodeHeldForMigration"
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
	if !controllerutil.ContainsFinalizer(node, names.NodeLossFinalizer) {
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
		if held, err := r.holdForMigrations(ctx, node, w, false); err != nil || held {
			return ctrl.Result{RequeueAfter: r.poll()}, err
		}
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
		if held, err := r.holdForMigrations(ctx, node, w, true); err != nil || held {
			return ctrl.Result{RequeueAfter: r.poll()}, err
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
