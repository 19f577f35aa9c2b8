// Package admissionparams keeps the parameters of podvol's admission policies
// in step with the cluster's StorageClasses. A ValidatingAdmissionPolicy can
// read only the object under review and one parameter object, not other
// objects, so it cannot tell by itself which StorageClasses are podvol's (an
// admin may add one at any time) or whether the cluster's default class is
// one of them (a template that names no class gets it). This controller
// writes those facts into the policies' parameter ConfigMap, derived from the
// StorageClasses' provisioner.
package admissionparams

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/podvol/podvol/internal/names"
)

// Keys of the parameter ConfigMap this controller owns. Other keys (the
// inline size cap) are the admin's and are left as they are.
const (
	// Classes lists podvol's StorageClasses, space-separated.
	Classes = "podvolClasses"
	// DirectClasses lists those that hand volumes to microVMs.
	DirectClasses = "directClasses"
	// DefaultIsPodvol is "true" when a podvol class is the cluster default.
	DefaultIsPodvol = "defaultIsPodvol"
	// PlacedClasses lists those of WaitForFirstConsumer binding, whose
	// restores and clones source-placement places.
	PlacedClasses = "placedClasses"
)

// defaultClassAnnotation marks the cluster's default StorageClass.
const defaultClassAnnotation = "storageclass.kubernetes.io/is-default-class"

// Reconciler writes the facts into ConfigMap Namespace/Name.
type Reconciler struct {
	Client client.Client
	// APIReader reads the ConfigMap: ConfigMaps are not watched (that
	// would cache every ConfigMap of the cluster); SetupWithManager fills
	// it in.
	APIReader client.Reader
	Driver    string
	Namespace string
	Name      string
}

// resync undoes an admin's edit of our keys, or a deleted ConfigMap, that
// no StorageClass event reports.
const resync = time.Minute

// SetupWithManager reconciles the ConfigMap whenever a StorageClass changes.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	key := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: r.Namespace, Name: r.Name}}
	return ctrl.NewControllerManagedBy(mgr).
		Named("admission-params").
		Watches(&storagev1.StorageClass{}, handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
			return []reconcile.Request{key}
		})).
		Complete(r)
}

// Facts derives the parameters from the StorageClasses.
func Facts(classes []storagev1.StorageClass, driver string) map[string]string {
	var all, direct, placed []string
	def := false
	for _, sc := range classes {
		if sc.Provisioner != driver {
			continue
		}
		all = append(all, sc.Name)
		if sc.VolumeBindingMode != nil && *sc.VolumeBindingMode == storagev1.VolumeBindingWaitForFirstConsumer {
			placed = append(placed, sc.Name)
		}
		if d := sc.Parameters[names.ParamDirectAssign]; d == "always" || d == "auto" {
			direct = append(direct, sc.Name)
		}
		if sc.Annotations[defaultClassAnnotation] == "true" {
			def = true
		}
	}
	slices.Sort(all)
	slices.Sort(direct)
	slices.Sort(placed)
	return map[string]string{Classes: strings.Join(all, " "), DirectClasses: strings.Join(direct, " "), DefaultIsPodvol: fmt.Sprint(def),
		PlacedClasses: strings.Join(placed, " ")}
}

// Reconcile writes the current facts into the ConfigMap, creating it if an
// admin deleted it (the policies refuse everything they check without it).
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var scs storagev1.StorageClassList
	if err := r.Client.List(ctx, &scs); err != nil {
		return reconcile.Result{}, err
	}
	facts := Facts(scs.Items, r.Driver)
	var cm corev1.ConfigMap
	err := r.APIReader.Get(ctx, req.NamespacedName, &cm)
	if apierrors.IsNotFound(err) {
		cm = corev1.ConfigMap{Data: facts}
		cm.Namespace, cm.Name = r.Namespace, r.Name
		log.FromContext(ctx).Info("Creating the admission policies' parameters", "configMap", req.NamespacedName, "facts", facts)
		return reconcile.Result{RequeueAfter: resync}, client.IgnoreAlreadyExists(r.Client.Create(ctx, &cm))
	}
	if err != nil {
		return reconcile.Result{}, err
	}
	changed := false
	for k, v := range facts {
		if cm.Data[k] != v {
			changed = true
		}
	}
	if !changed {
		return reconcile.Result{RequeueAfter: resync}, nil
	}
	patch := client.MergeFrom(cm.DeepCopy())
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	for k, v := range facts {
		cm.Data[k] = v
	}
	log.FromContext(ctx).Info("Updating the admission policies' parameters", "configMap", req.NamespacedName, "facts", facts)
	return reconcile.Result{RequeueAfter: resync}, r.Client.Patch(ctx, &cm, patch)
}
