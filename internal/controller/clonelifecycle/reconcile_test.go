package clonelifecycle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/podvol/podvol/internal/names"
)

// Reconcile's branches against fake clients; test/controller runs the
// reset against a real API server (UID preconditions, which the fake
// client does not check, finalizers, a cache that lags on purpose, forged
// stashes).
//
// The reconciler reads through two clients: Client (the manager's cache)
// and APIReader (the API). A test may give the API more than the cache
// has, as a lagging cache does.

const (
	ns      = "ns"
	stashNS = "podvol-system"
)

var key = types.NamespacedName{Namespace: ns, Name: "work"}

// clone is the ephemeral clone work of golden; used: a pod has used it.
func clone(used bool) *corev1.PersistentVolumeClaim {
	ann := map[string]string{names.Lifecycle: names.ResetOnDetach, "pv.kubernetes.io/bind-completed": "yes", "team": "a"}
	if used {
		ann[names.Used] = "true"
	}
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "work", UID: "uid-work", Annotations: ann, Labels: map[string]string{"app": "ci"}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: ptr.To("podvol"),
			VolumeName:       "pv-work",
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
			DataSource:       &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "golden"},
		},
	}
}

func pod(name string, phase corev1.PodPhase, claim string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name)},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}}},
		Status: corev1.PodStatus{Phase: phase}}
}

// stashOf is the stash reset writes before deleting old: for claim, with
// old's UID.
func stashOf(old *corev1.PersistentVolumeClaim, claim string, count int) *corev1.ConfigMap {
	next := derive(key, old)
	next.Annotations[names.ResetCount] = string(rune('0' + count))
	b, _ := json.Marshal(next)
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: stashNS, Name: stashName(key), UID: "uid-stash",
			Annotations: map[string]string{names.StashClaim: claim, names.StashOldUID: string(old.UID)}},
		Data: map[string]string{stashKey: string(b)},
	}
}

// grant lets the PVCs of namespace ns use the PVCs of namespace in.
func grant(in string) *unstructured.Unstructured {
	g := &unstructured.Unstructured{}
	g.SetGroupVersionKind(schema.GroupVersionKind{Group: "gateway.networking.k8s.io", Version: "v1beta1", Kind: "ReferenceGrant"})
	g.SetNamespace(in)
	g.SetName("clones")
	g.Object["spec"] = map[string]any{
		"from": []any{map[string]any{"group": "", "kind": "PersistentVolumeClaim", "namespace": ns}},
		"to":   []any{map[string]any{"group": "", "kind": "PersistentVolumeClaim"}},
	}
	return g
}

var errAPI = errors.New("the API server is unreachable")

type env struct {
	t          *testing.T
	cache, api client.WithWatch
	r          *Reconciler
	rec        *events.FakeRecorder
}

// newEnv is a reconciler whose cache holds cached and whose API holds live
// (the same client when live is nil). Writes go to the API.
func newEnv(t *testing.T, funcs interceptor.Funcs, cached, live []client.Object) *env {
	t.Helper()
	build := func(objs []client.Object) client.WithWatch {
		var typed []client.Object
		var unstr []client.Object
		for _, o := range objs {
			if _, ok := o.(*unstructured.Unstructured); ok {
				unstr = append(unstr, o)
			} else {
				typed = append(typed, o)
			}
		}
		c := fake.NewClientBuilder().WithObjects(typed...).
			WithIndex(&corev1.Pod{}, claimIndex, func(o client.Object) []string { return claimsOf(o.(*corev1.Pod)) }).Build()
		// ReferenceGrant is not in the scheme: the fake client takes it
		// as unstructured once one is written.
		for _, o := range unstr {
			if err := c.Create(context.Background(), o.DeepCopyObject().(client.Object)); err != nil {
				t.Fatal(err)
			}
		}
		return c
	}
	cache := build(cached)
	api := cache
	if live != nil {
		api = build(live)
	}
	// The API server gives each object a UID; the fake client does not.
	uids := 0
	create := funcs.Create
	funcs.Create = func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.CreateOption) error {
		if o.GetUID() == "" {
			uids++
			o.SetUID(types.UID(fmt.Sprintf("uid-%d", uids)))
		}
		if create != nil {
			return create(ctx, c, o, opts...)
		}
		return c.Create(ctx, o, opts...)
	}
	writes := func(c client.WithWatch) client.WithWatch {
		f := funcs
		f.Get, f.List = nil, nil
		return interceptor.NewClient(c, f)
	}
	reads := interceptor.Funcs{Get: funcs.Get, List: funcs.List}
	// Client: reads from the cache, writes to the API.
	client := interceptor.NewClient(cache, interceptor.Funcs{
		Get:  reads.Get,
		List: reads.List,
		Create: func(ctx context.Context, _ client.WithWatch, o client.Object, opts ...client.CreateOption) error {
			return writes(api).Create(ctx, o, opts...)
		},
		Delete: func(ctx context.Context, _ client.WithWatch, o client.Object, opts ...client.DeleteOption) error {
			return writes(api).Delete(ctx, o, opts...)
		},
		Patch: func(ctx context.Context, _ client.WithWatch, o client.Object, p client.Patch, opts ...client.PatchOption) error {
			return writes(api).Patch(ctx, o, p, opts...)
		},
	})
	rec := events.NewFakeRecorder(100)
	return &env{t: t, cache: cache, api: api, rec: rec,
		r: &Reconciler{Client: client, APIReader: api, Recorder: rec, StashNamespace: stashNS}}
}

func (e *env) reconcile() (reconcile.Result, error) {
	return e.r.Reconcile(context.Background(), reconcile.Request{NamespacedName: key})
}

// claim is the PVC in the API, nil if none.
func (e *env) claim() *corev1.PersistentVolumeClaim {
	e.t.Helper()
	pvc := &corev1.PersistentVolumeClaim{}
	if err := e.api.Get(context.Background(), key, pvc); apierrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		e.t.Fatal(err)
	}
	return pvc
}

// stash is podvol's stash of the claim in the API, nil if none.
func (e *env) stash() *corev1.ConfigMap {
	e.t.Helper()
	cm := &corev1.ConfigMap{}
	if err := e.api.Get(context.Background(), types.NamespacedName{Namespace: stashNS, Name: stashName(key)}, cm); apierrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		e.t.Fatal(err)
	}
	return cm
}

// events since the last call, as "Type Reason Action-less note".
func (e *env) events() []string {
	var out []string
	for {
		select {
		case ev := <-e.rec.Events:
			out = append(out, ev)
		default:
			return out
		}
	}
}

func reasons(evs []string) string {
	var out []string
	for _, ev := range evs {
		f := strings.Fields(ev)
		out = append(out, f[0]+" "+f[1])
	}
	return strings.Join(out, ",")
}

func TestReconcile(t *testing.T) {
	ours := clone(true)
	deleting := clone(true)
	deleting.DeletionTimestamp = ptr.To(metav1.Now())
	deleting.Finalizers = []string{"kubernetes.io/pvc-protection"}
	notOurs := clone(true)
	delete(notOurs.Annotations, names.Lifecycle)
	noSource := clone(true)
	noSource.Spec.DataSource = nil
	crossNS := clone(true)
	crossNS.Spec.DataSource = nil
	crossNS.Spec.DataSourceRef = &corev1.TypedObjectReference{Kind: "PersistentVolumeClaim", Name: "golden", Namespace: ptr.To("templates")}
	successor := clone(false)
	successor.UID = "uid-work-2"
	corrupt := stashOf(ours, key.String(), 1)
	corrupt.Data[stashKey] = "{"
	tenantStash := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: tenantStashName("work")},
		Data: map[string]string{stashKey: `{"metadata":{"name":"work"},"spec":{"volumeName":"someone-elses-pv"}}`}}
	gr := schema.GroupResource{Resource: "persistentvolumeclaims"}

	type want struct {
		claim   string // "", "old" (the PVC as it was, but for Used), "new" (created again), "gone"
		used    bool   // the claim's Used annotation
		stash   bool
		events  string // reasons, in order
		requeue time.Duration
		err     string // a substring of the error; "" none
	}
	for _, tc := range []struct {
		name         string
		cached, live []client.Object
		funcs        interceptor.Funcs
		want         want
	}{
		{name: "a PVC without the lifecycle is not podvol's", cached: []client.Object{notOurs, pod("p", corev1.PodSucceeded, "work")},
			want: want{claim: "old", used: true}},
		{name: "no data source to clone from", cached: []client.Object{noSource},
			want: want{claim: "old", used: true, events: "Warning NoDataSource"}},
		{name: "a pod uses it: marked used", cached: []client.Object{clone(false), pod("p", corev1.PodRunning, "work")},
			want: want{claim: "old", used: true}},
		{name: "a pending pod uses it too", cached: []client.Object{clone(false), pod("p", corev1.PodPending, "work")},
			want: want{claim: "old", used: true}},
		{name: "used and in use", cached: []client.Object{ours, pod("p", corev1.PodRunning, "work")},
			want: want{claim: "old", used: true}},
		{name: "never used: a fresh clone already", cached: []client.Object{clone(false), pod("p", corev1.PodSucceeded, "work")},
			want: want{claim: "old"}},
		{name: "used, and its pod finished: reset", cached: []client.Object{ours, pod("p", corev1.PodSucceeded, "work"), pod("q", corev1.PodRunning, "other")},
			want: want{claim: "gone", stash: true, events: "Normal ResetOnDetach"}},
		{name: "used, and no pod left: reset", cached: []client.Object{ours},
			want: want{claim: "gone", stash: true, events: "Normal ResetOnDetach"}},
		{name: "a pod the cache has not seen yet uses it: kept", cached: []client.Object{ours}, live: []client.Object{ours, pod("p", corev1.PodPending, "work")},
			want: want{claim: "old", used: true}},
		{name: "being deleted: left to its deletion", cached: []client.Object{deleting},
			want: want{claim: "old", used: true}},
		{name: "a source in another namespace without a ReferenceGrant", cached: []client.Object{crossNS},
			want: want{claim: "old", used: true, events: "Warning ReferenceGrantMissing"}},
		{name: "a source in another namespace with a ReferenceGrant", cached: []client.Object{crossNS, grant("templates")},
			want: want{claim: "gone", stash: true, events: "Normal ResetOnDetach"}},
		{name: "a ReferenceGrant in the wrong namespace", cached: []client.Object{crossNS, grant(ns)},
			want: want{claim: "old", used: true, events: "Warning ReferenceGrantMissing"}},

		// Finishing a reset: the PVC is gone and its stash is there.
		{name: "gone: created again from the stash", cached: []client.Object{stashOf(ours, key.String(), 1)},
			want: want{claim: "new", events: "Normal ResetOnDetach"}},
		{name: "gone, and the stash is another claim's: nothing created", cached: []client.Object{stashOf(ours, "ns/other", 1)},
			want: want{claim: "gone", stash: true}},
		{name: "gone, and the stash is corrupt", cached: []client.Object{corrupt},
			want: want{claim: "gone", stash: true, err: "corrupt"}},
		{name: "gone with its namespace: the reset is dropped", cached: []client.Object{stashOf(ours, key.String(), 1)},
			funcs: interceptor.Funcs{Create: func(context.Context, client.WithWatch, client.Object, ...client.CreateOption) error {
				return apierrors.NewNotFound(schema.GroupResource{Resource: "namespaces"}, ns)
			}},
			want: want{claim: "gone"}},
		{name: "gone with its namespace terminating: the reset is dropped", cached: []client.Object{stashOf(ours, key.String(), 1)},
			funcs: interceptor.Funcs{Create: func(context.Context, client.WithWatch, client.Object, ...client.CreateOption) error {
				return &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: 403, Reason: metav1.StatusReasonForbidden,
					Message: "unable to create new content in namespace ns because it is being terminated",
					Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{Type: corev1.NamespaceTerminatingCause}}}}}
			}},
			want: want{claim: "gone"}},
		{name: "gone, and the create fails: retried with the stash kept", cached: []client.Object{stashOf(ours, key.String(), 1)},
			funcs: interceptor.Funcs{Create: func(context.Context, client.WithWatch, client.Object, ...client.CreateOption) error { return errAPI }},
			want:  want{claim: "gone", stash: true, err: errAPI.Error()}},
		{name: "gone, and created meanwhile by someone else", cached: []client.Object{stashOf(ours, key.String(), 1)},
			funcs: interceptor.Funcs{Create: func(context.Context, client.WithWatch, client.Object, ...client.CreateOption) error {
				return apierrors.NewAlreadyExists(gr, "work")
			}},
			want: want{claim: "gone"}},
		{name: "stashed, not deleted (a restart between), and in use again: the stash goes", cached: []client.Object{ours, stashOf(ours, key.String(), 1), pod("p", corev1.PodRunning, "work")},
			want: want{claim: "old", used: true}},
		{name: "stashed, not deleted, and unused: reset again", cached: []client.Object{ours, stashOf(ours, key.String(), 1)},
			want: want{claim: "gone", stash: true, events: "Normal ResetOnDetach"}},
		{name: "stashed, and the old PVC is still being deleted", cached: []client.Object{deleting, stashOf(ours, key.String(), 1)},
			want: want{claim: "old", used: true, stash: true, requeue: 2 * time.Second}},
		// Its delete event comes next.
		{name: "stashed, and the cache has not seen the delete", cached: []client.Object{ours, stashOf(ours, key.String(), 1)}, live: []client.Object{stashOf(ours, key.String(), 1)},
			want: want{claim: "gone", stash: true}},
		{name: "the new PVC is there: the stash has served", cached: []client.Object{successor, stashOf(ours, key.String(), 1)},
			want: want{claim: "old"}},
		{name: "a stash of another claim by that name: no reset", cached: []client.Object{ours, stashOf(ours, "ns/other", 1)},
			want: want{claim: "old", used: true, stash: true, err: "not this PVC"}},
		{name: "a tenant's stash in the claim's namespace is ignored", cached: []client.Object{tenantStash},
			want: want{claim: "gone", events: "Warning ResetStashIgnored"}},
		{name: "a tenant's stash: the pods that name the claim hear", cached: []client.Object{tenantStash, pod("p", corev1.PodPending, "work"), pod("q", corev1.PodPending, "work")},
			want: want{claim: "gone", events: "Warning ResetStashIgnored,Warning ResetStashIgnored"}},
		{name: "a claim that is gone, no stash", want: want{claim: "gone"}},

		// The API's errors.
		{name: "the claim cannot be read", cached: []client.Object{ours},
			funcs: interceptor.Funcs{Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
				return errAPI
			}},
			want: want{claim: "old", used: true, err: errAPI.Error()}},
		{name: "the pods cannot be listed", cached: []client.Object{ours},
			funcs: interceptor.Funcs{List: func(context.Context, client.WithWatch, client.ObjectList, ...client.ListOption) error { return errAPI }},
			want:  want{claim: "old", used: true, err: errAPI.Error()}},
		{name: "the stash cannot be written: nothing deleted", cached: []client.Object{ours},
			funcs: interceptor.Funcs{Create: func(context.Context, client.WithWatch, client.Object, ...client.CreateOption) error { return errAPI }},
			want:  want{claim: "old", used: true, err: "stash PVC ns/work before its reset"}},
		{name: "the delete meets a newer PVC of that name", cached: []client.Object{ours},
			funcs: interceptor.Funcs{Delete: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.DeleteOption) error {
				if _, ok := o.(*corev1.PersistentVolumeClaim); ok {
					return apierrors.NewConflict(gr, "work", errors.New("UID precondition failed"))
				}
				return c.Delete(ctx, o, opts...)
			}},
			want: want{claim: "old", used: true, stash: true, events: "Normal ResetOnDetach"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.funcs, tc.cached, tc.live)
			res, err := e.reconcile()
			switch {
			case tc.want.err == "" && err != nil:
				t.Fatalf("Reconcile: %v", err)
			case tc.want.err != "" && (err == nil || !strings.Contains(err.Error(), tc.want.err)):
				t.Fatalf("Reconcile: error %v, want one with %q", err, tc.want.err)
			}
			if res.RequeueAfter != tc.want.requeue {
				t.Errorf("Reconcile: requeue after %s, want %s", res.RequeueAfter, tc.want.requeue)
			}
			if got := reasons(e.events()); got != tc.want.events {
				t.Errorf("events %q, want %q", got, tc.want.events)
			}
			pvc := e.claim()
			switch tc.want.claim {
			case "gone":
				if pvc != nil {
					t.Errorf("PVC %s (UID %s) there, want it gone", key, pvc.UID)
				}
			case "old":
				if pvc == nil || pvc.Spec.VolumeName != "pv-work" && pvc.UID != "uid-work-2" {
					t.Fatalf("PVC %+v, want the one there before", pvc)
				}
			case "new":
				checkCreatedAgain(t, pvc, 1)
			}
			if pvc != nil && (pvc.Annotations[names.Used] == "true") != tc.want.used {
				t.Errorf("%s=%q, want used %v", names.Used, pvc.Annotations[names.Used], tc.want.used)
			}
			if got := e.stash(); (got != nil) != tc.want.stash {
				t.Errorf("stash %v, want one: %v", got != nil, tc.want.stash)
			} else if got != nil && got.Annotations[names.StashClaim] == key.String() && got.Annotations[names.StashOldUID] == "" {
				t.Errorf("stash %v names no old UID", got.Annotations)
			}
			// A tenant's ConfigMap is never acted on, never deleted.
			for _, o := range tc.cached {
				if cm, ok := o.(*corev1.ConfigMap); ok && cm.Namespace == ns {
					if err := e.api.Get(context.Background(), client.ObjectKeyFromObject(cm), &corev1.ConfigMap{}); err != nil {
						t.Errorf("the tenant's ConfigMap %s: %v", cm.Name, err)
					}
				}
			}
		})
	}
}

// checkCreatedAgain checks a PVC created again by a reset: what to
// provision, not what bound the old one.
func checkCreatedAgain(t *testing.T, pvc *corev1.PersistentVolumeClaim, count int) {
	t.Helper()
	if pvc == nil {
		t.Fatal("no PVC created again")
	}
	old := clone(true)
	switch {
	case pvc.UID == old.UID:
		t.Errorf("PVC %s is the old one", pvc.Name)
	case pvc.Spec.VolumeName != "":
		t.Errorf("created bound to %s", pvc.Spec.VolumeName)
	case pvc.Annotations[names.Used] != "" || pvc.Annotations["pv.kubernetes.io/bind-completed"] != "":
		t.Errorf("created with the old one's binding: %v", pvc.Annotations)
	case pvc.Annotations[names.Lifecycle] != names.ResetOnDetach || pvc.Annotations["team"] != "a" || pvc.Labels["app"] != "ci":
		t.Errorf("created without the old one's own annotations and labels: %v %v", pvc.Annotations, pvc.Labels)
	case pvc.Annotations[names.ResetCount] != string(rune('0'+count)):
		t.Errorf("%s=%q, want %d", names.ResetCount, pvc.Annotations[names.ResetCount], count)
	case pvc.Spec.DataSource == nil || pvc.Spec.DataSource.Name != "golden" || !pvc.Spec.Resources.Requests.Storage().Equal(resource.MustParse("1Gi")):
		t.Errorf("created with spec %+v", pvc.Spec)
	}
}

// A whole cycle, pass by pass, as the watches would drive it: used, reset,
// created again, used again, reset again; every pass run twice, the second
// changing nothing.
func TestResetCycle(t *testing.T) {
	e := newEnv(t, interceptor.Funcs{}, []client.Object{clone(false), pod("p", corev1.PodRunning, "work")}, nil)
	ctx := context.Background()
	pass := func(step string) {
		t.Helper()
		for i := range 2 {
			if res, err := e.reconcile(); err != nil || !res.IsZero() {
				t.Fatalf("%s, pass %d: %+v, %v", step, i+1, res, err)
			}
		}
	}
	setPhase := func(name string, phase corev1.PodPhase) {
		t.Helper()
		p := &corev1.Pod{}
		if err := e.api.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, p); err != nil {
			t.Fatal(err)
		}
		p.Status.Phase = phase
		if err := e.api.Status().Update(ctx, p); err != nil {
			t.Fatal(err)
		}
	}

	pass("a pod uses it")
	if pvc := e.claim(); pvc.Annotations[names.Used] != "true" {
		t.Fatalf("not marked used: %v", pvc.Annotations)
	}
	setPhase("p", corev1.PodSucceeded)
	if _, err := e.reconcile(); err != nil {
		t.Fatal(err)
	}
	if e.claim() != nil || e.stash() == nil {
		t.Fatalf("after the pod finished: PVC %v, stash %v; want the PVC gone, stashed", e.claim() != nil, e.stash() != nil)
	}
	pass("created again")
	checkCreatedAgain(t, e.claim(), 1)
	if e.stash() != nil {
		t.Fatal("the stash outlived the PVC created again")
	}
	if got := reasons(e.events()); got != "Normal ResetOnDetach,Normal ResetOnDetach" {
		t.Errorf("events %q, want the reset's two steps", got)
	}

	// The PVC created again is bound by the provisioner, then used.
	pvc := e.claim()
	pvc.Spec.VolumeName = "pv-work-2"
	if err := e.api.Update(ctx, pvc); err != nil {
		t.Fatal(err)
	}
	pass("not used yet")
	if e.claim().Annotations[names.Used] != "" {
		t.Fatal("marked used before a pod used it")
	}
	if err := e.api.Create(ctx, pod("p2", corev1.PodRunning, "work")); err != nil {
		t.Fatal(err)
	}
	pass("used again")
	setPhase("p2", corev1.PodFailed)
	if _, err := e.reconcile(); err != nil {
		t.Fatal(err)
	}
	if e.claim() != nil || e.stash() == nil {
		t.Fatalf("after the second pod finished: PVC %v, stash %v; want the PVC gone, stashed", e.claim() != nil, e.stash() != nil)
	}
	pass("created again, a second time")
	if e.claim() == nil {
		t.Fatalf("not created again: events %q", e.events())
	}
	if got := e.claim().Annotations[names.ResetCount]; got != "2" {
		t.Errorf("%s=%q after two resets", names.ResetCount, got)
	}
}
