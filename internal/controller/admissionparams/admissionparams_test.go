package admissionparams

import (
	"context"
	"errors"
	"maps"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/podvol/podvol/internal/names"
)

// Reconcile's branches against a fake client; test/controller runs it
// against a real API server (the ConfigMap read past the cache, the
// policies that read it).

const (
	ns = "podvol-system"
	cm = "podvol-admission-params"
)

func class(name, provisioner string, params map[string]string, isDefault bool) *storagev1.StorageClass {
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: provisioner, Parameters: params}
	if isDefault {
		sc.Annotations = map[string]string{defaultClassAnnotation: "true"}
	}
	return sc
}

// wffc gives a class WaitForFirstConsumer binding.
func wffc(sc *storagev1.StorageClass) *storagev1.StorageClass {
	m := storagev1.VolumeBindingWaitForFirstConsumer
	sc.VolumeBindingMode = &m
	return sc
}

var errAPI = errors.New("the API server is unreachable")

func TestReconcile(t *testing.T) {
	gr := schema.GroupResource{Resource: "configmaps"}
	classes := []client.Object{
		wffc(class("fast", names.Driver, nil, false)),
		wffc(class("vm", names.Driver, map[string]string{names.ParamDirectAssign: "always"}, false)),
		class("vm-auto", names.Driver, map[string]string{names.ParamDirectAssign: "auto"}, false),
		class("no-vm", names.Driver, map[string]string{names.ParamDirectAssign: "never"}, false),
		// Another driver's, the cluster default: not podvol's to list.
		class("other", "ebs.csi.example", map[string]string{names.ParamDirectAssign: "always"}, true),
	}
	// Restores of the WaitForFirstConsumer ones are placed.
	facts := map[string]string{Classes: "fast no-vm vm vm-auto", DirectClasses: "vm vm-auto", DefaultIsPodvol: "false", PlacedClasses: "fast vm"}
	withAdmin := func(m map[string]string) map[string]string {
		m = maps.Clone(m)
		m["inlineMaxSize"] = "1Gi"
		return m
	}
	for _, tc := range []struct {
		name     string
		classes  []client.Object
		existing map[string]string // the ConfigMap's data; nil: no ConfigMap
		noData   bool              // the ConfigMap exists with no data at all
		funcs    interceptor.Funcs
		want     map[string]string // nil: no ConfigMap
		wantErr  error
		writes   int  // creates and patches
		injected bool // funcs inject a fault that a second pass meets again
	}{
		{name: "created when missing", classes: classes, want: facts, writes: 1},
		{name: "no podvol class: empty lists", classes: classes[4:], want: map[string]string{Classes: "", DirectClasses: "", DefaultIsPodvol: "false", PlacedClasses: ""}, writes: 1},
		{name: "a podvol class is the default", classes: append([]client.Object{class("def", names.Driver, nil, true)}, classes[4:]...),
			want: map[string]string{Classes: "def", DirectClasses: "", DefaultIsPodvol: "true", PlacedClasses: ""}, writes: 1},
		{name: "up to date: not written", classes: classes, existing: withAdmin(facts), want: withAdmin(facts)},
		{name: "an admin's edit of our keys is undone, the admin's own key kept", classes: classes,
			existing: withAdmin(map[string]string{Classes: "fast", DirectClasses: "", DefaultIsPodvol: "true"}), want: withAdmin(facts), writes: 1},
		{name: "a ConfigMap without data gets it", classes: classes, noData: true, want: facts, writes: 1},
		{name: "created meanwhile by another replica", classes: classes, writes: 1, injected: true, funcs: interceptor.Funcs{
			Create: func(context.Context, client.WithWatch, client.Object, ...client.CreateOption) error {
				return apierrors.NewAlreadyExists(gr, cm)
			}}},
		{name: "the classes cannot be listed", classes: classes, existing: facts, want: facts, wantErr: errAPI, funcs: interceptor.Funcs{
			List: func(context.Context, client.WithWatch, client.ObjectList, ...client.ListOption) error { return errAPI }}},
		{name: "the ConfigMap cannot be read", classes: classes, existing: facts, want: facts, wantErr: errAPI, funcs: interceptor.Funcs{
			Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
				return errAPI
			}}},
		{name: "the ConfigMap cannot be created", classes: classes, wantErr: errAPI, funcs: interceptor.Funcs{
			Create: func(context.Context, client.WithWatch, client.Object, ...client.CreateOption) error { return errAPI }}},
		{name: "the ConfigMap cannot be patched", classes: classes, existing: map[string]string{}, want: map[string]string{}, wantErr: errAPI, funcs: interceptor.Funcs{
			Patch: func(context.Context, client.WithWatch, client.Object, client.Patch, ...client.PatchOption) error {
				return errAPI
			}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := append([]client.Object{}, tc.classes...)
			if tc.existing != nil || tc.noData {
				objs = append(objs, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: cm}, Data: maps.Clone(tc.existing)})
			}
			// Writes are counted past the injected errors: a write that
			// fails is still one tried.
			writes := 0
			funcs := tc.funcs
			create, patch := funcs.Create, funcs.Patch
			funcs.Create = func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.CreateOption) error {
				writes++
				if create != nil {
					return create(ctx, c, o, opts...)
				}
				return c.Create(ctx, o, opts...)
			}
			funcs.Patch = func(ctx context.Context, c client.WithWatch, o client.Object, p client.Patch, opts ...client.PatchOption) error {
				writes++
				if patch != nil {
					return patch(ctx, c, o, p, opts...)
				}
				return c.Patch(ctx, o, p, opts...)
			}
			base := fake.NewClientBuilder().WithObjects(objs...).Build()
			c := interceptor.NewClient(base, funcs)
			r := &Reconciler{Client: c, APIReader: c, Driver: names.Driver, Namespace: ns, Name: cm}
			req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: cm}}

			res, err := r.Reconcile(context.Background(), req)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Reconcile: error %v, want %v", err, tc.wantErr)
			}
			if err == nil && res.RequeueAfter != resync {
				t.Errorf("Reconcile: %+v, want a resync after %s (an admin's edit fires no event)", res, resync)
			}
			if tc.wantErr == nil && !tc.injected && writes > 0 {
				// Idempotent: a second pass over what the first wrote
				// writes nothing.
				before := writes
				if _, err := r.Reconcile(context.Background(), req); err != nil {
					t.Fatalf("second Reconcile: %v", err)
				}
				if writes != before {
					t.Errorf("second Reconcile wrote %d times, want none", writes-before)
				}
			}
			if writes < tc.writes || (tc.wantErr == nil && writes != tc.writes) {
				t.Errorf("%d writes, want %d", writes, tc.writes)
			}
			got := &corev1.ConfigMap{}
			err = base.Get(context.Background(), req.NamespacedName, got)
			switch {
			case tc.want == nil && apierrors.IsNotFound(err):
			case err != nil:
				t.Fatalf("read the ConfigMap: %v", err)
			case tc.want == nil:
				t.Errorf("ConfigMap %v written, want none", got.Data)
			case !maps.Equal(got.Data, tc.want) && !(len(got.Data) == 0 && len(tc.want) == 0):
				t.Errorf("ConfigMap data %v, want %v", got.Data, tc.want)
			}
		})
	}
}
