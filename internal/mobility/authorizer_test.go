package mobility

import (
	"context"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/podvol/podvol/internal/errkind"
	"github.com/podvol/podvol/internal/names"
	"github.com/podvol/podvol/internal/store"
	"github.com/podvol/podvol/internal/transfer"
)

// The authorizer's reading of the claim, its snapshot and the content
// (fake clients: the logic of which claim lets which node pull what).
func TestClaimAuthorizer(t *testing.T) {
	claim := func(mod func(*corev1.PersistentVolumeClaim)) *corev1.PersistentVolumeClaim {
		c := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "restored", UID: "u1", Annotations: map[string]string{
				names.SelectedNode: "node-b", storageProvisioner: names.Driver, names.Placement: names.PlacementScheduler}},
			Spec: corev1.PersistentVolumeClaimSpec{DataSourceRef: &corev1.TypedObjectReference{
				APIGroup: ptr.To("snapshot.storage.k8s.io"), Kind: "VolumeSnapshot", Name: "snap"}},
		}
		if mod != nil {
			mod(c)
		}
		return c
	}
	objsRef := func(handle, driver, refName string, ready bool) []runtime.Object {
		vs := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
			"metadata": map[string]any{"namespace": "team-a", "name": "snap", "uid": "vs-uid"},
			"status":   map[string]any{"boundVolumeSnapshotContentName": "content-1", "readyToUse": ready}}}
		vsc := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
			"metadata": map[string]any{"name": "content-1"},
			"spec": map[string]any{"driver": driver,
				"volumeSnapshotRef": map[string]any{"namespace": "team-a", "name": refName, "uid": "vs-uid"}},
			"status": map[string]any{"snapshotHandle": handle}}}
		return []runtime.Object{vs, vsc}
	}
	objs := func(handle, driver string) []runtime.Object { return objsRef(handle, driver, "snap", true) }
	req := transfer.Request{Caller: "node-b", Source: "snap-1", Claim: transfer.Claim{Namespace: "team-a", Name: "restored", UID: "u1"}}
	for _, c := range []struct {
		name    string
		pvc     *corev1.PersistentVolumeClaim
		objs    []runtime.Object
		req     transfer.Request
		kind    error
		message string
	}{
		{"allowed", claim(nil), objs("snap-1@node-a", names.Driver), req, nil, ""},
		{"no claim", nil, objs("snap-1@node-a", names.Driver), req, errkind.ErrNotFound, "does not exist"},
		{"another claim of that name", claim(func(c *corev1.PersistentVolumeClaim) { c.UID = "u2" }), objs("snap-1@node-a", names.Driver), req, errkind.ErrNotFound, "another claim"},
		{"bound", claim(func(c *corev1.PersistentVolumeClaim) { c.Spec.VolumeName = "pv-1" }), objs("snap-1@node-a", names.Driver), req, errkind.ErrDenied, "bound already"},
		{"for another node", claim(func(c *corev1.PersistentVolumeClaim) { c.Annotations[names.SelectedNode] = "node-c" }), objs("snap-1@node-a", names.Driver), req, errkind.ErrDenied, `on node "node-c", not on node node-b`},
		{"another provisioner", claim(func(c *corev1.PersistentVolumeClaim) { c.Annotations[storageProvisioner] = "other.csi" }), objs("snap-1@node-a", names.Driver), req, errkind.ErrDenied, "not provisioned by"},
		{"a clone", claim(func(c *corev1.PersistentVolumeClaim) {
			c.Spec.DataSourceRef = &corev1.TypedObjectReference{Kind: "PersistentVolumeClaim", Name: "data"}
		}), objs("snap-1@node-a", names.Driver), req, errkind.ErrDenied, "not a VolumeSnapshot"},
		{"another namespace's snapshot", claim(func(c *corev1.PersistentVolumeClaim) { c.Spec.DataSourceRef.Namespace = ptr.To("team-b") }), objs("snap-1@node-a", names.Driver), req, errkind.ErrDenied, "not a VolumeSnapshot of its namespace"},
		{"another snapshot asked", claim(nil), objs("snap-2@node-a", names.Driver), req, errkind.ErrDenied, "not snap-1"},
		{"another node's snapshot", claim(nil), objs("snap-1@node-c", names.Driver), req, errkind.ErrDenied, "not snap-1 of node node-a"},
		{"another driver's content", claim(nil), objs("snap-1@node-a", "other.csi"), req, errkind.ErrDenied, "driver other.csi"},
		{"no snapshot", claim(nil), nil, req, errkind.ErrNotFound, "VolumeSnapshot team-a/snap does not exist"},
		{"not left to the scheduler", claim(func(c *corev1.PersistentVolumeClaim) { delete(c.Annotations, names.Placement) }), objs("snap-1@node-a", names.Driver), req, errkind.ErrDenied, "not left to the scheduler"},
		{"snapshot not ready", claim(nil), objsRef("snap-1@node-a", names.Driver, "snap", false), req, errkind.ErrNotFound, "not bound to a ready content"},
		{"content of another snapshot", claim(nil), objsRef("snap-1@node-a", names.Driver, "other", true), req, errkind.ErrDenied, "does not name VolumeSnapshot team-a/snap back"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var core []runtime.Object
			if c.pvc != nil {
				core = append(core, c.pvc)
			}
			a := ClaimAuthorizer{Client: fake.NewClientset(core...), Dynamic: dynamicfake.NewSimpleDynamicClient(runtime.NewScheme(), c.objs...),
				Node: "node-a", Driver: names.Driver}
			err := a.Authorize(context.Background(), &c.req)
			if c.kind == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !errors.Is(err, c.kind) || !strings.Contains(err.Error(), c.message) {
				t.Fatalf("%v, want %v saying %q", err, c.kind, c.message)
			}
		})
	}
}

// A clone's pull: the claim clones a claim of its namespace whose PV is
// podvol's, on this node, with the handle asked for; the PV must name the
// source claim back.
func TestClaimAuthorizerClones(t *testing.T) {
	const vol = "pv-0123456789abcdef01234567"
	clone := func(mod func(*corev1.PersistentVolumeClaim)) *corev1.PersistentVolumeClaim {
		c := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "clone", UID: "u1", Annotations: map[string]string{
				names.SelectedNode: "node-b", storageProvisioner: names.Driver, names.Placement: names.PlacementScheduler}},
			Spec: corev1.PersistentVolumeClaimSpec{DataSource: &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "data"}},
		}
		if mod != nil {
			mod(c)
		}
		return c
	}
	source := func(ns, volumeName string) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "data", UID: "src-uid"},
			Spec: corev1.PersistentVolumeClaimSpec{VolumeName: volumeName}}
	}
	pv := func(handle, driver, node, claimNS string) *corev1.PersistentVolume {
		return &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-data"}, Spec: corev1.PersistentVolumeSpec{
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: handle}},
			ClaimRef:               &corev1.ObjectReference{Namespace: claimNS, Name: "data", UID: "src-uid"},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: names.TopologyKey, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}},
		}}
	}
	req := transfer.Request{Caller: "node-b", Source: vol, Claim: transfer.Claim{Namespace: "team-a", Name: "clone", UID: "u1"}}
	for _, c := range []struct {
		name    string
		objs    []runtime.Object
		kind    error
		message string
	}{
		{"allowed", []runtime.Object{clone(nil), source("team-a", "pv-data"), pv(vol, names.Driver, "node-a", "team-a")}, nil, ""},
		{"another volume", []runtime.Object{clone(nil), source("team-a", "pv-data"), pv("pv-0123456789abcdef0123456f", names.Driver, "node-a", "team-a")}, errkind.ErrDenied, "clones volume pv-0123456789abcdef0123456f"},
		{"another node's volume", []runtime.Object{clone(nil), source("team-a", "pv-data"), pv(vol, names.Driver, "node-c", "team-a")}, errkind.ErrDenied, `of node "node-c"`},
		{"another driver's volume", []runtime.Object{clone(nil), source("team-a", "pv-data"), pv(vol, "other.csi", "node-a", "team-a")}, errkind.ErrDenied, "not " + names.Driver + "'s"},
		{"a PV that does not name the source back", []runtime.Object{clone(nil), source("team-a", "pv-data"), pv(vol, names.Driver, "node-a", "team-b")}, errkind.ErrNotFound, "not bound to claim team-a/data"},
		{"source not bound", []runtime.Object{clone(nil), source("team-a", ""), pv(vol, names.Driver, "node-a", "team-a")}, errkind.ErrNotFound, "is not bound"},
		{"no source", []runtime.Object{clone(nil), pv(vol, names.Driver, "node-a", "team-a")}, errkind.ErrNotFound, "does not exist"},
		{"another namespace's claim", []runtime.Object{clone(func(c *corev1.PersistentVolumeClaim) {
			c.Spec.DataSourceRef = &corev1.TypedObjectReference{Kind: "PersistentVolumeClaim", Name: "data", Namespace: ptr.To("team-b")}
		}), source("team-b", "pv-data"), pv(vol, names.Driver, "node-a", "team-b")}, errkind.ErrDenied, "not a claim of its namespace"},
		{"a restore asking for a volume", []runtime.Object{clone(func(c *corev1.PersistentVolumeClaim) {
			c.Spec.DataSource = &corev1.TypedLocalObjectReference{APIGroup: ptr.To("snapshot.storage.k8s.io"), Kind: "VolumeSnapshot", Name: "snap"}
		}), source("team-a", "pv-data"), pv(vol, names.Driver, "node-a", "team-a")}, errkind.ErrDenied, "not a claim of its namespace"},
		{"not left to the scheduler", []runtime.Object{clone(func(c *corev1.PersistentVolumeClaim) { delete(c.Annotations, names.Placement) }),
			source("team-a", "pv-data"), pv(vol, names.Driver, "node-a", "team-a")}, errkind.ErrDenied, "not left to the scheduler"},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := ClaimAuthorizer{Client: fake.NewClientset(c.objs...), Dynamic: dynamicfake.NewSimpleDynamicClient(runtime.NewScheme()),
				Node: "node-a", Driver: names.Driver}
			err := a.Authorize(context.Background(), &req)
			if c.kind == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				im := &Importer{Claims: fake.NewClientset(c.objs...), Driver: names.Driver}
				node, err := im.VolumeNode(context.Background(), &store.Import{ClaimNamespace: "team-a", ClaimName: "clone", ClaimUID: "u1"}, vol)
				if err != nil || node != "node-a" {
					t.Fatalf("VolumeNode: %q, %v; want node-a", node, err)
				}
				return
			}
			if !errors.Is(err, c.kind) || !strings.Contains(err.Error(), c.message) {
				t.Fatalf("%v, want %v saying %q", err, c.kind, c.message)
			}
		})
	}
}

// A clone's pull is a migration's (Move) only when the PV it copies says
// so, naming the caller as the target and the claim the pull is for:
// podvol-controller's marks, on an object no tenant writes.
func TestClaimAuthorizerMoves(t *testing.T) {
	const vol = "pv-0123456789abcdef01234567"
	for _, c := range []struct {
		name        string
		annotations map[string]string
		move        bool
	}{
		{"marked", map[string]string{names.MigrationTarget: "node-b", names.MigrationClaim: "team-a/data-moving"}, true},
		{"not marked", nil, false},
		{"for another node", map[string]string{names.MigrationTarget: "node-c", names.MigrationClaim: "team-a/data-moving"}, false},
		{"for another claim", map[string]string{names.MigrationTarget: "node-b", names.MigrationClaim: "team-a/other"}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			objs := []runtime.Object{
				&corev1.PersistentVolumeClaim{
					ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "data-moving", UID: "u1", Annotations: map[string]string{
						names.SelectedNode: "node-b", storageProvisioner: names.Driver, names.Placement: names.PlacementScheduler}},
					Spec: corev1.PersistentVolumeClaimSpec{DataSource: &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "data"}},
				},
				&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "data", UID: "src-uid"},
					Spec: corev1.PersistentVolumeClaimSpec{VolumeName: "pv-data"}},
				&corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-data", Annotations: c.annotations}, Spec: corev1.PersistentVolumeSpec{
					PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: names.Driver, VolumeHandle: vol}},
					ClaimRef:               &corev1.ObjectReference{Namespace: "team-a", Name: "data", UID: "src-uid"},
					NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
						MatchExpressions: []corev1.NodeSelectorRequirement{{Key: names.TopologyKey, Operator: corev1.NodeSelectorOpIn, Values: []string{"node-a"}}}}}}},
				}},
			}
			a := ClaimAuthorizer{Client: fake.NewClientset(objs...), Dynamic: dynamicfake.NewSimpleDynamicClient(runtime.NewScheme()), Node: "node-a", Driver: names.Driver}
			req := transfer.Request{Caller: "node-b", Source: vol, Claim: transfer.Claim{Namespace: "team-a", Name: "data-moving", UID: "u1"}}
			if err := a.Authorize(context.Background(), &req); err != nil {
				t.Fatalf("refused: %v", err)
			}
			if req.Move != c.move {
				t.Errorf("Move %v, want %v", req.Move, c.move)
			}
		})
	}
}
