package nodeloss

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/podvol/podvol/internal/names"
)

// Reconcile's branches against fake clients: the finalizer on the nodes
// that run podvol, and for a deleted one the Lease watch and the release.
// The Lease rule itself is TestObserve's; test/controller runs all of it
// against a real API server (the garbage collector, strategic merge
// patches against a kubelet's updates, a lagging cache).

const recordNS = "podvol-system"

const otherFinalizer = "example.com/keep"

func podvolNode(name string, held, deleted bool) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), Finalizers: []string{otherFinalizer}}}
	if held {
		n.Finalizers = append(n.Finalizers, names.NodeLossFinalizer)
	}
	if deleted {
		n.DeletionTimestamp = ptr.To(metav1.Now())
	}
	return n
}

func csiNode(name string, drivers ...string) *storagev1.CSINode {
	cn := &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for _, d := range drivers {
		cn.Spec.Drivers = append(cn.Spec.Drivers, storagev1.CSINodeDriver{Name: d, NodeID: name})
	}
	return cn
}

func lease(node string, renewed time.Time) *coordinationv1.Lease {
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: corev1.NamespaceNodeLease, Name: node, UID: "uid-lease"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &metav1.MicroTime{Time: renewed}}}
}

// volume is PV pv-<claim> of driver on node, of class, bound to PVC claim.
func volume(claim, driver, node, class string) (*corev1.PersistentVolumeClaim, *corev1.PersistentVolume) {
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: claim, UID: types.UID("uid-" + claim),
		Finalizers: []string{"kubernetes.io/pvc-protection"}},
		Spec: corev1.PersistentVolumeClaimSpec{VolumeName: "pv-" + claim, StorageClassName: ptr.To(class)}}
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-" + claim,
		Finalizers: []string{"kubernetes.io/pv-protection", "external-provisioner.volume.kubernetes.io/finalizer"}},
		Spec: corev1.PersistentVolumeSpec{StorageClassName: class,
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: "vol-" + claim}},
			ClaimRef:               &corev1.ObjectReference{Namespace: "ns", Name: claim, UID: pvc.UID},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: names.TopologyKey, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}}}}
	return pvc, pv
}

var errAPI = errors.New("the API server is unreachable")

type env struct {
	t   *testing.T
	c   client.WithWatch // past the interceptor
	r   *Reconciler
	rec *events.FakeRecorder
}

func newEnv(t *testing.T, funcs interceptor.Funcs, objs ...client.Object) *env {
	t.Helper()
	c := fake.NewClientBuilder().WithObjects(objs...).Build()
	// client-go refuses a Get of an empty name before sending it; the fake
	// client answers NotFound.
	get := funcs.Get
	funcs.Get = func(ctx context.Context, c client.WithWatch, key client.ObjectKey, o client.Object, opts ...client.GetOption) error {
		if key.Name == "" {
			return errors.New("resource name may not be empty")
		}
		if get != nil {
			return get(ctx, c, key, o, opts...)
		}
		return c.Get(ctx, key, o, opts...)
	}
	ic := interceptor.NewClient(c, funcs)
	rec := events.NewFakeRecorder(100)
	// A grace and a lease duration of milliseconds: a Lease left
	// unrenewed is judged within a few passes.
	return &env{t: t, c: c, rec: rec, r: &Reconciler{Client: ic, APIReader: ic, Recorder: rec, Driver: names.Driver,
		Grace: 20 * time.Millisecond, LeaseDuration: 20 * time.Millisecond, Namespace: recordNS}}
}

func (e *env) reconcile(node string) (reconcile.Result, error) {
	return e.r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Name: node}})
}

// node returns the Node, nil if gone.
func (e *env) node(name string) *corev1.Node {
	e.t.Helper()
	n := &corev1.Node{}
	if err := e.c.Get(context.Background(), types.NamespacedName{Name: name}, n); apierrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		e.t.Fatal(err)
	}
	return n
}

// exists tells whether o is there and not being deleted (a PVC's
// protection finalizer keeps a deleted one until no pod uses it).
func (e *env) exists(o client.Object) bool {
	e.t.Helper()
	got := o.DeepCopyObject().(client.Object)
	err := e.c.Get(context.Background(), client.ObjectKeyFromObject(o), got)
	if err != nil && !apierrors.IsNotFound(err) {
		e.t.Fatal(err)
	}
	return err == nil && got.GetDeletionTimestamp() == nil
}

// events since the last call, as "Type Reason" of each.
func (e *env) events() string {
	var out []string
	for {
		select {
		case ev := <-e.rec.Events:
			f := strings.Fields(ev)
			out = append(out, f[0]+" "+f[1])
		default:
			return strings.Join(out, ",")
		}
	}
}

func gauge(node string) float64 {
	m := &dto.Metric{}
	if err := releasedOnNode.WithLabelValues(node).Write(m); err != nil {
		panic(err)
	}
	return m.GetGauge().GetValue()
}

// The finalizer goes on the Nodes that run podvol, and only on them.
func TestHold(t *testing.T) {
	record := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: recordNS, Name: ReleasedRecordName("node-r"),
		Labels:      map[string]string{names.ReleasedLabel: "true", names.ReleasedNodeLabel: "node-r"},
		Annotations: map[string]string{names.ReleasedNodeAnnotation: "node-r"}},
		Data: map[string]string{"pv-1": "volumeHandle=vol-1 claim=ns/data-1", "pv-2": "volumeHandle=vol-2 claim=ns/data-2"}}
	for _, tc := range []struct {
		name  string
		node  string
		objs  []client.Object
		live  *corev1.Node // the Node in the API, when the cache lags
		funcs interceptor.Funcs
		held  bool // the finalizer after
		event string
		err   string
	}{
		{name: "a node that runs podvol is held", node: "node-a", objs: []client.Object{podvolNode("node-a", false, false), csiNode("node-a", "other.csi", names.Driver)}, held: true},
		{name: "held already", node: "node-a", objs: []client.Object{podvolNode("node-a", true, false), csiNode("node-a", names.Driver)}, held: true},
		{name: "a node of another driver is not", node: "node-a", objs: []client.Object{podvolNode("node-a", false, false), csiNode("node-a", "other.csi")}},
		{name: "a node without a CSINode is not", node: "node-a", objs: []client.Object{podvolNode("node-a", false, false)}},
		{name: "a node podvol left is let go", node: "node-a", objs: []client.Object{podvolNode("node-a", true, false), csiNode("node-a", "other.csi")}},
		{name: "a node whose CSINode went with its foreground deletion is kept", node: "node-a", objs: []client.Object{podvolNode("node-a", true, false)},
			live: podvolNode("node-a", true, true), held: true},
		{name: "a node that is gone", node: "node-a"},
		{name: "a deleted node without the finalizer is left alone", node: "node-a", objs: []client.Object{podvolNode("node-a", false, true), csiNode("node-a", names.Driver)}},
		{name: "a node back after a release is told of its records", node: "node-r", objs: []client.Object{podvolNode("node-r", false, false), csiNode("node-r", names.Driver), record},
			held: true, event: "Warning " + ReasonReleasedVolumes},
		{name: "the CSINode cannot be read", node: "node-a", objs: []client.Object{podvolNode("node-a", false, false), csiNode("node-a", names.Driver)}, err: errAPI.Error(),
			funcs: interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, o client.Object, opts ...client.GetOption) error {
				if _, ok := o.(*storagev1.CSINode); ok {
					return errAPI
				}
				return c.Get(ctx, key, o, opts...)
			}}},
		{name: "the finalizer cannot be added", node: "node-a", objs: []client.Object{podvolNode("node-a", false, false), csiNode("node-a", names.Driver)},
			err: "add finalizer " + names.NodeLossFinalizer + " to node node-a",
			funcs: interceptor.Funcs{Patch: func(context.Context, client.WithWatch, client.Object, client.Patch, ...client.PatchOption) error {
				return errAPI
			}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.funcs, tc.objs...)
			if tc.live != nil {
				// The cache has the Node as it was, the API as it is.
				api := fake.NewClientBuilder().WithObjects(tc.live).Build()
				e.r.APIReader = api
			}
			for pass := range 2 { // a second pass changes nothing
				res, err := e.reconcile(tc.node)
				if tc.err != "" {
					if err == nil || !strings.Contains(err.Error(), tc.err) {
						t.Fatalf("Reconcile: error %v, want one with %q", err, tc.err)
					}
					return
				}
				if err != nil || !res.IsZero() {
					t.Fatalf("pass %d: Reconcile: %+v, %v", pass+1, res, err)
				}
				if got := e.events(); pass == 0 && got != tc.event || pass == 1 && got != "" {
					t.Errorf("pass %d: events %q, want %q", pass+1, got, tc.event)
				}
			}
			n := e.node(tc.node)
			if n == nil {
				if len(tc.objs) > 0 {
					t.Fatal("the node is gone")
				}
				return
			}
			if held := controllerutil.ContainsFinalizer(n, names.NodeLossFinalizer); held != tc.held {
				t.Errorf("finalizers %v, want ours: %v", n.Finalizers, tc.held)
			}
			if !controllerutil.ContainsFinalizer(n, otherFinalizer) {
				t.Errorf("finalizers %v: another's was removed", n.Finalizers)
			}
			if tc.event != "" {
				if g := gauge(tc.node); g != 2 {
					t.Errorf("podvol_node_loss_released_volumes{node=%q} = %v, want 2", tc.node, g)
				}
			}
		})
	}
}

// passes reconciles a deleted node until it is no longer waiting on its
// Lease, for at most d, with renew called between passes.
func (e *env) passes(node string, d time.Duration, renew func()) (reconcile.Result, error) {
	e.t.Helper()
	deadline := time.Now().Add(d)
	for {
		res, err := e.reconcile(node)
		if err != nil || res.RequeueAfter == 0 || time.Now().After(deadline) {
			return res, err
		}
		if res.RequeueAfter != e.r.poll() {
			e.t.Fatalf("waiting: requeue after %s, want the poll, %s", res.RequeueAfter, e.r.poll())
		}
		if renew != nil {
			renew()
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A deleted podvol Node: its Lease decides between keeping its volumes and
// releasing them.
func TestDeletedNode(t *testing.T) {
	data1, pv1 := volume("data-1", names.Driver, "node-a", "podvol")
	data2, pv2 := volume("data-2", names.Driver, "node-a", "keep")        // releaseOnNodeLoss: "false"
	data3, pv3 := volume("data-3", names.Driver, "node-b", "podvol")      // another node's
	data4, pv4 := volume("data-4", "ebs.csi.example", "node-a", "podvol") // another driver's
	_, pv5 := volume("data-5", names.Driver, "node-a", "gone")            // its claim and class gone
	data6, pv6 := volume("data-6", names.Driver, "node-a", "")            // a static PV of no class
	classes := []client.Object{
		&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "podvol"}, Provisioner: names.Driver},
		&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "keep"}, Provisioner: names.Driver, Parameters: map[string]string{names.ParamReleaseOnNodeLoss: "false"}},
	}
	vols := []client.Object{data1, pv1, data2, pv2, data3, pv3, data4, pv4, pv5, data6, pv6}
	all := func(objs ...client.Object) []client.Object {
		return append(append(append([]client.Object{}, classes...), vols...), objs...)
	}
	released := []client.Object{data1, pv1, pv5, data6, pv6}
	kept := []client.Object{data2, pv2, data3, pv3, data4, pv4}
	gr := corev1.Resource("persistentvolumeclaims")

	for _, tc := range []struct {
		name  string
		objs  []client.Object
		renew bool // the kubelet renews the Lease
		funcs interceptor.Funcs
		// held: the node is still held after its Lease was read for
		// ten times the grace (a verdict takes one grace).
		held   bool
		events []string // "Type Reason", in any order
		err    string
		// released: the volumes of the node are released, and recorded.
		released bool
	}{
		{name: "its kubelet renews: not lost, nothing released", objs: all(podvolNode("node-a", true, true), lease("node-a", time.Unix(1000, 0))), renew: true,
			events: []string{"Normal " + ReasonWaiting, "Warning " + ReasonNotLost, "Warning " + ReasonNotLost, "Warning " + ReasonNotLost, "Warning " + ReasonNotLost}},
		{name: "its Lease is not renewed: lost, its volumes released", objs: all(podvolNode("node-a", true, true)), released: true,
			events: []string{"Normal " + ReasonWaiting, "Warning " + ReasonLost, "Warning " + ReasonLost}},
		{name: "its Lease is never read: held", objs: all(podvolNode("node-a", true, true)), held: true,
			funcs: interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, o client.Object, opts ...client.GetOption) error {
				if _, ok := o.(*coordinationv1.Lease); ok {
					return errAPI
				}
				return c.Get(ctx, key, o, opts...)
			}}},
		{name: "lost, and a claim cannot be deleted: held, and told", objs: all(podvolNode("node-a", true, true)), held: true,
			err:    "delete PVC ns/data-1 of lost node node-a",
			events: []string{"Normal " + ReasonWaiting, "Warning " + ReasonLost, "Warning " + ReasonReleaseFailed},
			funcs: interceptor.Funcs{Delete: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.DeleteOption) error {
				if _, ok := o.(*corev1.PersistentVolumeClaim); ok {
					return apierrors.NewForbidden(gr, o.GetName(), errors.New("denied"))
				}
				return c.Delete(ctx, o, opts...)
			}}},
		{name: "lost, and the record cannot be written: nothing released", objs: all(podvolNode("node-a", true, true)), held: true,
			err:    "record the volumes released from node node-a",
			events: []string{"Normal " + ReasonWaiting, "Warning " + ReasonReleaseFailed},
			funcs: interceptor.Funcs{Create: func(context.Context, client.WithWatch, client.Object, ...client.CreateOption) error {
				return errAPI
			}}},
		{name: "lost, and its PVs cannot be listed: held", objs: all(podvolNode("node-a", true, true)), held: true,
			err:    "list PVs of node node-a",
			events: []string{"Normal " + ReasonWaiting, "Warning " + ReasonReleaseFailed},
			funcs: interceptor.Funcs{List: func(ctx context.Context, c client.WithWatch, l client.ObjectList, opts ...client.ListOption) error {
				if _, ok := l.(*corev1.PersistentVolumeList); ok {
					return errAPI
				}
				return c.List(ctx, l, opts...)
			}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.funcs, tc.objs...)
			var renew func()
			if tc.renew {
				renew = func() {
					l := &coordinationv1.Lease{}
					if err := e.c.Get(context.Background(), types.NamespacedName{Namespace: corev1.NamespaceNodeLease, Name: "node-a"}, l); err != nil {
						t.Fatal(err)
					}
					l.Spec.RenewTime = &metav1.MicroTime{Time: l.Spec.RenewTime.Add(10 * time.Second)}
					if err := e.c.Update(context.Background(), l); err != nil {
						t.Fatal(err)
					}
				}
			}
			limit := 5 * time.Second // a loaded machine's passes can be slow
			if tc.held && tc.err == "" {
				limit = 10 * e.r.grace()
			}
			res, err := e.passes("node-a", limit, renew)
			switch {
			case tc.err == "" && err != nil:
				t.Fatalf("Reconcile: %v", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("Reconcile: error %v, want one with %q", err, tc.err)
			}
			if tc.held != (res.RequeueAfter > 0 || err != nil) {
				t.Errorf("Reconcile: %+v, %v; want the node held: %v", res, err, tc.held)
			}
			evs := strings.Split(e.events(), ",")
			slices.Sort(evs)
			want := slices.Clone(tc.events)
			slices.Sort(want)
			if strings.Join(evs, ",") != strings.Join(want, ",") {
				t.Errorf("events %q, want %q", evs, want)
			}
			n := e.node("node-a")
			if held := n != nil && controllerutil.ContainsFinalizer(n, names.NodeLossFinalizer); held != tc.held {
				t.Errorf("node %+v, want it held: %v", n, tc.held)
			}
			for _, o := range kept {
				if !e.exists(o) {
					t.Errorf("%T %s released", o, o.GetName())
				}
			}
			for _, o := range released {
				if e.exists(o) == tc.released {
					t.Errorf("%T %s there: %v, want released: %v", o, o.GetName(), e.exists(o), tc.released)
				}
				// Nobody deletes a gone node's volume: its PV's
				// finalizers are dropped.
				if pv, ok := o.(*corev1.PersistentVolume); ok && tc.released {
					if err := e.c.Get(context.Background(), client.ObjectKeyFromObject(pv), &corev1.PersistentVolume{}); !apierrors.IsNotFound(err) {
						t.Errorf("PV %s: %v, want it gone", pv.Name, err)
					}
				}
			}
			recorded, err := e.r.releasedRecord(context.Background(), "node-a")
			if err != nil {
				t.Fatal(err)
			}
			if want := []string{"pv-data-1", "pv-data-5", "pv-data-6"}; tc.released && !slices.Equal(recorded, want) {
				t.Errorf("recorded %v, want %v", recorded, want)
			} else if !tc.released && len(recorded) > 0 && tc.err == "" {
				t.Errorf("recorded %v, want nothing", recorded)
			}
		})
	}
}

// A release that failed half-way is taken up again by the next pass, and
// records each volume once.
func TestReleaseResumes(t *testing.T) {
	data1, pv1 := volume("data-1", names.Driver, "node-a", "podvol")
	data2, pv2 := volume("data-2", names.Driver, "node-a", "podvol")
	fail := true
	e := newEnv(t, interceptor.Funcs{Delete: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.DeleteOption) error {
		if o.GetName() == "data-2" && fail {
			return errAPI
		}
		return c.Delete(ctx, o, opts...)
	}}, podvolNode("node-a", true, true), data1, pv1, data2, pv2)
	if _, err := e.passes("node-a", 5*time.Second, nil); err == nil {
		t.Fatal("Reconcile: no error, want the failed delete")
	}
	if e.exists(pv1) || !e.exists(data2) || !e.exists(pv2) {
		t.Fatalf("after the failure: pv-data-1 %v, data-2 %v, pv-data-2 %v; want the first released only", e.exists(pv1), e.exists(data2), e.exists(pv2))
	}
	fail = false
	// Passes, not one: a retry later than the poll's gap owes the kubelet
	// a lease duration again (a blind spot).
	if res, err := e.passes("node-a", 5*time.Second, nil); err != nil || !res.IsZero() {
		t.Fatalf("Reconcile again: %+v, %v", res, err)
	}
	if n := e.node("node-a"); e.exists(data2) || e.exists(pv2) || controllerutil.ContainsFinalizer(n, names.NodeLossFinalizer) {
		t.Errorf("after the retry: data-2 %v, pv-data-2 %v, node %v; want them released, the node let go", e.exists(data2), e.exists(pv2), n.Finalizers)
	}
	l := &corev1.ConfigMapList{}
	if err := e.c.List(context.Background(), l, client.InNamespace(recordNS)); err != nil {
		t.Fatal(err)
	}
	if len(l.Items) != 1 || len(l.Items[0].Data) != 2 {
		t.Errorf("records %+v, want one with the two PVs", l.Items)
	}
}

// RemoveFinalizers lets every Node go, and says so when something adds the
// finalizer back.
func TestRemoveFinalizers(t *testing.T) {
	objs := func() []client.Object {
		return []client.Object{podvolNode("node-a", true, false), podvolNode("node-b", true, true), podvolNode("node-c", false, false)}
	}
	t.Run("all removed", func(t *testing.T) {
		e := newEnv(t, interceptor.Funcs{}, objs()...)
		n, err := RemoveFinalizers(context.Background(), e.r.Client, 0)
		if err != nil || n != 2 {
			t.Fatalf("RemoveFinalizers: %d, %v; want 2", n, err)
		}
		for _, name := range []string{"node-a", "node-b", "node-c"} {
			if node := e.node(name); node == nil || controllerutil.ContainsFinalizer(node, names.NodeLossFinalizer) || !controllerutil.ContainsFinalizer(node, otherFinalizer) {
				t.Errorf("node %s: %+v", name, node)
			}
		}
	})
	t.Run("added back", func(t *testing.T) {
		// A podvol-controller still running adds it back at once.
		e := newEnv(t, interceptor.Funcs{Patch: func(context.Context, client.WithWatch, client.Object, client.Patch, ...client.PatchOption) error {
			return nil
		}}, objs()...)
		n, err := RemoveFinalizers(context.Background(), e.r.Client, 0)
		if !errors.Is(err, ErrStillAdded) || !strings.Contains(err.Error(), "[node-a node-b]") {
			t.Fatalf("RemoveFinalizers: %d, %v; want %v naming node-a and node-b", n, err, ErrStillAdded)
		}
	})
}

// The record of released volumes: one ConfigMap while it fits, more once it
// does not; each PV once; a node's long name; a name another node's record
// took; an older controller's unlabelled record.
func TestRecordReleased(t *testing.T) {
	pvs := func(node string, n int) []*corev1.PersistentVolume {
		var out []*corev1.PersistentVolume
		for i := range n {
			_, pv := volume(fmt.Sprintf("data-%d", i), names.Driver, node, "podvol")
			out = append(out, pv)
		}
		return out
	}
	long := strings.Repeat("n", 100)
	for _, tc := range []struct {
		name  string
		node  string
		objs  []client.Object
		pvs   int
		bytes int // RecordBytes
		cms   int // the node's ConfigMaps after
	}{
		{name: "one record", node: "node-a", pvs: 3, bytes: 1 << 10, cms: 1},
		// An entry is 78 bytes: two fit in 170.
		{name: "split when full", node: "node-a", pvs: 5, bytes: 170, cms: 3},
		{name: "an entry larger than a record gets one of its own", node: "node-a", pvs: 2, bytes: 10, cms: 2},
		{name: "a long node name", node: long, pvs: 3, bytes: 170, cms: 2},
		{name: "its first name is another node's overflow", node: "node-a-x1", pvs: 1, bytes: 1 << 10, cms: 1, objs: []client.Object{
			&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: recordNS, Name: ReleasedRecordName("node-a-x1"),
				Labels:      map[string]string{names.ReleasedLabel: "true", names.ReleasedNodeLabel: "node-a"},
				Annotations: map[string]string{names.ReleasedNodeAnnotation: "node-a"}}, Data: map[string]string{"pv-other": "x"}}}},
		{name: "an older controller's record, unlabelled", node: "node-a", pvs: 2, bytes: 1 << 10, cms: 1, objs: []client.Object{
			&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: recordNS, Name: ReleasedRecordName("node-a"),
				Labels:      map[string]string{names.ReleasedLabel: "true"},
				Annotations: map[string]string{names.ReleasedNodeAnnotation: "node-a"}}, Data: map[string]string{"pv-data-0": "volumeHandle=vol-data-0"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func(b int) { RecordBytes = b }(RecordBytes)
			RecordBytes = tc.bytes
			e := newEnv(t, interceptor.Funcs{}, tc.objs...)
			ctx := context.Background()
			for pass := range 2 { // the second pass adds nothing
				if err := e.r.recordReleased(ctx, tc.node, pvs(tc.node, tc.pvs)); err != nil {
					t.Fatalf("pass %d: %v", pass+1, err)
				}
				recs, err := e.r.records(ctx, tc.node)
				if err != nil {
					t.Fatal(err)
				}
				if len(recs) != tc.cms {
					t.Fatalf("pass %d: %d ConfigMaps, want %d", pass+1, len(recs), tc.cms)
				}
				for i, cm := range recs {
					if len(cm.Name) > 253 || cm.Labels[names.ReleasedNodeLabel] != ReleasedNodeLabelValue(tc.node) || cm.Annotations[names.ReleasedNodeAnnotation] != tc.node {
						t.Errorf("record %s: labels %v annotations %v", cm.Name, cm.Labels, cm.Annotations)
					}
					if i == 0 && cm.Name != ReleasedRecordName(tc.node) && len(tc.objs) == 0 {
						t.Errorf("first record %s, want %s", cm.Name, ReleasedRecordName(tc.node))
					}
					if len(cm.Data) > 1 && recordSize(cm.Data) > tc.bytes {
						t.Errorf("record %s holds %d bytes, more than %d", cm.Name, recordSize(cm.Data), tc.bytes)
					}
				}
				got, err := e.r.releasedRecord(ctx, tc.node)
				if err != nil {
					t.Fatal(err)
				}
				if len(got) != tc.pvs {
					t.Errorf("pass %d: recorded %v, want %d PVs", pass+1, got, tc.pvs)
				}
			}
			// Another node's record is left as it was.
			for _, o := range tc.objs {
				cm := &corev1.ConfigMap{}
				if err := e.c.Get(ctx, client.ObjectKeyFromObject(o), cm); err != nil {
					t.Fatal(err)
				}
				if o.GetAnnotations()[names.ReleasedNodeAnnotation] != tc.node && len(cm.Data) != 1 {
					t.Errorf("another node's record %s changed: %v", cm.Name, cm.Data)
				}
			}
		})
	}
}

// A release cut short (a failed delete, or a controller restarted between
// the record and the release), and then the node's kubelet is back: the
// rest of its volumes are kept, and the record must name only what was
// released. docs/operations.md has an admin give each recorded volume a new
// PV and delete it, which deletes its image: a volume whose PV and claim
// are still there must not be in the record.
func TestReleaseCutShort(t *testing.T) {
	data1, pv1 := volume("data-1", names.Driver, "node-a", "podvol")
	data2, pv2 := volume("data-2", names.Driver, "node-a", "podvol")
	fail := true
	e := newEnv(t, interceptor.Funcs{Delete: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.DeleteOption) error {
		if o.GetName() == "data-2" && fail {
			return errAPI
		}
		return c.Delete(ctx, o, opts...)
	}}, podvolNode("node-a", true, true), data1, pv1, data2, pv2)
	if _, err := e.passes("node-a", 5*time.Second, nil); err == nil {
		t.Fatal("Reconcile: no error, want the failed delete")
	}
	fail = false
	// The kubelet is back: it creates its Lease again.
	if err := e.c.Create(context.Background(), lease("node-a", time.Unix(1000, 0))); err != nil {
		t.Fatal(err)
	}
	if res, err := e.reconcile("node-a"); err != nil || !res.IsZero() {
		t.Fatalf("Reconcile: %+v, %v", res, err)
	}
	if e.exists(pv1) || !e.exists(data2) || !e.exists(pv2) {
		t.Fatalf("pv-data-1 %v, data-2 %v, pv-data-2 %v; want the first released, the second kept", e.exists(pv1), e.exists(data2), e.exists(pv2))
	}
	got, err := e.r.releasedRecord(context.Background(), "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"pv-data-1"}; !slices.Equal(got, want) {
		t.Errorf("recorded as released %v, want %v: pv-data-2 and its claim are still there", got, want)
	}
}

// The gauge counts the recorded volumes of the nodes that are back and run
// podvol, and forgets a node whose record went or that went again.
func TestUpdateGauge(t *testing.T) {
	record := func(node string, pvs ...string) *corev1.ConfigMap {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: recordNS, Name: ReleasedRecordName(node),
			Labels:      map[string]string{names.ReleasedLabel: "true", names.ReleasedNodeLabel: ReleasedNodeLabelValue(node)},
			Annotations: map[string]string{names.ReleasedNodeAnnotation: node}}, Data: map[string]string{}}
		for _, pv := range pvs {
			cm.Data[pv] = "volumeHandle=" + pv
		}
		return cm
	}
	split := record("g-back", "pv-3")
	split.Name += "-x1y2z"
	e := newEnv(t, interceptor.Funcs{},
		podvolNode("g-back", true, false), csiNode("g-back", names.Driver), record("g-back", "pv-1", "pv-2"), split,
		podvolNode("g-nopodvol", false, false), record("g-nopodvol", "pv-4"),
		podvolNode("g-deleting", true, true), csiNode("g-deleting", names.Driver), record("g-deleting", "pv-5"),
		record("g-away", "pv-6"))
	ctx := context.Background()
	values := func() map[string]float64 {
		got := map[string]float64{}
		ch := make(chan prometheus.Metric, 100)
		releasedOnNode.Collect(ch)
		close(ch)
		for m := range ch {
			d := &dto.Metric{}
			if err := m.Write(d); err != nil {
				t.Fatal(err)
			}
			if n := d.GetLabel()[0].GetValue(); strings.HasPrefix(n, "g-") {
				got[n] = d.GetGauge().GetValue()
			}
		}
		return got
	}
	if err := e.r.updateGauge(ctx); err != nil {
		t.Fatal(err)
	}
	if got := values(); len(got) != 1 || got["g-back"] != 3 {
		t.Errorf("gauge %v, want g-back=3 only", got)
	}
	// The admin deleted the records once dealt with.
	for _, cm := range []*corev1.ConfigMap{record("g-back"), split} {
		if err := e.c.Delete(ctx, cm); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.r.updateGauge(ctx); err != nil {
		t.Fatal(err)
	}
	if got := values(); len(got) != 0 {
		t.Errorf("gauge %v after the records went, want none", got)
	}
}

// brief cuts an error to fit an event, on a character boundary.
func TestBrief(t *testing.T) {
	for _, tc := range []struct {
		msg  string
		want int // length
	}{
		{"short", 5},
		{strings.Repeat("x", 700), 700},
		{strings.Repeat("x", 701), 703},
		{strings.Repeat("x", 699) + "é" + "tail", 702}, // é cut in half: dropped
	} {
		got := brief(errors.New(tc.msg))
		if len(got) != tc.want || !utf8.ValidString(got) {
			t.Errorf("brief(%d bytes) = %d bytes (valid UTF-8: %v), want %d", len(tc.msg), len(got), utf8.ValidString(got), tc.want)
		}
	}
}
