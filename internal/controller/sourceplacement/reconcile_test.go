package sourceplacement

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
	"github.com/podvol/podvol/internal/snaphandle"
)

// Reconcile's branches, and the backoffs it keeps in memory, against a fake
// client; test/controller runs it against a real API server, through the
// manager's watches and a cache that lags on purpose.

const ns = "ns"

func class(name, provisioner string, mode storagev1.VolumeBindingMode) *storagev1.StorageClass {
	return &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: provisioner, VolumeBindingMode: &mode}
}

func node(name string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
}

// bound is a source claim bound to a PV of driver on node ("" no
// affinity).
func bound(name, driver, nodeName string) (*corev1.PersistentVolumeClaim, *corev1.PersistentVolume) {
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name)},
		Spec: corev1.PersistentVolumeClaimSpec{VolumeName: "pv-" + name, StorageClassName: ptr.To("podvol")}}
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-" + name},
		Spec: corev1.PersistentVolumeSpec{
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: "vol-" + name}},
			ClaimRef:               &corev1.ObjectReference{Namespace: ns, Name: name, UID: pvc.UID},
		}}
	if nodeName != "" {
		pv.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: names.TopologyKey, Operator: corev1.NodeSelectorOpIn, Values: []string{nodeName}}}}}}}
	}
	return pvc, pv
}

// clone is an unbound claim of class podvol that clones claim src.
func clone(name, src string, ann map[string]string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name), Annotations: ann},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: ptr.To("podvol"),
			DataSource: &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: src}}}
}

// restore is an unbound claim of class podvol that restores snapshot snap.
func restore(name, snap string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name)},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: ptr.To("podvol"),
			DataSourceRef: &corev1.TypedObjectReference{APIGroup: ptr.To(snapshotGroup), Kind: "VolumeSnapshot", Name: snap}}}
}

// user is a running pod that uses claim.
func user(name, claim string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name)},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}}}}
}

// snapshot is VolumeSnapshot name bound to content, and content with
// handle of driver naming it back (refName: the name it names).
func snapshot(name, content, driver, handle, refName string) (*unstructured.Unstructured, *unstructured.Unstructured) {
	vs := &unstructured.Unstructured{}
	vs.SetGroupVersionKind(SnapshotGVK)
	vs.SetNamespace(ns)
	vs.SetName(name)
	vs.SetUID(types.UID("uid-" + name))
	vs.Object["spec"] = map[string]any{"source": map[string]any{"persistentVolumeClaimName": "golden"}}
	if content != "" {
		vs.Object["status"] = map[string]any{"boundVolumeSnapshotContentName": content}
	}
	c := &unstructured.Unstructured{}
	c.SetGroupVersionKind(ContentGVK)
	c.SetName(content)
	c.Object["spec"] = map[string]any{"driver": driver, "deletionPolicy": "Delete",
		"volumeSnapshotRef": map[string]any{"namespace": ns, "name": refName, "uid": "uid-" + refName},
		"source":            map[string]any{"volumeHandle": "vol-golden"}}
	if handle != "" {
		c.Object["status"] = map[string]any{"snapshotHandle": handle}
	}
	return vs, c
}

var errAPI = errors.New("the API server is unreachable")

// env is a reconciler on a fake client holding objs.
type env struct {
	t   *testing.T
	c   client.WithWatch // past the interceptor
	r   *Reconciler
	rec *events.FakeRecorder
}

func newEnv(t *testing.T, snapshots bool, funcs interceptor.Funcs, objs ...client.Object) *env {
	t.Helper()
	var typed []client.Object
	var unstr []*unstructured.Unstructured
	for _, o := range objs {
		if u, ok := o.(*unstructured.Unstructured); ok {
			unstr = append(unstr, u)
		} else {
			typed = append(typed, o)
		}
	}
	c := fake.NewClientBuilder().WithObjects(typed...).
		WithIndex(&corev1.Pod{}, podClaimIndex, func(o client.Object) []string { return claimsOf(o.(*corev1.Pod)) }).
		Build()
	// The snapshot kinds are not in the scheme: the fake client takes
	// them as unstructured objects once one is written.
	for _, u := range unstr {
		if err := c.Create(context.Background(), u.DeepCopy()); err != nil {
			t.Fatal(err)
		}
	}
	rec := events.NewFakeRecorder(100)
	return &env{t: t, c: c, rec: rec, r: &Reconciler{Client: interceptor.NewClient(c, funcs), Recorder: rec, Driver: names.Driver,
		Backoff: time.Hour, Wait: time.Minute, MaxBackoff: 4 * time.Minute, snapshots: snapshots}}
}

func (e *env) reconcile(name string) (reconcile.Result, error) {
	return e.r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}})
}

// placement is the claim's selected node and podvol's mark.
func (e *env) placement(name string) (selected, mark string) {
	e.t.Helper()
	pvc := &corev1.PersistentVolumeClaim{}
	if err := e.c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, pvc); err != nil {
		e.t.Fatal(err)
	}
	return pvc.Annotations[names.SelectedNode], pvc.Annotations[names.SourceNode]
}

func (e *env) setPlacement(name, selected string) {
	e.t.Helper()
	pvc := &corev1.PersistentVolumeClaim{}
	if err := e.c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, pvc); err != nil {
		e.t.Fatal(err)
	}
	if selected == "" {
		delete(pvc.Annotations, names.SelectedNode)
	} else {
		pvc.Annotations[names.SelectedNode] = selected
	}
	if err := e.c.Update(context.Background(), pvc); err != nil {
		e.t.Fatal(err)
	}
}

// events returns the events recorded since the last call, as "Type Reason".
func (e *env) events() []string {
	var out []string
	for {
		select {
		case ev := <-e.rec.Events:
			f := strings.Fields(ev)
			out = append(out, f[0]+" "+f[1])
		default:
			return out
		}
	}
}

func TestReconcile(t *testing.T) {
	golden, goldenPV := bound("golden", names.Driver, "node-a")
	foreignSrc, foreignPV := bound("foreign", "ebs.csi.example", "node-a")
	nowhere, nowherePV := bound("nowhere", names.Driver, "")
	// A tenant's claim naming golden's PV, which is bound to golden.
	squatter := golden.DeepCopy()
	squatter.Name, squatter.UID = "squatter", "uid-squatter"
	// A PV an admin pre-bound to claim reserved (no UID yet), and a
	// tenant's claim naming it.
	_, preboundPV := bound("prebound", names.Driver, "node-a")
	preboundPV.Spec.ClaimRef = &corev1.ObjectReference{Namespace: ns, Name: "reserved"}
	taker := golden.DeepCopy()
	taker.Name, taker.UID, taker.Spec.VolumeName = "taker", "uid-taker", preboundPV.Name
	unboundSrc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pending"}}
	// without: the class and the source, without the source's node.
	without := func(objs ...client.Object) []client.Object {
		return append([]client.Object{class("podvol", names.Driver, storagev1.VolumeBindingWaitForFirstConsumer), golden, goldenPV}, objs...)
	}
	with := func(objs ...client.Object) []client.Object {
		return without(append([]client.Object{node("node-a")}, objs...)...)
	}
	vs, content := snapshot("snap", "content-1", names.Driver, snaphandle.Format("id-1", "node-a"), "snap")
	uncut, uncutContent := snapshot("snap", "content-1", names.Driver, "", "snap")
	unbound, _ := snapshot("snap", "", names.Driver, "", "snap")
	otherVS, otherContent := snapshot("snap", "content-1", "ebs.csi.example", "snap-x", "snap")
	oldVS, oldContent := snapshot("snap", "content-1", names.Driver, "id-1", "snap")
	strayVS, strayContent := snapshot("snap", "content-1", names.Driver, snaphandle.Format("id-1", "node-a"), "another-snap")
	cordoned := node("node-a")
	cordoned.Spec.Unschedulable = true
	finished := user("done", "work")
	finished.Status.Phase = corev1.PodSucceeded
	otherNS := clone("work", "golden", nil)
	otherNS.Spec.DataSource = nil
	otherNS.Spec.DataSourceRef = &corev1.TypedObjectReference{Kind: "PersistentVolumeClaim", Name: "golden", Namespace: ptr.To("elsewhere")}
	boundClone := clone("work", "golden", nil)
	boundClone.Spec.VolumeName = "pv-x"
	immediate := clone("work", "golden", nil)
	immediate.Spec.StorageClassName = ptr.To("now")
	otherClass := clone("work", "golden", nil)
	otherClass.Spec.StorageClassName = ptr.To("ebs")
	fromPod := clone("work", "golden", nil)
	fromPod.Spec.DataSource.Kind = "Pod"
	// A generic ephemeral volume's claim, owned by its pod.
	eph := clone("vm-scratch", "golden", nil)
	eph.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "vm", UID: "uid-vm", Controller: ptr.To(true)}}
	vm := user("vm", "")
	vm.Spec.Volumes = []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{VolumeClaimTemplate: &corev1.PersistentVolumeClaimTemplate{}}}}}
	conflict := apierrors.NewConflict(schema.GroupResource{Resource: "persistentvolumeclaims"}, "work", errors.New("the object has been modified"))

	for _, tc := range []struct {
		name      string
		objs      []client.Object
		snapshots bool
		funcs     interceptor.Funcs
		claim     string // "" work
		// selected and mark: the claim's placement after.
		selected, mark string
		events         []string // "Type Reason", in order
		requeue        time.Duration
		wantErr        error
	}{
		{name: "a clone used by a pod is placed on its source's node", objs: with(clone("work", "golden", nil), user("p", "work")),
			selected: "node-a", mark: "node-a", events: []string{"Normal " + ReasonPlaced}},
		{name: "the scheduler's choice is replaced, no pod needed", objs: with(clone("work", "golden", map[string]string{names.SelectedNode: "node-c"})),
			selected: "node-a", mark: "node-a", events: []string{"Normal " + ReasonPlaced}},
		{name: "placed already", objs: with(clone("work", "golden", map[string]string{names.SelectedNode: "node-a", names.SourceNode: "node-a"}), user("p", "work")),
			selected: "node-a", mark: "node-a"},
		{name: "a generic ephemeral volume's claim: its pod hears too", claim: "vm-scratch", objs: with(eph, vm),
			selected: "node-a", mark: "node-a", events: []string{"Normal " + ReasonPlaced, "Normal " + ReasonPlaced}},
		{name: "a claim no pod uses is left unprovisioned", objs: with(clone("work", "golden", nil))},
		{name: "a finished pod is no consumer", objs: with(clone("work", "golden", nil), finished)},
		{name: "a claim that is gone", objs: with()},
		{name: "a bound claim is not podvol's to place", objs: with(boundClone, user("p", "work"))},
		{name: "a claim made from a pod is not a clone", objs: with(fromPod, user("p", "work"))},
		{name: "an Immediate class is not placed by the scheduler", objs: with(class("now", names.Driver, storagev1.VolumeBindingImmediate), immediate, user("p", "work"))},
		{name: "another driver's class", objs: with(class("ebs", "ebs.csi.example", storagev1.VolumeBindingWaitForFirstConsumer), otherClass, user("p", "work"))},
		{name: "a class not there yet", objs: with(otherClass, user("p", "work"))},
		{name: "a source of another driver", objs: with(foreignSrc, foreignPV, clone("work", "foreign", nil), user("p", "work"))},
		{name: "a source not bound yet: looked at again", objs: with(unboundSrc, clone("work", "pending", nil), user("p", "work")), requeue: time.Minute},
		{name: "a source not there yet: looked at again", objs: with(clone("work", "missing", nil), user("p", "work")), requeue: time.Minute},
		{name: "a source naming a PV bound to another claim is not bound", objs: with(squatter, clone("work", "squatter", nil), user("p", "work")), requeue: time.Minute},
		{name: "a source naming a PV pre-bound to another claim is not bound", objs: with(taker, preboundPV, clone("work", "taker", nil), user("p", "work")), requeue: time.Minute},
		{name: "a source whose PV names no node", objs: with(nowhere, nowherePV, clone("work", "nowhere", nil), user("p", "work")),
			events: []string{"Warning " + ReasonNoNode}},
		{name: "a source in another namespace", objs: with(otherNS, user("p", "work")), events: []string{"Warning " + ReasonOtherNamespace}},
		{name: "the source's node is not in the cluster", objs: without(clone("work", "golden", nil), user("p", "work")),
			events: []string{"Warning " + ReasonNodeMissing}, requeue: time.Hour},
		{name: "a pod that cannot run on the source's node: placed, and told", objs: without(cordoned, clone("work", "golden", nil), user("p", "work")),
			selected: "node-a", mark: "node-a", events: []string{"Normal " + ReasonPlaced, "Warning " + ReasonNodeUnfit, "Warning " + ReasonNodeUnfit}},
		{name: "a restore of a snapshot on a node", objs: with(restore("work", "snap"), user("p", "work"), vs, content), snapshots: true,
			selected: "node-a", mark: "node-a", events: []string{"Normal " + ReasonPlaced}},
		{name: "a restore while the snapshot API was missing", objs: with(restore("work", "snap"), user("p", "work"), vs, content),
			events: []string{"Warning " + ReasonNoSnapshotAPI}},
		{name: "a snapshot not cut yet", objs: with(restore("work", "snap"), user("p", "work"), uncut, uncutContent), snapshots: true, requeue: time.Minute},
		{name: "a snapshot not bound yet", objs: with(restore("work", "snap"), user("p", "work"), unbound), snapshots: true, requeue: time.Minute},
		{name: "a snapshot not there yet", objs: with(restore("work", "snap"), user("p", "work")), snapshots: true, requeue: time.Minute},
		{name: "a content that names another snapshot", objs: with(restore("work", "snap"), user("p", "work"), strayVS, strayContent), snapshots: true, requeue: time.Minute},
		{name: "another driver's snapshot", objs: with(restore("work", "snap"), user("p", "work"), otherVS, otherContent), snapshots: true},
		{name: "a snapshot handle naming no node", objs: with(restore("work", "snap"), user("p", "work"), oldVS, oldContent), snapshots: true,
			events: []string{"Warning " + ReasonNoNode}},
		{name: "the placement conflicts with a newer claim", objs: with(clone("work", "golden", nil), user("p", "work")), wantErr: conflict,
			funcs: interceptor.Funcs{Patch: func(context.Context, client.WithWatch, client.Object, client.Patch, ...client.PatchOption) error {
				return conflict
			}}},
		{name: "the pods cannot be listed", objs: with(clone("work", "golden", nil), user("p", "work")), wantErr: errAPI,
			funcs: interceptor.Funcs{List: func(context.Context, client.WithWatch, client.ObjectList, ...client.ListOption) error { return errAPI }}},
		{name: "the claim cannot be read", objs: with(clone("work", "golden", nil), user("p", "work")), wantErr: errAPI,
			funcs: interceptor.Funcs{Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
				return errAPI
			}}},
		{name: "the source's node cannot be read", objs: with(clone("work", "golden", nil), user("p", "work")), wantErr: errAPI,
			funcs: interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, o client.Object, opts ...client.GetOption) error {
				if _, ok := o.(*corev1.Node); ok {
					return errAPI
				}
				return c.Get(ctx, key, o, opts...)
			}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			claim := tc.claim
			if claim == "" {
				claim = "work"
			}
			e := newEnv(t, tc.snapshots, tc.funcs, tc.objs...)
			res, err := e.reconcile(claim)
			if !errors.Is(err, tc.wantErr) && !(tc.wantErr != nil && err != nil && apierrors.IsConflict(err) && apierrors.IsConflict(tc.wantErr)) {
				t.Fatalf("Reconcile: error %v, want %v", err, tc.wantErr)
			}
			if res.RequeueAfter != tc.requeue {
				t.Errorf("Reconcile: requeue after %s, want %s", res.RequeueAfter, tc.requeue)
			}
			if evs := e.events(); strings.Join(evs, ",") != strings.Join(tc.events, ",") {
				t.Errorf("events %q, want %q", evs, tc.events)
			}
			if tc.wantErr != nil {
				return
			}
			pvc := &corev1.PersistentVolumeClaim{}
			if err := e.c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: claim}, pvc); apierrors.IsNotFound(err) {
				return
			}
			selected, mark := e.placement(claim)
			if selected != tc.selected || mark != tc.mark {
				t.Errorf("placement %s=%q %s=%q, want %q %q", names.SelectedNode, selected, names.SourceNode, mark, tc.selected, tc.mark)
			}
			// Idempotent: a second pass changes nothing and does not
			// repeat a warning.
			rv := pvc.ResourceVersion
			if _, err := e.reconcile(claim); err != nil {
				t.Fatalf("second Reconcile: %v", err)
			}
			if err := e.c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: claim}, pvc); err != nil {
				t.Fatal(err)
			}
			if pvc.ResourceVersion != rv {
				t.Errorf("second Reconcile wrote the claim: %v", pvc.Annotations)
			}
			if evs := e.events(); len(evs) > 0 {
				t.Errorf("second Reconcile: events %q, want none", evs)
			}
		})
	}
}

// The source node's provisioner gives a placement back (no room): the claim
// is placed there again only after a backoff that doubles with each
// give-back of that claim, and a new claim of the same name starts over.
func TestGiveBack(t *testing.T) {
	golden, goldenPV := bound("golden", names.Driver, "node-a")
	const backoff = 300 * time.Millisecond // long enough that a pass at once is before its end
	e := newEnv(t, false, interceptor.Funcs{}, class("podvol", names.Driver, storagev1.VolumeBindingWaitForFirstConsumer), golden, goldenPV, node("node-a"),
		clone("work", "golden", nil), user("p", "work"))
	e.r.Backoff, e.r.MaxBackoff = backoff, time.Hour

	mustPlace := func(step string) {
		t.Helper()
		if res, err := e.reconcile("work"); err != nil || !res.IsZero() {
			t.Fatalf("%s: Reconcile: %+v, %v", step, res, err)
		}
		if s, m := e.placement("work"); s != "node-a" || m != "node-a" {
			t.Fatalf("%s: placement %q %q, want node-a", step, s, m)
		}
		if evs := e.events(); len(evs) != 1 || evs[0] != "Normal "+ReasonPlaced {
			t.Fatalf("%s: events %q", step, evs)
		}
	}
	// givenBack takes the placement away as the provisioner does, and
	// checks that the claim waits for delay, with one warning.
	givenBack := func(step string, delay time.Duration) {
		t.Helper()
		e.setPlacement("work", "")
		start := time.Now()
		res, err := e.reconcile("work")
		end := time.Now() // the backoff started in between
		if err != nil || res.RequeueAfter <= 0 || res.RequeueAfter > delay || res.RequeueAfter < delay-time.Since(start)-10*time.Millisecond {
			t.Fatalf("%s: Reconcile: %+v, %v; want a requeue after %s", step, res, err, delay)
		}
		if evs := e.events(); len(evs) != 1 || evs[0] != "Warning "+ReasonNoRoom {
			t.Fatalf("%s: events %q, want one %s", step, evs, ReasonNoRoom)
		}
		// Looked at again before the backoff is over: still waiting,
		// not warned again, not placed.
		if res, err := e.reconcile("work"); err != nil || res.RequeueAfter <= 0 {
			t.Fatalf("%s, again: Reconcile: %+v, %v", step, res, err)
		}
		if s, _ := e.placement("work"); s != "" {
			t.Fatalf("%s: placed again before the backoff, on %q", step, s)
		}
		if evs := e.events(); len(evs) > 0 {
			t.Fatalf("%s, again: events %q", step, evs)
		}
		time.Sleep(time.Until(end.Add(delay)))
	}
	mustPlace("first placement")
	givenBack("first give-back", backoff)
	mustPlace("after the first backoff")
	givenBack("second give-back", 2*backoff)
	mustPlace("after the second backoff")

	// A new claim of that name has no give-backs yet.
	old := &corev1.PersistentVolumeClaim{}
	if err := e.c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "work"}, old); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Delete(context.Background(), old); err != nil {
		t.Fatal(err)
	}
	fresh := clone("work", "golden", nil)
	fresh.UID = "uid-work-2"
	if err := e.c.Create(context.Background(), fresh); err != nil {
		t.Fatal(err)
	}
	mustPlace("a new claim of that name")
	givenBack("its first give-back", backoff)
}

// A source not ready to tell its node is looked at again after Wait,
// doubled with each look in a row up to MaxBackoff; the count starts over
// once the claim is not waiting.
func TestWaitGrows(t *testing.T) {
	pending := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pending"}}
	e := newEnv(t, false, interceptor.Funcs{}, class("podvol", names.Driver, storagev1.VolumeBindingWaitForFirstConsumer), pending, node("node-a"),
		clone("work", "pending", nil), user("p", "work"))
	for _, want := range []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute, 4 * time.Minute} {
		if res, err := e.reconcile("work"); err != nil || res.RequeueAfter != want {
			t.Fatalf("Reconcile: %+v, %v; want a requeue after %s", res, err, want)
		}
	}
	// No consumer for a while: the count starts over.
	p := &corev1.Pod{}
	if err := e.c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "p"}, p); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Delete(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	if res, err := e.reconcile("work"); err != nil || !res.IsZero() {
		t.Fatalf("Reconcile without a consumer: %+v, %v", res, err)
	}
	if err := e.c.Create(context.Background(), user("p2", "work")); err != nil {
		t.Fatal(err)
	}
	if res, err := e.reconcile("work"); err != nil || res.RequeueAfter != time.Minute {
		t.Fatalf("Reconcile with a consumer again: %+v, %v; want a requeue after %s", res, err, time.Minute)
	}
	if evs := e.events(); len(evs) > 0 {
		t.Errorf("events %q, want none while the source is not ready", evs)
	}
}

// With transfers, a restore or clone whose pod cannot run on its source's
// node, that the source's node gave back, or that the user leaves to the
// scheduler, is not placed: podvol's placeholder goes, the claim is marked
// for the scheduler, and a Normal event says the data follows. One that
// fits is placed as before.
func TestTransfersLetRestoresAndClonesMove(t *testing.T) {
	golden, goldenPV := bound("golden", names.Driver, "node-a")
	vs, content := snapshot("snap", "content-1", names.Driver, snaphandle.Format("id-1", "node-a"), "snap")
	elsewhere := user("reader", "work")
	elsewhere.Spec.NodeSelector = map[string]string{names.TopologyKey: "node-b"}
	awaiting := func(c *corev1.PersistentVolumeClaim) *corev1.PersistentVolumeClaim {
		c.Annotations = map[string]string{names.SelectedNode: names.AwaitingPlacement}
		return c
	}
	// Placed on node-a before, and given back by its provisioner.
	givenBack := func(c *corev1.PersistentVolumeClaim) *corev1.PersistentVolumeClaim {
		c.Annotations = map[string]string{names.SourceNode: "node-a"}
		return c
	}
	optOut := awaiting(restore("work", "snap"))
	optOut.Annotations = map[string]string{names.Placement: names.PlacementScheduler}
	for _, tc := range []struct {
		name           string
		objs           []client.Object
		selected, mark string
		placement      string
		events         []string
	}{
		{"pod elsewhere: moves", []client.Object{awaiting(restore("work", "snap")), vs, content, elsewhere}, "", "", names.PlacementScheduler, []string{"Normal " + ReasonDataFollows}},
		{"pod fits: placed", []client.Object{awaiting(restore("work", "snap")), vs, content, user("reader", "work")}, "node-a", "node-a", "", []string{"Normal " + ReasonPlaced}},
		{"left to the scheduler by the user", []client.Object{optOut, vs, content, elsewhere}, "", "", names.PlacementScheduler, nil},
		{"a clone's pod elsewhere: moves", []client.Object{awaiting(clone("work", "golden", nil)), elsewhere}, "", "", names.PlacementScheduler, []string{"Normal " + ReasonDataFollows}},
		{"a clone's pod fits: placed", []client.Object{awaiting(clone("work", "golden", nil)), user("reader", "work")}, "node-a", "node-a", "", []string{"Normal " + ReasonPlaced}},
		{"a clone the node gave back: moves", []client.Object{givenBack(clone("work", "golden", nil)), user("reader", "work")}, "", "node-a", names.PlacementScheduler, []string{"Normal " + ReasonDataFollows}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := append([]client.Object{class("podvol", names.Driver, storagev1.VolumeBindingWaitForFirstConsumer), golden, goldenPV, node("node-a")}, tc.objs...)
			e := newEnv(t, true, interceptor.Funcs{}, objs...)
			e.r.Transfers = true
			if _, err := e.reconcile("work"); err != nil {
				t.Fatal(err)
			}
			selected, mark := e.placement("work")
			pvc := &corev1.PersistentVolumeClaim{}
			if err := e.c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "work"}, pvc); err != nil {
				t.Fatal(err)
			}
			if selected != tc.selected || mark != tc.mark || pvc.Annotations[names.Placement] != tc.placement {
				t.Errorf("selected %q, mark %q, placement %q; want %q, %q, %q", selected, mark, pvc.Annotations[names.Placement], tc.selected, tc.mark, tc.placement)
			}
			if got := e.events(); !slices.Equal(got, tc.events) {
				t.Errorf("events %v, want %v", got, tc.events)
			}
		})
	}
}
