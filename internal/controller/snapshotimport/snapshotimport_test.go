package snapshotimport

import (
	"context"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/podvol/podvol/internal/names"
	"github.com/podvol/podvol/internal/snaphandle"
)

// Reconcile's branches against a fake client; test/controller runs it
// against a real API server with the snapshot CRDs.

// newContent is a pre-provisioned VolumeSnapshotContent: an admin's import.
func newContent(name, driver, handle string, labels map[string]string) *unstructured.Unstructured {
	u := content()
	u.SetName(name)
	u.SetLabels(labels)
	spec := map[string]any{"driver": driver, "deletionPolicy": "Retain",
		"volumeSnapshotRef": map[string]any{"namespace": "ns", "name": "imported"}}
	if handle != "" {
		spec["source"] = map[string]any{"snapshotHandle": handle}
	}
	u.Object["spec"] = spec
	return u
}

// member is a content snapshot-controller makes for a member of a
// VolumeGroupSnapshot: a volume as source, the group's handle in an
// annotation, no label.
func member(name, driver, groupHandle string) *unstructured.Unstructured {
	u := newContent(name, driver, "", nil)
	u.Object["spec"].(map[string]any)["source"] = map[string]any{"volumeHandle": "pv-1"}
	u.SetAnnotations(map[string]string{GroupHandleAnnotation: groupHandle})
	return u
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
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}
	onA := snaphandle.Format("snap-1", "node-a")
	long := strings.Repeat("n", 64) // a valid node name, not a valid label value
	for _, tc := range []struct {
		name    string
		content *unstructured.Unstructured // nil: none
		deleted bool                       // being deleted (a finalizer holds it)
		nodes   []client.Object
		funcs   interceptor.Funcs
		label   string // the ManagedBy label after
		event   string // the one event's reason; "" none
		wantErr error
	}{
		{name: "routed to its node", content: newContent("c", names.Driver, onA, nil), nodes: []client.Object{node}, label: "node-a", event: ReasonRouted},
		{name: "other labels are kept", content: newContent("c", names.Driver, onA, map[string]string{"team": "a"}), nodes: []client.Object{node}, label: "node-a", event: ReasonRouted},
		{name: "routed even while its node is away", content: newContent("c", names.Driver, onA, nil), label: "node-a", event: ReasonNodeMissing},
		{name: "a handle that names no node", content: newContent("c", names.Driver, "snap-1", nil), nodes: []client.Object{node}, event: ReasonNoNode},
		{name: "a node name that cannot be a label value", content: newContent("c", names.Driver, "snap-1"+snaphandle.Separator+long, nil), event: ReasonNoNode},
		{name: "another driver's content is left alone", content: newContent("c", "ebs.csi.example", onA, nil), nodes: []client.Object{node}},
		{name: "a content snapshot-controller made (labelled) is left alone", content: newContent("c", names.Driver, onA, map[string]string{ManagedBy: "node-b"}),
			nodes: []client.Object{node}, label: "node-b"},
		{name: "a content without a handle (dynamic, not cut yet) is left alone", content: newContent("c", names.Driver, "", nil), nodes: []client.Object{node}},
		{name: "a group snapshot's member is routed by its group's handle", content: member("c", names.Driver, snaphandle.Format("group-1", "node-a")),
			nodes: []client.Object{node}, label: "node-a", event: ReasonRouted},
		{name: "another driver's group member is left alone", content: member("c", "ebs.csi.example", snaphandle.Format("group-1", "node-a")), nodes: []client.Object{node}},
		{name: "a content being deleted is left alone", content: newContent("c", names.Driver, onA, nil), deleted: true, nodes: []client.Object{node}},
		{name: "a content gone", nodes: []client.Object{node}},
		{name: "the label cannot be written", content: newContent("c", names.Driver, onA, nil), nodes: []client.Object{node}, wantErr: errAPI,
			funcs: interceptor.Funcs{Patch: func(context.Context, client.WithWatch, client.Object, client.Patch, ...client.PatchOption) error {
				return errAPI
			}}},
		{name: "the node cannot be read", content: newContent("c", names.Driver, onA, nil), label: "node-a", wantErr: errAPI,
			funcs: interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, o client.Object, opts ...client.GetOption) error {
				if _, ok := o.(*corev1.Node); ok {
					return errAPI
				}
				return c.Get(ctx, key, o, opts...)
			}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			base := fake.NewClientBuilder().WithObjects(tc.nodes...).Build()
			if tc.content != nil {
				if tc.deleted {
					tc.content.SetFinalizers([]string{"snapshot.storage.kubernetes.io/volumesnapshotcontent-bound-protection"})
				}
				if err := base.Create(ctx, tc.content); err != nil {
					t.Fatal(err)
				}
				if tc.deleted {
					if err := base.Delete(ctx, tc.content); err != nil {
						t.Fatal(err)
					}
				}
			}
			rec := events.NewFakeRecorder(10)
			r := &Reconciler{Client: interceptor.NewClient(base, tc.funcs), Recorder: rec, Driver: names.Driver}
			req := reconcile.Request{NamespacedName: types.NamespacedName{Name: "c"}}
			res, err := r.Reconcile(ctx, req)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Reconcile: error %v, want %v", err, tc.wantErr)
			}
			if !res.IsZero() {
				t.Errorf("Reconcile: %+v, want no requeue (a content's update wakes it)", res)
			}
			evs := drain(rec)
			switch {
			case tc.event == "" && len(evs) > 0:
				t.Errorf("events %q, want none", evs)
			case tc.event != "" && (len(evs) != 1 || strings.Fields(evs[0])[1] != tc.event):
				t.Errorf("events %q, want one %s", evs, tc.event)
			}
			if tc.content == nil {
				return
			}
			got := content()
			if err := base.Get(ctx, req.NamespacedName, got); err != nil {
				t.Fatal(err)
			}
			if l := got.GetLabels()[ManagedBy]; l != tc.label {
				t.Errorf("label %s=%q, want %q", ManagedBy, l, tc.label)
			}
			for k, v := range tc.content.GetLabels() {
				if k != ManagedBy && got.GetLabels()[k] != v {
					t.Errorf("label %s=%q lost: %v", k, v, got.GetLabels())
				}
			}
			if tc.wantErr != nil {
				return
			}
			// Idempotent: a second pass changes nothing and says nothing
			// (a routed content is no longer one to route; a handle that
			// names no node is warned of on each event, which its
			// unchanged content does not fire).
			rv := got.GetResourceVersion()
			if _, err := r.Reconcile(ctx, req); err != nil {
				t.Fatalf("second Reconcile: %v", err)
			}
			if err := base.Get(ctx, req.NamespacedName, got); err != nil {
				t.Fatal(err)
			}
			if got.GetResourceVersion() != rv {
				t.Errorf("second Reconcile wrote the content: %v", got.GetLabels())
			}
			if evs := drain(rec); tc.label != "" && len(evs) > 0 {
				t.Errorf("second Reconcile of a routed content: events %q", evs)
			}
		})
	}
}
