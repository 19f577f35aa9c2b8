package grouprouting

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

	"github.com/podvol/podvol/internal/controller/snapshotimport"
	"github.com/podvol/podvol/internal/names"
	"github.com/podvol/podvol/internal/snaphandle"
)

// Reconcile's branches against a fake client; test/controller runs it
// against a real API server with the group snapshot CRDs.

// dynamic is a content snapshot-controller makes for a VolumeGroupSnapshot.
func dynamic(driver string, handles ...string) *unstructured.Unstructured {
	u := content()
	u.SetName("c")
	hs := make([]any, len(handles))
	for i, h := range handles {
		hs[i] = h
	}
	u.Object["spec"] = map[string]any{"driver": driver, "deletionPolicy": "Delete",
		"source":                 map[string]any{"volumeHandles": hs},
		"volumeGroupSnapshotRef": map[string]any{"namespace": "ns", "name": "db", "uid": "u-1"}}
	return u
}

// imported is a content an admin makes from an existing group's handle.
func imported(handle string) *unstructured.Unstructured {
	u := content()
	u.SetName("c")
	u.Object["spec"] = map[string]any{"driver": names.Driver, "deletionPolicy": "Retain",
		"source": map[string]any{"groupSnapshotHandles": map[string]any{
			"volumeGroupSnapshotHandle": handle, "volumeSnapshotHandles": []any{"snap-1@node-a"}}},
		"volumeGroupSnapshotRef": map[string]any{"namespace": "ns", "name": "db"}}
	return u
}

func pv(name, handle, node string) *corev1.PersistentVolume {
	p := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PersistentVolumeSpec{
		PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: names.Driver, VolumeHandle: handle}},
		ClaimRef:               &corev1.ObjectReference{Namespace: "ns", Name: "claim-" + name},
	}}
	if node != "" {
		p.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: names.TopologyKey, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}}
	}
	return p
}

var errAPI = errors.New("the API server is unreachable")

func TestReconcile(t *testing.T) {
	a1, a2, b1 := pv("a1", "pv-a1", "node-a"), pv("a2", "pv-a2", "node-a"), pv("b1", "pv-b1", "node-b")
	for _, tc := range []struct {
		name    string
		content *unstructured.Unstructured
		labels  map[string]string
		pvs     []client.Object
		funcs   interceptor.Funcs
		label   string   // the ManagedBy label after
		events  []string // reasons, in order
		text    string   // in every event
		wantErr error
	}{
		{name: "members of one node: routed there", content: dynamic(names.Driver, "pv-a1", "pv-a2"), pvs: []client.Object{a1, a2, b1},
			label: "node-a", events: []string{ReasonRouted}},
		{name: "members of two nodes: not routed, the user told", content: dynamic(names.Driver, "pv-a1", "pv-b1"), pvs: []client.Object{a1, b1},
			events: []string{ReasonSpansNodes, ReasonSpansNodes}, text: "node-a (ns/claim-a1); node-b (ns/claim-b1)"},
		{name: "a member whose PV is not seen yet: waits", content: dynamic(names.Driver, "pv-a1", "pv-x"), pvs: []client.Object{a1},
			events: []string{ReasonWaiting, ReasonWaiting}, text: "pv-x"},
		{name: "a member whose PV names no node", content: dynamic(names.Driver, "pv-a1", "pv-n"), pvs: []client.Object{a1, pv("n", "pv-n", "")},
			events: []string{ReasonNoNode, ReasonNoNode}},
		{name: "an imported group: routed by its handle", content: imported(snaphandle.Format("group-1", "node-a")), label: "node-a", events: []string{ReasonRouted}},
		{name: "an imported group whose handle names no node", content: imported("group-1"), events: []string{ReasonNoNode, ReasonNoNode}, text: "label this content"},
		{name: "another driver's content is left alone", content: dynamic("ebs.csi.example", "pv-a1"), pvs: []client.Object{a1}},
		{name: "a routed content is left alone", content: dynamic(names.Driver, "pv-a1"), labels: map[string]string{snapshotimport.ManagedBy: "node-z"},
			pvs: []client.Object{a1}, label: "node-z"},
		{name: "a content gone"},
		{name: "the PVs cannot be listed", content: dynamic(names.Driver, "pv-a1"), pvs: []client.Object{a1}, wantErr: errAPI,
			funcs: interceptor.Funcs{List: func(ctx context.Context, c client.WithWatch, l client.ObjectList, opts ...client.ListOption) error {
				if _, ok := l.(*corev1.PersistentVolumeList); ok {
					return errAPI
				}
				return c.List(ctx, l, opts...)
			}}},
		{name: "the label cannot be written", content: dynamic(names.Driver, "pv-a1"), pvs: []client.Object{a1}, wantErr: errAPI,
			funcs: interceptor.Funcs{Patch: func(context.Context, client.WithWatch, client.Object, client.Patch, ...client.PatchOption) error {
				return errAPI
			}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			base := fake.NewClientBuilder().WithObjects(tc.pvs...).Build()
			if tc.content != nil {
				tc.content.SetLabels(tc.labels)
				if err := base.Create(ctx, tc.content); err != nil {
					t.Fatal(err)
				}
			}
			rec := events.NewFakeRecorder(10)
			r := &Reconciler{Client: interceptor.NewClient(base, tc.funcs), Recorder: rec, Driver: names.Driver}
			req := reconcile.Request{NamespacedName: types.NamespacedName{Name: "c"}}
			if _, err := r.Reconcile(ctx, req); !errors.Is(err, tc.wantErr) {
				t.Fatalf("Reconcile: error %v, want %v", err, tc.wantErr)
			}
			evs := drain(rec)
			if len(evs) != len(tc.events) {
				t.Fatalf("events %q, want reasons %v", evs, tc.events)
			}
			for i, e := range evs {
				if strings.Fields(e)[1] != tc.events[i] || !strings.Contains(e, tc.text) {
					t.Errorf("event %q, want reason %s with %q", e, tc.events[i], tc.text)
				}
			}
			if tc.content == nil {
				return
			}
			got := content()
			if err := base.Get(ctx, req.NamespacedName, got); err != nil {
				t.Fatal(err)
			}
			if l := got.GetLabels()[snapshotimport.ManagedBy]; l != tc.label {
				t.Errorf("label %s=%q, want %q", snapshotimport.ManagedBy, l, tc.label)
			}
			if tc.label == "" || tc.wantErr != nil {
				return
			}
			// Idempotent: a routed content is not one to route.
			rv := got.GetResourceVersion()
			if _, err := r.Reconcile(ctx, req); err != nil {
				t.Fatalf("second Reconcile: %v", err)
			}
			if err := base.Get(ctx, req.NamespacedName, got); err != nil {
				t.Fatal(err)
			}
			if got.GetResourceVersion() != rv || len(drain(rec)) > 0 {
				t.Errorf("second Reconcile wrote the content or said something")
			}
		})
	}
}

// A PV that appears wakes the unrouted contents that name it, and only
// those.
func TestContentsOf(t *testing.T) {
	ctx := context.Background()
	waiting := dynamic(names.Driver, "pv-a1", "pv-x")
	other := dynamic(names.Driver, "pv-y")
	other.SetName("other")
	routed := dynamic(names.Driver, "pv-x")
	routed.SetName("routed")
	routed.SetLabels(map[string]string{snapshotimport.ManagedBy: "node-a"})
	c := fake.NewClientBuilder().WithObjects(waiting, other, routed).Build()
	r := &Reconciler{Client: c, Driver: names.Driver}
	got := r.contentsOf(ctx, pv("x", "pv-x", "node-a"))
	if len(got) != 1 || got[0].Name != "c" {
		t.Errorf("contentsOf(pv-x) = %v, want [c]", got)
	}
	foreign := pv("x", "pv-x", "node-a")
	foreign.Spec.CSI.Driver = "ebs.csi.example"
	if got := r.contentsOf(ctx, foreign); len(got) != 0 {
		t.Errorf("contentsOf(another driver's PV) = %v, want none", got)
	}
}

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
