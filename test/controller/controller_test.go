// Package controller tests podvol-controller's reconcilers against a real
// kube-apiserver and etcd (envtest). There is no kube-controller-manager and
// no kubelet: pod phases are set by the test, and nothing else acts.
package controller

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/podvol/podvol/internal/controller/clonelifecycle"
	"github.com/podvol/podvol/internal/controller/ephemeral"
	"github.com/podvol/podvol/internal/controller/grouprouting"
	"github.com/podvol/podvol/internal/controller/migration"
	"github.com/podvol/podvol/internal/controller/nodeloss"
	"github.com/podvol/podvol/internal/controller/snapshotimport"
	"github.com/podvol/podvol/internal/controller/sourceplacement"
	"github.com/podvol/podvol/internal/names"
)

type env struct {
	t   *testing.T
	c   client.WithWatch
	rec events.EventRecorder
	// liveGets counts the manager's GETs of one object from the API
	// server, by resource.
	liveGets *requests
	// snapshotReads counts source-placement's reads of VolumeSnapshots.
	snapshotReads *atomic.Int64
}

// start runs podvol-controller's reconcilers in a manager on the package's
// API server: all of them, or only those named.
func start(t *testing.T, only ...string) *env { return startWith(t, nil, only...) }

// startWith is start with the manager's RESTMapper wrapped by mapper, if not
// nil.
func startWith(t *testing.T, mapper func(meta.RESTMapper) meta.RESTMapper, only ...string) *env {
	shared(t)
	gets := &requests{n: map[string]int{}}
	cfg := rest.CopyConfig(api.Config)
	cfg.WrapTransport = gets.wrap
	opts := manager.Options{Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
		// As cmd/podvol-controller.
		Client: client.Options{Cache: &client.CacheOptions{Unstructured: true}}}
	if mapper != nil {
		opts.MapperProvider = func(c *rest.Config, hc *http.Client) (meta.RESTMapper, error) {
			m, err := apiutil.NewDynamicRESTMapper(c, hc)
			return mapper(m), err
		}
	}
	// Each test starts its own manager in this one process.
	mgr, err := ctrl.NewManager(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	rec := mgr.GetEventRecorder("podvol-controller")
	reads := &atomic.Int64{}
	for name, r := range map[string]interface{ SetupWithManager(ctrl.Manager) error }{
		"ephemeral-volume":       &ephemeral.Reconciler{Client: mgr.GetClient(), Recorder: rec},
		"clone-lifecycle":        &clonelifecycle.Reconciler{Client: mgr.GetClient(), Recorder: rec},
		"node-loss":              &nodeloss.Reconciler{Client: mgr.GetClient(), Recorder: rec, Driver: "podvol.io"},
		"snapshot-import":        &snapshotimport.Reconciler{Client: mgr.GetClient(), Recorder: rec, Driver: "podvol.io"},
		"group-snapshot-routing": &grouprouting.Reconciler{Client: mgr.GetClient(), Recorder: rec, Driver: "podvol.io"},
		"source-placement": &sourceplacement.Reconciler{Client: countSnapshotReads{mgr.GetClient(), reads}, Recorder: rec, Driver: "podvol.io",
			Backoff: placementBackoff, Wait: placementWait},
		"migration":       &migration.Reconciler{Client: mgr.GetClient(), Recorder: rec, Driver: "podvol.io", StashNamespace: "podvol-system", Poll: 200 * time.Millisecond},
		"migration-holds": &migration.Holds{Client: mgr.GetClient(), Recorder: rec, Driver: "podvol.io", Poll: 200 * time.Millisecond},
	} {
		if len(only) > 0 && !slices.Contains(only, name) {
			continue
		}
		if err := r.SetupWithManager(mgr); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := mgr.Start(ctx); err != nil {
			t.Errorf("manager: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	c, err := client.NewWithWatch(api.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, c: c, rec: rec, liveGets: gets, snapshotReads: reads}
}

// requests counts GETs of one object (not lists, not watches) by resource.
type requests struct {
	mu sync.Mutex
	n  map[string]int
}

func (q *requests) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		if req.Method == http.MethodGet && req.URL.Query().Get("watch") == "" {
			// /api/v1/... or /apis/<group>/<version>/..., then
			// [namespaces/<ns>/]<resource>[/<name>[/<subresource>]]
			parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
			rest := parts
			switch {
			case len(parts) >= 2 && parts[0] == "api":
				rest = parts[2:]
			case len(parts) >= 3 && parts[0] == "apis":
				rest = parts[3:]
			}
			if len(rest) >= 2 && rest[0] == "namespaces" && len(rest) > 2 {
				rest = rest[2:]
			}
			if len(rest) == 2 {
				q.mu.Lock()
				q.n[rest[0]]++
				q.mu.Unlock()
			}
		}
		return rt.RoundTrip(req)
	})
}

func (q *requests) count(resource string) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n[resource]
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// countSnapshotReads counts the reads of VolumeSnapshots through a client.
type countSnapshotReads struct {
	client.Client
	n *atomic.Int64
}

func (c countSnapshotReads) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if u, ok := obj.(*unstructured.Unstructured); ok && u.GroupVersionKind() == sourceplacement.SnapshotGVK {
		c.n.Add(1)
	}
	return c.Client.Get(ctx, key, obj, opts...)
}

var bg = context.Background()

func (e *env) must(err error) {
	e.t.Helper()
	if err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) eventually(what string, check func() bool) {
	e.t.Helper()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if check() {
			return
		}
	}
	e.t.Fatalf("timed out waiting for %s", what)
}

// never checks for a while that something does not happen.
func (e *env) never(what string, check func() bool) {
	e.t.Helper()
	e.neverFor(3*time.Second, what, check)
}

// neverFor checks for d that something does not happen.
func (e *env) neverFor(d time.Duration, what string, check func() bool) {
	e.t.Helper()
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if check() {
			e.t.Fatalf("%s happened", what)
		}
	}
}

func (e *env) pvc(ns, name string) *corev1.PersistentVolumeClaim {
	p := &corev1.PersistentVolumeClaim{}
	if err := e.c.Get(bg, client.ObjectKey{Namespace: ns, Name: name}, p); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		e.t.Fatal(err)
	}
	return p
}

func (e *env) events(ns, object string) string {
	l := &corev1.EventList{}
	e.must(e.c.List(bg, l, client.InNamespace(ns)))
	var out []string
	for _, ev := range l.Items {
		if ev.InvolvedObject.Name == object {
			out = append(out, ev.Reason+": "+ev.Message)
		}
	}
	return strings.Join(out, "\n")
}

func (e *env) ns(name string) string {
	// The package's tests share one API server, where no namespace is
	// ever deleted (no namespace controller): an earlier test's, emptied
	// by wipe, is used again.
	if err := e.c.Create(bg, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil && !apierrors.IsAlreadyExists(err) {
		e.t.Fatal(err)
	}
	return name
}

var spec = corev1.PersistentVolumeClaimSpec{
	AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
	StorageClassName: ptr.To("podvol"),
	Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
}

func podWith(ns, name string, vols ...corev1.Volume) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}, Volumes: vols}}
}

func ephemeralVol(name string) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{
		VolumeClaimTemplate: &corev1.PersistentVolumeClaimTemplate{
			ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"tier": "scratch"}, Annotations: map[string]string{"note": "from-template"}},
			Spec:       spec,
		}}}}
}

func claimVol(claim string) corev1.Volume {
	return corev1.Volume{Name: "v", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}
}

func TestEphemeralVolumeController(t *testing.T) {
	e := start(t)
	ns := e.ns("eph")
	pod := podWith(ns, "web", ephemeralVol("cache"), ephemeralVol("tmp"))
	e.must(e.c.Create(bg, pod))
	for _, name := range []string{"web-cache", "web-tmp"} {
		e.eventually("PVC "+name, func() bool { return e.pvc(ns, name) != nil })
		p := e.pvc(ns, name)
		if !metav1.IsControlledBy(p, pod) || !*p.OwnerReferences[0].BlockOwnerDeletion {
			t.Fatalf("%s owner references: %+v", name, p.OwnerReferences)
		}
		if p.Labels["tier"] != "scratch" || p.Annotations["note"] != "from-template" || *p.Spec.StorageClassName != "podvol" {
			t.Fatalf("%s does not carry the template: %+v", name, p.ObjectMeta)
		}
	}

	// A PVC deleted while its pod lives is created again.
	old := e.pvc(ns, "web-cache")
	e.must(e.c.Delete(bg, old))
	e.eventually("web-cache created again", func() bool { p := e.pvc(ns, "web-cache"); return p != nil && p.UID != old.UID })

	// A PVC of that name the pod does not control is left alone, and the
	// pod's events say why.
	foreign := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "api-data", Labels: map[string]string{"mine": "yes"}}, Spec: spec}
	e.must(e.c.Create(bg, foreign))
	e.must(e.c.Create(bg, podWith(ns, "api", ephemeralVol("data"))))
	e.eventually("FailedBinding event", func() bool { return strings.Contains(e.events(ns, "api"), "FailedBinding") })
	if p := e.pvc(ns, "api-data"); len(p.OwnerReferences) != 0 || p.Labels["mine"] != "yes" {
		t.Fatalf("a foreign PVC was changed: %+v", p.ObjectMeta)
	}
	// Once the user removes it, as the event says, the pod gets its own.
	api := &corev1.Pod{}
	e.must(e.c.Get(bg, client.ObjectKey{Namespace: ns, Name: "api"}, api))
	e.must(e.c.Delete(bg, e.pvc(ns, "api-data")))
	e.eventually("api-data created for the pod", func() bool { p := e.pvc(ns, "api-data"); return p != nil && metav1.IsControlledBy(p, api) })

	// A pod being deleted gets nothing new.
	term := podWith(ns, "going", ephemeralVol("v"))
	term.Finalizers = []string{"test.podvol.io/hold"}
	e.must(e.c.Create(bg, term))
	e.eventually("going-v", func() bool { return e.pvc(ns, "going-v") != nil })
	e.must(e.c.Delete(bg, term))
	e.must(e.c.Delete(bg, e.pvc(ns, "going-v")))
	e.never("a PVC created for a terminating pod", func() bool { return e.pvc(ns, "going-v") != nil })
	e.must(e.c.Get(bg, client.ObjectKeyFromObject(term), term))
	term.Finalizers = nil
	e.must(e.c.Update(bg, term))
}

// The reconciler reads through a cache that can lag behind the API. Here it
// runs alone (no manager acts on these pods) with a cache that has not seen
// the PVC and, for the second pod, not its deletion either.
func TestEphemeralVolumeControllerStaleCache(t *testing.T) {
	e := start(t, "node-loss")
	ns := e.ns("stale")
	behind := interceptor.NewClient(e.c, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if _, ok := obj.(*corev1.PersistentVolumeClaim); ok {
				return apierrors.NewNotFound(corev1.Resource("persistentvolumeclaims"), key.Name)
			}
			err := c.Get(ctx, key, obj, opts...)
			obj.SetDeletionTimestamp(nil)
			return err
		},
	})
	r := &ephemeral.Reconciler{Client: behind, APIReader: e.c, Recorder: e.rec}
	reconcile := func(pod *corev1.Pod) {
		t.Helper()
		if _, err := r.Reconcile(bg, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(pod)}); err != nil {
			t.Fatalf("reconcile %s: %v", pod.Name, err)
		}
	}

	// The Create fails with AlreadyExists, and a PVC the pod does not
	// control fires no event for the pod: the warning must come now.
	e.must(e.c.Create(bg, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "job-data"}, Spec: spec}))
	pod := podWith(ns, "job", ephemeralVol("data"))
	e.must(e.c.Create(bg, pod))
	reconcile(pod)
	e.eventually("FailedBinding event", func() bool { return strings.Contains(e.events(ns, "job"), "FailedBinding") })
	if p := e.pvc(ns, "job-data"); len(p.OwnerReferences) != 0 {
		t.Fatalf("a foreign PVC was changed: %+v", p.ObjectMeta)
	}

	// A pod deleted together with its PVC, seen by the cache as alive.
	going := podWith(ns, "going", ephemeralVol("v"))
	going.Finalizers = []string{"test.podvol.io/hold"}
	e.must(e.c.Create(bg, going))
	e.must(e.c.Delete(bg, going))
	reconcile(going)
	if e.pvc(ns, "going-v") != nil {
		t.Fatal("a PVC was created for a pod that is being deleted")
	}
	e.must(e.c.Get(bg, client.ObjectKeyFromObject(going), going))
	going.Finalizers = nil
	e.must(e.c.Update(bg, going))
}

func setPhase(e *env, p *corev1.Pod, phase corev1.PodPhase) {
	e.must(e.c.Get(bg, client.ObjectKeyFromObject(p), p))
	p.Status.Phase = phase
	e.must(e.c.Status().Update(bg, p))
}

func TestResetOnDetach(t *testing.T) {
	e := start(t)
	ns := e.ns("clones")
	e.must(e.c.Create(bg, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "golden"}, Spec: spec}))
	cs := spec.DeepCopy()
	cs.DataSource = &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "golden"}
	clone := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "work", Labels: map[string]string{"app": "ci"},
		Annotations: map[string]string{names.Lifecycle: names.ResetOnDetach}}, Spec: *cs}
	e.must(e.c.Create(bg, clone))
	first := e.pvc(ns, "work").UID

	// Not used yet: left alone.
	e.never("a reset before first use", func() bool { p := e.pvc(ns, "work"); return p == nil || p.UID != first })

	user := podWith(ns, "user", claimVol("work"))
	e.must(e.c.Create(bg, user))
	setPhase(e, user, corev1.PodRunning)
	e.eventually("the clone marked used", func() bool { return e.pvc(ns, "work").Annotations[names.Used] == "true" })
	e.never("a reset while a pod uses it", func() bool { return e.pvc(ns, "work").UID != first })

	e.must(e.c.Delete(bg, user, client.GracePeriodSeconds(0)))
	e.eventually("the clone reset", func() bool { p := e.pvc(ns, "work"); return p != nil && p.UID != first })
	p := e.pvc(ns, "work")
	if p.Annotations[names.ResetCount] != "1" || p.Annotations[names.LastReset] == "" || p.Annotations[names.Used] != "" ||
		p.Labels["app"] != "ci" || p.Spec.DataSource == nil || p.Spec.DataSource.Name != "golden" {
		t.Fatalf("reset PVC: %+v %+v", p.ObjectMeta, p.Spec)
	}
	// Events are sent in the background.
	e.eventually("the reset events", func() bool {
		ev := e.events(ns, "work")
		return strings.Contains(ev, "ResetOnDetach: no pod uses") && strings.Contains(ev, "ResetOnDetach: created again as a fresh clone (reset 1)")
	})
	e.eventually("the stash removed", func() bool {
		return apierrors.IsNotFound(e.c.Get(bg, client.ObjectKey{Namespace: ns, Name: "podvol-reset-work"}, &corev1.ConfigMap{}))
	})

	// A finished pod no longer uses it.
	second := e.pvc(ns, "work").UID
	job := podWith(ns, "job", claimVol("work"))
	e.must(e.c.Create(bg, job))
	setPhase(e, job, corev1.PodRunning)
	e.eventually("used again", func() bool { return e.pvc(ns, "work").Annotations[names.Used] == "true" })
	setPhase(e, job, corev1.PodSucceeded)
	e.eventually("reset after the pod finished", func() bool { p := e.pvc(ns, "work"); return p != nil && p.UID != second })
	if got := e.pvc(ns, "work").Annotations[names.ResetCount]; got != "2" {
		t.Fatalf("reset count %q", got)
	}
	// Each reset has its own two messages.
	e.eventually("the second reset's events", func() bool {
		ev := e.events(ns, "work")
		return strings.Contains(ev, "deleting it and creating it again as a fresh clone (reset 2)") && strings.Contains(ev, "created again as a fresh clone (reset 2)")
	})
}

// A clone must not be reset because the cache has not seen the pod that
// started using it: the reset deletes it for good.
func TestResetOnDetachStaleCache(t *testing.T) {
	e := start(t, "node-loss")
	ns := e.ns("stale-clones")
	e.must(e.c.Create(bg, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "golden"}, Spec: spec}))
	cs := spec.DeepCopy()
	cs.DataSource = &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "golden"}
	e.must(e.c.Create(bg, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "work",
		Annotations: map[string]string{names.Lifecycle: names.ResetOnDetach, names.Used: "true"}}, Spec: *cs}))
	first := e.pvc(ns, "work").UID
	user := podWith(ns, "user", claimVol("work"))
	e.must(e.c.Create(bg, user))
	setPhase(e, user, corev1.PodRunning)

	noPods := interceptor.NewClient(e.c, interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if _, ok := list.(*corev1.PodList); ok {
				return nil
			}
			return c.List(ctx, list, opts...)
		},
	})
	r := &clonelifecycle.Reconciler{Client: noPods, APIReader: e.c, Recorder: e.rec}
	if _, err := r.Reconcile(bg, ctrl.Request{NamespacedName: client.ObjectKey{Namespace: ns, Name: "work"}}); err != nil {
		t.Fatal(err)
	}
	if p := e.pvc(ns, "work"); p == nil || p.UID != first || p.DeletionTimestamp != nil {
		t.Fatalf("a clone in use was reset: %+v", p)
	}
}

func TestCrossNamespaceSourceNeedsGrant(t *testing.T) {
	e := start(t)
	src, dst := e.ns("golden"), e.ns("team")
	e.must(e.c.Create(bg, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: src, Name: "image"}, Spec: spec}))
	mk := func(name string) {
		s := spec.DeepCopy()
		s.DataSourceRef = &corev1.TypedObjectReference{Kind: "PersistentVolumeClaim", Name: "image", Namespace: ptr.To(src)}
		e.must(e.c.Create(bg, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: dst, Name: name,
			Annotations: map[string]string{names.Lifecycle: names.ResetOnDetach}}, Spec: *s}))
		if p := e.pvc(dst, name); p.Spec.DataSourceRef == nil || p.Spec.DataSourceRef.Namespace == nil {
			t.Fatal("the API server dropped dataSourceRef.namespace: CrossNamespaceVolumeDataSource is off")
		}
	}
	mk("denied")
	e.eventually("ReferenceGrantMissing event", func() bool { return strings.Contains(e.events(dst, "denied"), "ReferenceGrantMissing") })
	if ev := e.events(dst, "denied"); !strings.Contains(ev, "no ReferenceGrant in namespace golden") {
		t.Fatalf("event does not say what grant is missing: %s", ev)
	}

	grant := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "gateway.networking.k8s.io/v1beta1", "kind": "ReferenceGrant",
		"metadata": map[string]any{"name": "team-may-clone", "namespace": src},
		"spec": map[string]any{
			"from": []any{map[string]any{"group": "", "kind": "PersistentVolumeClaim", "namespace": dst}},
			"to":   []any{map[string]any{"group": "", "kind": "PersistentVolumeClaim"}},
		},
	}}
	e.must(e.c.Create(bg, grant))
	mk("allowed")
	user := podWith(dst, "user", claimVol("allowed"))
	e.must(e.c.Create(bg, user))
	setPhase(e, user, corev1.PodRunning)
	e.eventually("the granted clone in use", func() bool { return e.pvc(dst, "allowed").Annotations[names.Used] == "true" })
	if ev := e.events(dst, "allowed"); strings.Contains(ev, "ReferenceGrantMissing") {
		t.Fatalf("a granted source was refused: %s", ev)
	}
}

// boundOn creates a PVC bound to a podvol PV on a node.
func (e *env) boundOn(ns, name, class, onNode string) {
	s := spec.DeepCopy()
	s.StorageClassName = ptr.To(class)
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: *s}
	e.must(e.c.Create(bg, pvc))
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv-" + name, Finalizers: []string{"external-provisioner.volume.kubernetes.io/finalizer"}},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName:              class,
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			ClaimRef:                      &corev1.ObjectReference{Namespace: ns, Name: name, UID: pvc.UID},
			PersistentVolumeSource:        corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: "podvol.io", VolumeHandle: "pv-" + name}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: names.TopologyKey, Operator: corev1.NodeSelectorOpIn, Values: []string{onNode}}}}}}},
		},
	}
	e.must(e.c.Create(bg, pv))
}

func TestNodeLossReleasesVolumes(t *testing.T) {
	// A short grace: the node has no Lease, as if its kubelet were gone
	// (nodeloss_test.go tests the Lease rule).
	e, _ := startNodeLoss(t, func(r *nodeloss.Reconciler) { r.Grace, r.LeaseDuration = time.Second, time.Second })
	ns := e.ns("sts")
	e.must(e.c.Create(bg, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "podvol"}, Provisioner: "podvol.io"}))
	e.must(e.c.Create(bg, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "podvol-keep"}, Provisioner: "podvol.io", Parameters: map[string]string{"releaseOnNodeLoss": "false"}}))
	node := e.node("n1", "podvol.io") // only nodes that run podvol are held
	e.eventually("the node's finalizer", func() bool {
		e.must(e.c.Get(bg, client.ObjectKey{Name: "n1"}, node))
		return len(node.Finalizers) == 1 && node.Finalizers[0] == names.NodeLossFinalizer
	})
	e.boundOn(ns, "data-db-0", "podvol", "n1")
	e.boundOn(ns, "kept", "podvol-keep", "n1")
	e.boundOn(ns, "elsewhere", "podvol", "n2")

	e.must(e.c.Delete(bg, node))
	e.eventually("the lost node's PVC and PV released", func() bool {
		return e.pvc(ns, "data-db-0") == nil && apierrors.IsNotFound(e.c.Get(bg, client.ObjectKey{Name: "pv-data-db-0"}, &corev1.PersistentVolume{}))
	})
	e.eventually("the node gone", func() bool { return apierrors.IsNotFound(e.c.Get(bg, client.ObjectKey{Name: "n1"}, &corev1.Node{})) })
	if e.pvc(ns, "kept") == nil || e.pvc(ns, "elsewhere") == nil {
		t.Fatal("an opted-out volume or another node's volume was released")
	}
	if err := e.c.Get(bg, client.ObjectKey{Name: "pv-kept"}, &corev1.PersistentVolume{}); err != nil {
		t.Fatalf("opted-out PV: %v", err)
	}
}

// The release happens once per node: what the cache has not seen then (a
// PV, its PVC, its class) must not be skipped for good, nor a PV left behind
// because a provisioner put its finalizer back.
func TestNodeLossStaleCache(t *testing.T) {
	e := start(t, "ephemeral-volume")
	ns := e.ns("stale-sts")
	e.must(e.c.Create(bg, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "podvol"}, Provisioner: "podvol.io"}))
	e.must(e.c.Create(bg, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Finalizers: []string{names.NodeLossFinalizer}}}))
	e.boundOn(ns, "data-db-0", "podvol", "n1")
	e.must(e.c.Delete(bg, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}))
	empty := interceptor.NewClient(e.c, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if _, ok := obj.(*corev1.Node); ok {
				return c.Get(ctx, key, obj, opts...)
			}
			return apierrors.NewNotFound(schema.GroupResource{}, key.Name)
		},
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			return nil
		},
		// external-provisioner adds its finalizer again to a bound PV
		// that is not being deleted, as soon as it sees it gone.
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if err := c.Patch(ctx, obj, patch, opts...); err != nil {
				return err
			}
			if pv, ok := obj.(*corev1.PersistentVolume); ok && pv.DeletionTimestamp == nil {
				pv.Finalizers = append(pv.Finalizers, "external-provisioner.volume.kubernetes.io/finalizer")
				return c.Update(ctx, pv)
			}
			return nil
		},
	})
	// No Lease: after the grace and the Lease duration assumed for it
	// (both short here) the node is lost; each reconcile reads the Lease
	// again until then.
	r := &nodeloss.Reconciler{Client: empty, APIReader: e.c, Recorder: e.rec, Driver: "podvol.io", Grace: time.Millisecond, LeaseDuration: time.Millisecond}
	for i := 0; ; i++ {
		res, err := r.Reconcile(bg, ctrl.Request{NamespacedName: client.ObjectKey{Name: "n1"}})
		if err != nil {
			t.Fatal(err)
		}
		if res.IsZero() {
			break
		}
		if i == 20 {
			t.Fatal("still waiting for the Lease")
		}
		time.Sleep(res.RequeueAfter)
	}
	if e.pvc(ns, "data-db-0") != nil || !apierrors.IsNotFound(e.c.Get(bg, client.ObjectKey{Name: "pv-data-db-0"}, &corev1.PersistentVolume{})) {
		t.Fatal("the lost node's PVC or PV was not released")
	}
	if !apierrors.IsNotFound(e.c.Get(bg, client.ObjectKey{Name: "n1"}, &corev1.Node{})) {
		t.Fatal("the node was kept")
	}
}
