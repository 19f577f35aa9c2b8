package ephemeral

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// Reconcile's branches against fake clients, as upstream's ephemeral
// controller is tested; test/controller runs it against a real API server
// (the pod's and the PVC's watches, the garbage collector's owner).
//
// The reconciler reads through two clients: Client (the manager's cache)
// and APIReader (the API). Each test gives them their own fake, so that a
// cache that lags the API can be set up: the pod the cache still has may be
// gone, or be another pod of the same name, in the API.

const ns = "ns"

func template(class string) *corev1.PersistentVolumeClaimTemplate {
	return &corev1.PersistentVolumeClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "db"}, Annotations: map[string]string{"note": "scratch"}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOncePod},
			StorageClassName: ptr.To(class),
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
}

func pod(name string, uid types.UID, vols ...corev1.Volume) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: uid},
		Spec: corev1.PodSpec{Volumes: vols, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
}

func ephemeralVol(name string, tmpl *corev1.PersistentVolumeClaimTemplate) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{VolumeClaimTemplate: tmpl}}}
}

func owner(p *corev1.Pod) []metav1.OwnerReference {
	return []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: p.Name, UID: p.UID, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}
}

// claim is the PVC the controller makes for volume vol of pod p.
func claim(p *corev1.Pod, vol string) *corev1.PersistentVolumeClaim {
	tmpl := template("podvol")
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: p.Name + "-" + vol, Labels: tmpl.Labels, Annotations: tmpl.Annotations, OwnerReferences: owner(p)},
		Spec:       tmpl.Spec,
	}
}

// foreign is a PVC of that name the pod does not control.
func foreign(p *corev1.Pod, vol string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: p.Name + "-" + vol, Labels: map[string]string{"mine": "yes"}}}
}

var errAPI = errors.New("the API server is unreachable")

func drain(rec *events.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func TestReconcile(t *testing.T) {
	web := pod("web", "uid-1", ephemeralVol("data", template("podvol")))
	deleting := web.DeepCopy()
	deleting.DeletionTimestamp = ptr.To(metav1.Now())
	deleting.Finalizers = []string{"example.com/hold"}
	// Another pod of the same name, created after web was deleted.
	successor := web.DeepCopy()
	successor.UID = "uid-2"
	two := pod("two", "uid-3", ephemeralVol("a", template("podvol")), ephemeralVol("b", template("podvol")),
		ephemeralVol("no-template", nil), corev1.Volume{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})

	for _, tc := range []struct {
		name   string
		req    string
		cached []client.Object // what the cache (Client) has
		live   []client.Object // what the API (APIReader) has; nil: as cached
		funcs  interceptor.Funcs
		want   []*corev1.PersistentVolumeClaim // every PVC after, in the API
		event  string                          // a substring of the one event; "" none
		// created and failed: the counters' increments.
		created, failed float64
		wantErr         error
	}{
		{name: "a PVC for the pod's ephemeral volume", req: "web", cached: []client.Object{web},
			want: []*corev1.PersistentVolumeClaim{claim(web, "data")}, created: 1},
		{name: "one for each ephemeral volume with a template, nothing for the others", req: "two", cached: []client.Object{two},
			want: []*corev1.PersistentVolumeClaim{claim(two, "a"), claim(two, "b")}, created: 2},
		{name: "a pod without ephemeral volumes", req: "plain", cached: []client.Object{pod("plain", "uid-4")}},
		{name: "a pod that is gone", req: "web"},
		{name: "a pod being deleted needs no volume", req: "web", cached: []client.Object{deleting}},
		{name: "its PVC is there", req: "web", cached: []client.Object{web, claim(web, "data")},
			want: []*corev1.PersistentVolumeClaim{claim(web, "data")}},
		{name: "a foreign PVC of that name is never taken over", req: "web", cached: []client.Object{web, foreign(web, "data")},
			want: []*corev1.PersistentVolumeClaim{foreign(web, "data")}, event: "FailedBinding"},
		{name: "a PVC of the pod's predecessor is not the pod's", req: "web", cached: []client.Object{web, claim(successor, "data")},
			want: []*corev1.PersistentVolumeClaim{claim(successor, "data")}, event: "FailedBinding"},
		{name: "the pod is gone from the API, not yet from the cache", req: "web", cached: []client.Object{web}, live: []client.Object{}},
		{name: "the pod is being deleted in the API, not yet in the cache", req: "web", cached: []client.Object{web}, live: []client.Object{deleting}},
		{name: "the pod's name is another pod's in the API", req: "web", cached: []client.Object{web}, live: []client.Object{successor}},
		{name: "a foreign PVC the cache has not seen yet", req: "web", cached: []client.Object{web}, live: []client.Object{web, foreign(web, "data")},
			want: []*corev1.PersistentVolumeClaim{foreign(web, "data")}, event: "FailedBinding"},
		{name: "its own PVC the cache has not seen yet", req: "web", cached: []client.Object{web}, live: []client.Object{web, claim(web, "data")},
			want: []*corev1.PersistentVolumeClaim{claim(web, "data")}},
		{name: "the PVC cannot be read", req: "web", cached: []client.Object{web}, wantErr: errAPI, funcs: interceptor.Funcs{
			Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, o client.Object, opts ...client.GetOption) error {
				if _, ok := o.(*corev1.PersistentVolumeClaim); ok {
					return errAPI
				}
				return c.Get(ctx, key, o, opts...)
			}}},
		{name: "the PVC cannot be created", req: "web", cached: []client.Object{web}, wantErr: errAPI, failed: 1, funcs: interceptor.Funcs{
			Create: func(context.Context, client.WithWatch, client.Object, ...client.CreateOption) error { return errAPI }}},
		{name: "the create is refused", req: "web", cached: []client.Object{web}, failed: 1, wantErr: errForbidden, funcs: interceptor.Funcs{
			Create: func(context.Context, client.WithWatch, client.Object, ...client.CreateOption) error {
				return errForbidden
			}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			cache := fake.NewClientBuilder().WithObjects(tc.cached...).Build()
			api := cache
			if tc.live != nil {
				// The API has what the cache has not seen: the creates of
				// the reconciler go to it, and the cache lags.
				api = fake.NewClientBuilder().WithObjects(tc.live...).Build()
			}
			// Writes go to the API; reads of Client come from the cache.
			funcs := tc.funcs
			create := funcs.Create
			funcs.Create = func(ctx context.Context, _ client.WithWatch, o client.Object, opts ...client.CreateOption) error {
				if create != nil {
					return create(ctx, api, o, opts...)
				}
				return api.Create(ctx, o, opts...)
			}
			rec := events.NewFakeRecorder(10)
			r := &Reconciler{Client: interceptor.NewClient(cache, funcs), APIReader: api, Recorder: rec}
			req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: tc.req}}
			created0, failed0 := value(createTotal), value(createFailures)

			res, err := r.Reconcile(ctx, req)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Reconcile: error %v, want %v", err, tc.wantErr)
			}
			if err != nil && !strings.Contains(err.Error(), "web-data") && tc.funcs.Create != nil {
				t.Errorf("error %q does not name the PVC", err)
			}
			if !res.IsZero() {
				t.Errorf("Reconcile: %+v, want no requeue", res)
			}
			if d := value(createTotal) - created0; d != tc.created {
				t.Errorf("%s went up by %v, want %v", "create_total", d, tc.created)
			}
			if d := value(createFailures) - failed0; d != tc.failed {
				t.Errorf("%s went up by %v, want %v", "create_failures_total", d, tc.failed)
			}
			evs := drain(rec)
			switch {
			case tc.event == "" && len(evs) > 0:
				t.Errorf("events %q, want none", evs)
			case tc.event != "" && (len(evs) != 1 || !strings.Contains(evs[0], tc.event)):
				t.Errorf("events %q, want one with %q", evs, tc.event)
			}
			checkPVCs(t, api, tc.want)
			if tc.wantErr != nil {
				return
			}
			// Idempotent, once the cache has caught up: a second pass
			// creates nothing more.
			if tc.live == nil {
				if _, err := r.Reconcile(ctx, req); err != nil {
					t.Fatalf("second Reconcile: %v", err)
				}
				if d := value(createTotal) - created0; d != tc.created {
					t.Errorf("second Reconcile created %v more", d-tc.created)
				}
				checkPVCs(t, api, tc.want)
			}
		})
	}
}

var errForbidden = apierrors.NewForbidden(schema.GroupResource{Resource: "persistentvolumeclaims"}, "web-data", errors.New("exceeded quota"))

// checkPVCs compares the PVCs in c with want: names, owners, labels,
// annotations and spec.
func checkPVCs(t *testing.T, c client.Client, want []*corev1.PersistentVolumeClaim) {
	t.Helper()
	l := &corev1.PersistentVolumeClaimList{}
	if err := c.List(context.Background(), l); err != nil {
		t.Fatal(err)
	}
	if len(l.Items) != len(want) {
		var got []string
		for _, p := range l.Items {
			got = append(got, p.Name)
		}
		t.Fatalf("PVCs %v, want %d", got, len(want))
	}
	for _, w := range want {
		i := slices.IndexFunc(l.Items, func(p corev1.PersistentVolumeClaim) bool { return p.Name == w.Name })
		if i < 0 {
			t.Errorf("no PVC %s", w.Name)
			continue
		}
		g := &l.Items[i]
		if !equalOwners(g.OwnerReferences, w.OwnerReferences) {
			t.Errorf("PVC %s: owners %+v, want %+v", g.Name, g.OwnerReferences, w.OwnerReferences)
		}
		if !mapsEqual(g.Labels, w.Labels) || !mapsEqual(g.Annotations, w.Annotations) {
			t.Errorf("PVC %s: labels %v annotations %v, want %v %v", g.Name, g.Labels, g.Annotations, w.Labels, w.Annotations)
		}
		if !g.Spec.Resources.Requests.Storage().Equal(*w.Spec.Resources.Requests.Storage()) ||
			ptr.Deref(g.Spec.StorageClassName, "") != ptr.Deref(w.Spec.StorageClassName, "") || !slices.Equal(g.Spec.AccessModes, w.Spec.AccessModes) {
			t.Errorf("PVC %s: spec %+v, want %+v", g.Name, g.Spec, w.Spec)
		}
	}
}

func equalOwners(a, b []metav1.OwnerReference) bool {
	return slices.EqualFunc(a, b, func(x, y metav1.OwnerReference) bool {
		return x.APIVersion == y.APIVersion && x.Kind == y.Kind && x.Name == y.Name && x.UID == y.UID &&
			ptr.Deref(x.Controller, false) == ptr.Deref(y.Controller, false) && ptr.Deref(x.BlockOwnerDeletion, false) == ptr.Deref(y.BlockOwnerDeletion, false)
	})
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if bv, ok := b[k]; !ok || bv != v {
			return false
		}
	}
	return true
}

func value(c prometheus.Counter) float64 {
	m := &dto.Metric{}
	if err := c.Write(m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}
