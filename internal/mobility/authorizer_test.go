package mobility

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

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
// (fake clients: the logic of which claim lets which node pull what), and
// of the pool's record of the snapshot.
func TestClaimAuthorizer(t *testing.T) {
	const srcVol = "pv-0123456789abcdef01234567"
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
	// A dynamically cut snapshot's content, as snapshot-controller makes it
	// (labelled with the source PV's node, spec.source naming the volume)
	// and node-a's csi-snapshotter completes it (the handle in status).
	content := func(handle string, mod func(*unstructured.Unstructured)) []runtime.Object {
		vs := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
			"metadata": map[string]any{"namespace": "team-a", "name": "snap", "uid": "vs-uid"},
			"status":   map[string]any{"boundVolumeSnapshotContentName": "content-1", "readyToUse": true}}}
		vsc := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
			"metadata": map[string]any{"name": "content-1", "labels": map[string]any{names.SnapshotManagedBy: "node-a"}},
			"spec": map[string]any{"driver": names.Driver, "source": map[string]any{"volumeHandle": srcVol},
				"volumeSnapshotRef": map[string]any{"namespace": "team-a", "name": "snap", "uid": "vs-uid"}},
			"status": map[string]any{"snapshotHandle": handle}}}
		if mod != nil {
			mod(vs)
			mod(vsc)
		}
		return []runtime.Object{vs, vsc}
	}
	objs := func(handle string) []runtime.Object { return content(handle, nil) }
	onContent := func(f func(*unstructured.Unstructured)) func(*unstructured.Unstructured) {
		return func(u *unstructured.Unstructured) {
			if u.GetKind() == "VolumeSnapshotContent" {
				f(u)
			}
		}
	}
	// imported: a content an admin made for an existing handle
	// (pre-provisioned), its status handle copied from spec by
	// csi-snapshotter.
	imported := func(specHandle, statusHandle string) []runtime.Object {
		return content(statusHandle, onContent(func(u *unstructured.Unstructured) {
			must(t, unstructured.SetNestedField(u.Object, map[string]any{"snapshotHandle": specHandle}, "spec", "source"))
			if statusHandle == "" {
				unstructured.RemoveNestedField(u.Object, "status")
			}
		}))
	}
	// The pool's records: snap-1 of team-a's volume, snap-2 of team-b's,
	// snap-3 cut before podvol recorded namespaces.
	pool := map[string]*store.Snapshot{
		"snap-1": {ID: "snap-1", SourceID: srcVol, Namespace: "team-a"},
		"snap-2": {ID: "snap-2", SourceID: srcVol, Namespace: "team-b"},
		"snap-3": {ID: "snap-3", SourceID: srcVol},
	}
	req := transfer.Request{Caller: "node-b", Source: "snap-1", Claim: transfer.Claim{Namespace: "team-a", Name: "restored", UID: "u1"}}
	asking := func(id string) transfer.Request { r := req; r.Source = id; return r }
	for _, c := range []struct {
		name    string
		pvc     *corev1.PersistentVolumeClaim
		objs    []runtime.Object
		req     transfer.Request
		kind    error
		message string
	}{
		{"allowed", claim(nil), objs("snap-1@node-a"), req, nil, ""},
		{"no claim", nil, objs("snap-1@node-a"), req, errkind.ErrNotFound, "does not exist"},
		{"another claim of that name", claim(func(c *corev1.PersistentVolumeClaim) { c.UID = "u2" }), objs("snap-1@node-a"), req, errkind.ErrNotFound, "another claim"},
		{"bound", claim(func(c *corev1.PersistentVolumeClaim) { c.Spec.VolumeName = "pv-1" }), objs("snap-1@node-a"), req, errkind.ErrDenied, "bound already"},
		{"for another node", claim(func(c *corev1.PersistentVolumeClaim) { c.Annotations[names.SelectedNode] = "node-c" }), objs("snap-1@node-a"), req, errkind.ErrDenied, `on node "node-c", not on node node-b`},
		{"another provisioner", claim(func(c *corev1.PersistentVolumeClaim) { c.Annotations[storageProvisioner] = "other.csi" }), objs("snap-1@node-a"), req, errkind.ErrDenied, "not provisioned by"},
		{"a clone", claim(func(c *corev1.PersistentVolumeClaim) {
			c.Spec.DataSourceRef = &corev1.TypedObjectReference{Kind: "PersistentVolumeClaim", Name: "data"}
		}), objs("snap-1@node-a"), req, errkind.ErrDenied, "not a VolumeSnapshot"},
		{"another namespace's snapshot", claim(func(c *corev1.PersistentVolumeClaim) { c.Spec.DataSourceRef.Namespace = ptr.To("team-b") }), objs("snap-1@node-a"), req, errkind.ErrDenied, "not a VolumeSnapshot of its namespace"},
		{"another snapshot asked", claim(nil), objs("snap-2@node-a"), req, errkind.ErrDenied, "not snap-1"},
		{"another node's snapshot", claim(nil), objs("snap-1@node-c"), req, errkind.ErrDenied, "not snap-1 of node node-a"},
		{"another driver's content", claim(nil), content("snap-1@node-a", onContent(func(u *unstructured.Unstructured) {
			must(t, unstructured.SetNestedField(u.Object, "other.csi", "spec", "driver"))
		})), req, errkind.ErrDenied, "driver other.csi"},
		{"no snapshot", claim(nil), nil, req, errkind.ErrNotFound, "VolumeSnapshot team-a/snap does not exist"},
		{"not left to the scheduler", claim(func(c *corev1.PersistentVolumeClaim) { delete(c.Annotations, names.Placement) }), objs("snap-1@node-a"), req, errkind.ErrDenied, "not left to the scheduler"},
		{"snapshot not ready", claim(nil), content("snap-1@node-a", func(u *unstructured.Unstructured) {
			if u.GetKind() == "VolumeSnapshot" {
				must(t, unstructured.SetNestedField(u.Object, false, "status", "readyToUse"))
			}
		}), req, errkind.ErrNotFound, "not bound to a ready content"},
		{"content of another snapshot", claim(nil), content("snap-1@node-a", onContent(func(u *unstructured.Unstructured) {
			must(t, unstructured.SetNestedField(u.Object, "other", "spec", "volumeSnapshotRef", "name"))
		})), req, errkind.ErrDenied, "does not name VolumeSnapshot team-a/snap back"},

		// Issue 41: a node may write the status of the contents it
		// manages; the handle there is believed only on a content this
		// node manages, that agrees with the content's immutable
		// spec.source, for a snapshot of the claim's namespace.
		{"content managed by another node", claim(nil), content("snap-1@node-a", onContent(func(u *unstructured.Unstructured) {
			u.SetLabels(map[string]string{names.SnapshotManagedBy: "node-b"})
		})), req, errkind.ErrDenied, "managed by node node-b, not by this node (node-a)"},
		{"content managed by no node", claim(nil), content("snap-1@node-a", onContent(func(u *unstructured.Unstructured) {
			u.SetLabels(nil)
		})), req, errkind.ErrDenied, "managed by node (none), not by this node"},
		{"a status handle of a snapshot of another volume than spec.source's", claim(nil), content("snap-1@node-a", onContent(func(u *unstructured.Unstructured) {
			must(t, unstructured.SetNestedField(u.Object, "pv-0123456789abcdef0123456f", "spec", "source", "volumeHandle"))
		})), req, errkind.ErrDenied, "spec.source.volumeHandle pv-0123456789abcdef0123456f, and snapshot snap-1 was cut from volume " + srcVol},
		{"a status handle that disagrees with spec.source.snapshotHandle", claim(nil), imported("snap-2@node-a", "snap-1@node-a"), req, errkind.ErrDenied,
			`status.snapshotHandle "snap-1@node-a" is not its spec.source.snapshotHandle "snap-2@node-a"`},
		{"a snapshot of another namespace", claim(nil), objs("snap-2@node-a"), asking("snap-2"), errkind.ErrDenied,
			"snapshot snap-2 was cut from a volume of namespace team-b, not of the claim's namespace team-a"},
		{"a snapshot whose namespace is not recorded", claim(nil), objs("snap-3@node-a"), asking("snap-3"), errkind.ErrDenied,
			"snapshot snap-3 was cut from a volume whose namespace podvol did not record"},
		{"a snapshot not on this node", claim(nil), objs("snap-9@node-a"), asking("snap-9"), errkind.ErrNotFound, "no snapshot snap-9"},
		{"a content being deleted", claim(nil), content("snap-1@node-a", onContent(func(u *unstructured.Unstructured) {
			u.SetDeletionTimestamp(&metav1.Time{Time: time.Now()})
		})), req, errkind.ErrNotFound, "VolumeSnapshotContent content-1 is being deleted"},
		// An admin (or a backup tool with the right to create contents;
		// no node has it) who imports a snapshot by its handle into a
		// namespace gives it to that namespace.
		{"imported by handle into another namespace", claim(nil), imported("snap-2@node-a", "snap-2@node-a"), asking("snap-2"), nil, ""},
		{"imported by handle, not completed yet", claim(nil), imported("snap-2@node-a", ""), asking("snap-2"), nil, ""},
		{"imported by handle, its namespace not recorded", claim(nil), imported("snap-3@node-a", "snap-3@node-a"), asking("snap-3"), nil, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			var core []runtime.Object
			if c.pvc != nil {
				core = append(core, c.pvc)
			}
			a := ClaimAuthorizer{Client: fake.NewClientset(core...), Dynamic: dynamicfake.NewSimpleDynamicClient(runtime.NewScheme(), c.objs...),
				Node: "node-a", Driver: names.Driver, Snapshot: func(id string) (*store.Snapshot, error) {
					if s, ok := pool[id]; ok {
						return s, nil
					}
					return nil, fmt.Errorf("no snapshot %s: %w", id, errkind.ErrNotFound)
				}}
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

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
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
