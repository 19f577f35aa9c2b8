package controller

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/podvol/podvol/internal/controller/admissionparams"
)

// TestAdmissionParams: podvol's StorageClasses are found by provisioner,
// whenever an admin adds or changes one, and written into the admission
// policies' parameters beside the admin's own keys, which are kept.
func TestAdmissionParams(t *testing.T) {
	shared(t)
	mgr, err := ctrl.NewManager(api.Config, manager.Options{Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Controller: config.Controller{SkipNameValidation: ptr.To(true)}})
	if err != nil {
		t.Fatal(err)
	}
	r := &admissionparams.Reconciler{Client: mgr.GetClient(), Driver: "podvol.io", Namespace: "podvol-system", Name: "podvol-admission"}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	c, err := client.NewWithWatch(api.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t}
	e.c = c
	e.ns("podvol-system")
	e.must(c.Create(bg, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "podvol-system", Name: "podvol-admission"}, Data: map[string]string{"inlineMaxSize": "5Gi"}}))
	sc := func(name, provisioner string, params map[string]string) *storagev1.StorageClass {
		return &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: provisioner, Parameters: params}
	}
	e.must(c.Create(bg, sc("podvol", "podvol.io", nil)))
	e.must(c.Create(bg, sc("network", "other.example.com", map[string]string{"directAssign": "always"})))
	e.must(c.Create(bg, sc("kata", "podvol.io", map[string]string{"directAssign": "auto"})))

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = mgr.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	var got map[string]string
	params := func(want map[string]string) func() bool {
		return func() bool {
			var cm corev1.ConfigMap
			if c.Get(bg, client.ObjectKey{Namespace: "podvol-system", Name: "podvol-admission"}, &cm) != nil {
				return false
			}
			got = cm.Data
			for k, v := range want {
				if cm.Data[k] != v {
					return false
				}
			}
			return true
		}
	}
	e.eventually("podvol's classes by provisioner", params(map[string]string{"podvolClasses": "kata podvol", "directClasses": "kata", "defaultIsPodvol": "false", "inlineMaxSize": "5Gi"}))

	e.must(c.Create(bg, sc("podvol-new", "podvol.io", nil)))
	e.eventually("a class added later", params(map[string]string{"podvolClasses": "kata podvol podvol-new"}))

	var def storagev1.StorageClass
	e.must(c.Get(bg, client.ObjectKey{Name: "podvol-new"}, &def))
	def.Annotations = map[string]string{"storageclass.kubernetes.io/is-default-class": "true"}
	e.must(c.Update(bg, &def))
	e.eventually("podvol's class made the default", params(map[string]string{"defaultIsPodvol": "true", "inlineMaxSize": "5Gi"}))
	t.Logf("parameters: %v", got)
}
