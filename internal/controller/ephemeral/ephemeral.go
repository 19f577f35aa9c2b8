// Package ephemeral is podvol's ephemeral volume controller, with the
// upstream contract (KEP-1698) so that it can replace kube-controller-
// manager's or run beside it: every volumes[].ephemeral.volumeClaimTemplate
// of a pod becomes a PVC <pod>-<volume> owned by the pod; a PVC of that name
// that the pod does not control is never touched.
package ephemeral

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	claims "k8s.io/component-helpers/storage/ephemeral"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

var (
	createTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "podvol_ephemeral_volume_controller_create_total",
		Help: "PVCs created for ephemeral volumes of pods.",
	})
	createFailures = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "podvol_ephemeral_volume_controller_create_failures_total",
		Help: "PVC creations for ephemeral volumes that failed.",
	})
)

func init() { metrics.Registry.MustRegister(createTotal, createFailures) }

// Reconciler creates the PVCs of pods' ephemeral volumes.
type Reconciler struct {
	Client client.Client
	// APIReader reads past the cache where a stale answer would be wrong
	// for good: a PVC created for a pod that is already going away, or a
	// foreign PVC never reported. SetupWithManager fills it in.
	APIReader client.Reader
	Recorder  events.EventRecorder
	// Workers is how many pods are reconciled at once (at least 1): with
	// one, a burst of pods waits in line for its claims.
	Workers int
}

// DefaultWorkers is kube-controller-manager's default for its own ephemeral
// volume controller (--concurrent-ephemeralvolume-syncs).
const DefaultWorkers = 5

// claimIndex indexes pods by the names of their ephemeral volumes' PVCs.
const claimIndex = "podvol.ephemeral-claims"

// SetupWithManager watches pods, and deleted PVCs: a PVC deleted while its
// pod lives is created again, and the pod that a foreign PVC of the same
// name kept waiting gets its own once that PVC is removed (a foreign PVC
// fires no event for the pod otherwise).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	err := mgr.GetFieldIndexer().IndexField(context.Background(), &corev1.Pod{}, claimIndex, func(o client.Object) []string {
		pod := o.(*corev1.Pod)
		var names []string
		for i := range pod.Spec.Volumes {
			if v := &pod.Spec.Volumes[i]; v.Ephemeral != nil {
				names = append(names, claims.VolumeClaimName(pod, v))
			}
		}
		return names
	})
	if err != nil {
		return err
	}
	podsWanting := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		pods := &corev1.PodList{}
		if err := mgr.GetClient().List(ctx, pods, client.InNamespace(o.GetNamespace()), client.MatchingFields{claimIndex: o.GetName()}); err != nil {
			log.FromContext(ctx).Error(err, "List the pods waiting for a PVC", "pvc", o.GetNamespace()+"/"+o.GetName())
			return nil
		}
		reqs := make([]reconcile.Request, 0, len(pods.Items))
		for _, p := range pods.Items {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&p)})
		}
		return reqs
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("ephemeral-volume").
		WithOptions(controller.Options{MaxConcurrentReconciles: max(r.Workers, 1)}).
		For(&corev1.Pod{}).
		Watches(&corev1.PersistentVolumeClaim{}, podsWanting, builder.WithPredicates(predicate.Funcs{
			CreateFunc:  func(event.CreateEvent) bool { return false },
			UpdateFunc:  func(event.UpdateEvent) bool { return false },
			GenericFunc: func(event.GenericEvent) bool { return false },
		})).
		Complete(r)
}

// Reconcile makes sure every ephemeral volume of the pod has its PVC.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	pod := &corev1.Pod{}
	if err := r.Client.Get(ctx, req.NamespacedName, pod); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	// A pod that is going away needs no new volume.
	if pod.DeletionTimestamp != nil {
		return ctrl.Result{}, nil
	}
	for i := range pod.Spec.Volumes {
		vol := &pod.Spec.Volumes[i]
		if vol.Ephemeral == nil || vol.Ephemeral.VolumeClaimTemplate == nil {
			continue
		}
		if err := r.ensureClaim(ctx, pod, vol); err != nil {
			return ctrl.Result{}, err
		}
	}
	return ctrl.Result{}, nil
}

func (r *Reconciler) ensureClaim(ctx context.Context, pod *corev1.Pod, vol *corev1.Volume) error {
	name := claims.VolumeClaimName(pod, vol)
	existing := &corev1.PersistentVolumeClaim{}
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: name}, existing)
	if err == nil {
		r.checkOwner(pod, existing)
		return nil
	}
	if !apierrors.IsNotFound(err) {
		return err
	}
	// The PVC may be missing because the pod was deleted with it, and the
	// cache has seen the one deletion but not yet the other.
	live := &corev1.Pod{}
	if err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}, live); err != nil {
		return client.IgnoreNotFound(err)
	}
	if live.UID != pod.UID || live.DeletionTimestamp != nil {
		return nil
	}
	tmpl := vol.Ephemeral.VolumeClaimTemplate
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Namespace:   pod.Namespace,
			Labels:      tmpl.Labels,
			Annotations: tmpl.Annotations,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion:         "v1",
				Kind:               "Pod",
				Name:               pod.Name,
				UID:                pod.UID,
				Controller:         ptr.To(true),
				BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Spec: tmpl.Spec,
	}
	if err := r.Client.Create(ctx, pvc); err != nil {
		if !apierrors.IsAlreadyExists(err) {
			createFailures.Inc()
			return fmt.Errorf("create PVC %s/%s for pod %s: %w", pod.Namespace, name, pod.Name, err)
		}
		// The cache has not seen that PVC yet, and unless the pod controls
		// it, it fires no event for the pod: look at it now.
		if err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: name}, existing); err != nil {
			return client.IgnoreNotFound(err)
		}
		r.checkOwner(pod, existing)
		return nil
	}
	createTotal.Inc()
	return nil
}

// checkOwner warns on the pod when its PVC's name is taken by a PVC it does
// not control: that PVC is never taken over, and the pod stays pending.
func (r *Reconciler) checkOwner(pod *corev1.Pod, pvc *corev1.PersistentVolumeClaim) {
	// The same check, and message, as kubelet and kube-scheduler make.
	if err := claims.VolumeIsForPod(pod, pvc); err != nil {
		r.Recorder.Eventf(pod, nil, corev1.EventTypeWarning, "FailedBinding", "CreatePVC", "%s: rename the volume or remove that PVC", err)
	}
}
