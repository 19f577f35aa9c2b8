package controller

// node-loss (issue 11, item 2): a deleted Node's volumes are released only
// when the node is really gone, i.e. its kubelet has stopped renewing its
// Lease in kube-node-lease; the finalizer is kept only on Nodes that run
// podvol.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/podvol/podvol/internal/controller/nodeloss"
	"github.com/podvol/podvol/internal/names"
)

// startNodeLoss runs an API server and node-loss alone, configured by
// configure; stop stops the controller (the API server runs on).
func startNodeLoss(t *testing.T, configure func(*nodeloss.Reconciler)) (e *env, stop func()) {
	shared(t)
	mgr, err := ctrl.NewManager(api.Config, manager.Options{Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Controller: config.Controller{SkipNameValidation: ptr.To(true)}})
	if err != nil {
		t.Fatal(err)
	}
	rec := mgr.GetEventRecorder("podvol-controller")
	r := &nodeloss.Reconciler{Client: mgr.GetClient(), Recorder: rec, Driver: "podvol.io"}
	if configure != nil {
		configure(r)
	}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(bg)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := mgr.Start(ctx); err != nil {
			t.Errorf("manager: %v", err)
		}
	}()
	stop = sync.OnceFunc(func() { cancel(); <-done })
	t.Cleanup(stop)
	c, err := client.NewWithWatch(api.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, c: c, rec: rec}, stop
}

// node creates a Node and, if drivers are given, its CSINode listing them,
// as the kubelet does once the drivers' node plugins have registered.
func (e *env) node(name string, drivers ...string) *corev1.Node {
	e.t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	e.must(e.c.Create(bg, n))
	if len(drivers) > 0 {
		cn := &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: name}}
		for _, d := range drivers {
			cn.Spec.Drivers = append(cn.Spec.Drivers, storagev1.CSINodeDriver{Name: d, NodeID: name})
		}
		e.must(e.c.Create(bg, cn))
	}
	return n
}

// finalizers returns the Node's finalizers, or nil and false once it is gone.
func (e *env) finalizers(name string) ([]string, bool) {
	e.t.Helper()
	n := &corev1.Node{}
	if err := e.c.Get(bg, client.ObjectKey{Name: name}, n); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, false
		}
		e.t.Fatal(err)
	}
	return n.Finalizers, true
}

func (e *env) held(name string) bool {
	e.t.Helper()
	f, _ := e.finalizers(name)
	for _, x := range f {
		if x == names.NodeLossFinalizer {
			return true
		}
	}
	return false
}

func (e *env) gone(name string) bool {
	_, ok := e.finalizers(name)
	return !ok
}

// lease creates the node's Lease in kube-node-lease as the kubelet does
// (owned by the Node, 40 s duration) with the given renewTime.
func (e *env) lease(node *corev1.Node, renewed time.Time) {
	e.t.Helper()
	e.leaseOf(node, renewed, 40*time.Second)
}

// leaseOf creates the node's Lease with the given duration, as a kubelet
// with that nodeLeaseDurationSeconds does.
func (e *env) leaseOf(node *corev1.Node, renewed time.Time, duration time.Duration) {
	e.t.Helper()
	// kube-apiserver creates kube-node-lease shortly after it starts.
	if err := e.c.Create(bg, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: corev1.NamespaceNodeLease}}); err != nil && !apierrors.IsAlreadyExists(err) {
		e.t.Fatal(err)
	}
	e.must(e.c.Create(bg, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: corev1.NamespaceNodeLease, Name: node.Name,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node.Name), LeaseDurationSeconds: ptr.To(int32(duration / time.Second)),
			RenewTime: &metav1.MicroTime{Time: renewed}},
	}))
}

// renew renews the node's Lease every interval, as a live kubelet does
// (every 10 s by default), until the test ends.
func (e *env) renew(node string, interval time.Duration) {
	ctx, cancel := context.WithCancel(bg)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			l := &coordinationv1.Lease{}
			if err := e.c.Get(ctx, client.ObjectKey{Namespace: corev1.NamespaceNodeLease, Name: node}, l); err == nil {
				l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
				_ = e.c.Update(ctx, l) // a conflict is retried at the next tick
			}
			select {
			case <-ctx.Done():
			case <-time.After(interval):
			}
		}
	}()
	e.t.Cleanup(func() { cancel(); wg.Wait() })
}

func (e *env) pvExists(name string) bool {
	e.t.Helper()
	err := e.c.Get(bg, client.ObjectKey{Name: name}, &corev1.PersistentVolume{})
	if err != nil && !apierrors.IsNotFound(err) {
		e.t.Fatal(err)
	}
	return err == nil
}

// A `kubectl delete node` of a healthy node (its kubelet keeps renewing its
// Lease) is not a lost node: nothing is released, the Node goes, and events
// on the Node and on the claim say why.
func TestNodeLossDeletedButAlive(t *testing.T) {
	e := start(t, "node-loss")
	ns := e.ns("alive")
	e.must(e.c.Create(bg, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "podvol"}, Provisioner: "podvol.io"}))
	n := e.node("n1", "podvol.io")
	e.eventually("the node's finalizer", func() bool { return e.held("n1") })
	e.lease(n, time.Now())
	e.renew("n1", 300*time.Millisecond)
	e.boundOn(ns, "data-db-0", "podvol", "n1")

	e.must(e.c.Delete(bg, n))
	e.eventually("the deleted Node gone", func() bool {
		if e.pvc(ns, "data-db-0") == nil || !e.pvExists("pv-data-db-0") {
			t.Fatal("a live node's PVC or PV was released")
		}
		return e.gone("n1")
	})
	p := e.pvc(ns, "data-db-0")
	if p == nil || p.DeletionTimestamp != nil || !e.pvExists("pv-data-db-0") {
		t.Fatalf("a live node's volume was released: PVC %+v", p)
	}
	e.eventually("events on the Node and on the claim saying why", func() bool {
		return strings.Contains(e.events(metav1.NamespaceDefault, "n1"), "NodeNotLost") &&
			strings.Contains(e.events(ns, "data-db-0"), "NodeNotLost")
	})
	t.Logf("Node events:\n%s\nclaim events:\n%s", e.events(metav1.NamespaceDefault, "n1"), e.events(ns, "data-db-0"))
	if ev := e.events(ns, "data-db-0"); strings.Contains(ev, "NodeLost:") {
		t.Fatalf("the claim was told its node was lost: %s", ev)
	}
}

// Only Nodes whose CSINode lists podvol get the finalizer, and lose it when
// podvol goes away from them.
func TestNodeLossFinalizerOnlyOnPodvolNodes(t *testing.T) {
	e := start(t, "node-loss")
	e.node("plain")
	e.node("other", "other.csi.example.com")
	e.node("pv", "other.csi.example.com", "podvol.io")
	e.eventually("the podvol node's finalizer", func() bool { return e.held("pv") })
	e.never("a finalizer on a node without podvol", func() bool { return e.held("plain") || e.held("other") })

	// A node without podvol is not held when deleted.
	e.must(e.c.Delete(bg, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "other"}}))
	if !e.gone("other") {
		t.Fatal("a node without podvol was held when deleted")
	}

	// podvol's node plugin registers on "plain": the finalizer comes, and
	// one already there stays.
	plain := &corev1.Node{}
	e.must(e.c.Get(bg, client.ObjectKey{Name: "plain"}, plain))
	plain.Finalizers = append(plain.Finalizers, "example.com/keep")
	e.must(e.c.Update(bg, plain))
	e.must(e.c.Create(bg, &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: "plain"},
		Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{Name: "podvol.io", NodeID: "plain"}}}}))
	e.eventually("the finalizer once podvol runs on the node", func() bool { return e.held("plain") })

	// podvol is removed from "pv" (the kubelet drops the driver from its
	// CSINode): the finalizer goes, another one stays.
	n := &corev1.Node{}
	e.must(e.c.Get(bg, client.ObjectKey{Name: "pv"}, n))
	n.Finalizers = append(n.Finalizers, "example.com/keep")
	e.must(e.c.Update(bg, n))
	cn := &storagev1.CSINode{}
	e.must(e.c.Get(bg, client.ObjectKey{Name: "pv"}, cn))
	cn.Spec.Drivers = cn.Spec.Drivers[:1]
	e.must(e.c.Update(bg, cn))
	e.eventually("the finalizer removed with podvol", func() bool { return !e.held("pv") })
	if f, _ := e.finalizers("pv"); len(f) != 1 || f[0] != "example.com/keep" {
		t.Fatalf("finalizers of the node podvol left: %v", f)
	}
	// And a CSINode deleted altogether.
	e.must(e.c.Delete(bg, &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: "plain"}}))
	e.eventually("the finalizer removed with the CSINode", func() bool { return !e.held("plain") })
	if f, _ := e.finalizers("plain"); len(f) != 1 || f[0] != "example.com/keep" {
		t.Fatalf("finalizers of the node podvol left: %v", f)
	}
}

// A Node deleted whose kubelet has stopped renewing its Lease: once the
// Lease has gone unrenewed for the grace period, or for the Lease's own
// duration when that is longer (issue 25, item 5), and not before, its
// volumes are released as before.
func TestNodeLossStaleLease(t *testing.T) {
	const (
		grace         = 2 * time.Second
		leaseDuration = 4 * time.Second
		wait          = leaseDuration // max(grace, leaseDuration)
	)
	e, _ := startNodeLoss(t, func(r *nodeloss.Reconciler) { r.Grace = grace })
	ns := e.ns("stale-lease")
	e.must(e.c.Create(bg, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "podvol"}, Provisioner: "podvol.io"}))
	n := e.node("n1", "podvol.io")
	e.eventually("the node's finalizer", func() bool { return e.held("n1") })
	// Last renewed a minute ago: the kubelet died then.
	e.leaseOf(n, time.Now().Add(-time.Minute), leaseDuration)
	e.boundOn(ns, "data-db-0", "podvol", "n1")
	e.boundOn(ns, "data-db-1", "podvol", "n2")

	deleted := time.Now()
	e.must(e.c.Delete(bg, n))
	for time.Since(deleted) < wait*3/4 {
		if e.pvc(ns, "data-db-0") == nil || !e.pvExists("pv-data-db-0") || e.gone("n1") {
			t.Fatalf("released %s after the deletion, before the %s grace or the Lease's %s duration", time.Since(deleted), grace, leaseDuration)
		}
		time.Sleep(100 * time.Millisecond)
	}
	e.eventually("the lost node's PVC and PV released", func() bool {
		return e.pvc(ns, "data-db-0") == nil && !e.pvExists("pv-data-db-0")
	})
	if took := time.Since(deleted); took < wait {
		t.Fatalf("released %s after the deletion, before the %s grace or the Lease's %s duration", took, grace, leaseDuration)
	}
	e.eventually("the node gone", func() bool { return e.gone("n1") })
	if e.pvc(ns, "data-db-1") == nil || !e.pvExists("pv-data-db-1") {
		t.Fatal("another node's volume was released")
	}
	e.eventually("the events", func() bool {
		return strings.Contains(e.events(ns, "data-db-0"), "NodeLost: node n1 was deleted and its kubelet has not renewed its Lease") &&
			strings.Contains(e.events(metav1.NamespaceDefault, "n1"), nodeloss.ReasonWaiting)
	})
}

// A live kubelet whose Lease was deleted (a foreground deletion of the Node
// deletes it) creates it again: a Lease that appears is a renewal.
func TestNodeLossLeaseCreatedAgain(t *testing.T) {
	e, _ := startNodeLoss(t, func(r *nodeloss.Reconciler) { r.Grace = 5 * time.Second })
	ns := e.ns("lease-again")
	e.must(e.c.Create(bg, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "podvol"}, Provisioner: "podvol.io"}))
	n := e.node("n1", "podvol.io")
	e.eventually("the node's finalizer", func() bool { return e.held("n1") })
	e.boundOn(ns, "data-db-0", "podvol", "n1")
	e.must(e.c.Delete(bg, n))
	e.eventually("the controller watching the Lease", func() bool {
		return strings.Contains(e.events(metav1.NamespaceDefault, "n1"), nodeloss.ReasonWaiting)
	})
	e.lease(n, time.Now())
	e.eventually("the deleted Node gone", func() bool { return e.gone("n1") })
	if e.pvc(ns, "data-db-0") == nil || !e.pvExists("pv-data-db-0") {
		t.Fatal("a live node's volume was released")
	}
}

// Uninstall: --remove-finalizers removes the finalizer from every Node,
// deleted ones included (which then go without a release), and no other
// finalizer; it fails, naming them, while node-loss still runs and adds them
// back.
func TestNodeLossRemoveFinalizers(t *testing.T) {
	e, stop := startNodeLoss(t, nil)
	ns := e.ns("uninstall")
	e.must(e.c.Create(bg, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "podvol"}, Provisioner: "podvol.io"}))
	for _, name := range []string{"a", "b", "c"} {
		e.node(name, "podvol.io")
		e.eventually("the finalizer of "+name, func() bool { return e.held(name) })
	}
	b := &corev1.Node{}
	e.must(e.c.Get(bg, client.ObjectKey{Name: "b"}, b))
	b.Finalizers = append(b.Finalizers, "example.com/keep")
	e.must(e.c.Update(bg, b))
	// "c" is being deleted, waiting for the grace.
	e.boundOn(ns, "data-db-0", "podvol", "c")
	e.must(e.c.Delete(bg, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "c"}}))

	_, err := nodeloss.RemoveFinalizers(bg, e.c, 2*time.Second)
	if !errors.Is(err, nodeloss.ErrStillAdded) || !strings.Contains(err.Error(), "[a b]") {
		t.Fatalf("with node-loss running: %v", err)
	}
	t.Logf("with node-loss running: %v", err)

	stop()
	n, err := nodeloss.RemoveFinalizers(bg, e.c, time.Second)
	if err != nil || n != 2 {
		t.Fatalf("removed from %d nodes: %v", n, err)
	}
	for _, name := range []string{"a", "b"} {
		if e.held(name) {
			t.Fatalf("node %s still has the finalizer", name)
		}
	}
	if f, _ := e.finalizers("b"); len(f) != 1 || f[0] != "example.com/keep" {
		t.Fatalf("finalizers of b: %v", f)
	}
	if !e.gone("c") {
		t.Fatal("the deleted node is still there")
	}
	if e.pvc(ns, "data-db-0") == nil || !e.pvExists("pv-data-db-0") {
		t.Fatal("the uninstall released a volume")
	}
	if n, err := nodeloss.RemoveFinalizers(bg, e.c, 0); err != nil || n != 0 {
		t.Fatalf("again: removed from %d nodes: %v", n, err)
	}
}

// The volumes released from a lost node are written down (in podvol's
// namespace) before they are released; when the node comes back, an event on
// it and the metric podvol_node_loss_released_volumes say its pool may still
// hold their images, until the admin deletes the record.
func TestNodeLossRecordsReleasedVolumes(t *testing.T) {
	nodeloss.RecordsResync = 200 * time.Millisecond
	e, _ := startNodeLoss(t, func(r *nodeloss.Reconciler) {
		r.Grace, r.LeaseDuration, r.Namespace = time.Second, time.Second, "podvol-system"
	})
	e.ns("podvol-system")
	ns := e.ns("records")
	e.must(e.c.Create(bg, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "podvol"}, Provisioner: "podvol.io"}))
	n := e.node("n1", "podvol.io")
	e.eventually("the node's finalizer", func() bool { return e.held("n1") })
	e.boundOn(ns, "data-db-0", "podvol", "n1")
	e.boundOn(ns, "data-db-1", "podvol", "n1")
	e.must(e.c.Delete(bg, n))
	e.eventually("the lost node's volumes released", func() bool { return !e.pvExists("pv-data-db-0") && !e.pvExists("pv-data-db-1") && e.gone("n1") })

	cm := &corev1.ConfigMap{}
	e.must(e.c.Get(bg, client.ObjectKey{Namespace: "podvol-system", Name: nodeloss.ReleasedRecordName("n1")}, cm))
	if len(cm.Data) != 2 || !strings.Contains(cm.Data["pv-data-db-0"], "volumeHandle=pv-data-db-0 claim="+ns+"/data-db-0") {
		t.Fatalf("record of the released volumes: %v", cm.Data)
	}
	// The size too: the image stays in the node's pool, allocated, and
	// kubectl podvol counts it there once the node is back.
	if !strings.Contains(cm.Data["pv-data-db-0"], fmt.Sprintf(" size=%d", 1<<30)) {
		t.Fatalf("record of pv-data-db-0 (1Gi) names no size: %q", cm.Data["pv-data-db-0"])
	}
	if v, ok := releasedGauge(t, "n1"); ok {
		t.Fatalf("podvol_node_loss_released_volumes{node=n1} = %v while the node is gone", v)
	}

	// The node comes back (its kubelet registers the Node again, podvol's
	// plugin its CSINode).
	e.must(e.c.Delete(bg, &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}))
	e.eventually("the old CSINode gone", func() bool {
		return apierrors.IsNotFound(e.c.Get(bg, client.ObjectKey{Name: "n1"}, &storagev1.CSINode{}))
	})
	e.node("n1", "podvol.io")
	e.eventually("an event on the node that is back", func() bool {
		return strings.Contains(e.events(metav1.NamespaceDefault, "n1"), nodeloss.ReasonReleasedVolumes+": 2 volume(s) were released while this node was lost (PVs pv-data-db-0, pv-data-db-1)")
	})
	e.eventually("the metric counting them", func() bool { v, ok := releasedGauge(t, "n1"); return ok && v == 2 })

	// Reclaimed: the admin deletes the record.
	e.must(e.c.Delete(bg, cm))
	e.eventually("the metric gone with the record", func() bool { _, ok := releasedGauge(t, "n1"); return !ok })
}

func releasedGauge(t *testing.T, node string) (float64, bool) {
	t.Helper()
	mfs, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "podvol_node_loss_released_volumes" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "node" && l.GetValue() == node {
					return m.GetGauge().GetValue(), true
				}
			}
		}
	}
	return 0, false
}

// records returns the entries of every ConfigMap in ns that records the
// volumes released from node, and how many ConfigMaps hold them.
func (e *env) records(ns, node string) (map[string]string, int) {
	e.t.Helper()
	l := &corev1.ConfigMapList{}
	e.must(e.c.List(bg, l, client.InNamespace(ns), client.MatchingLabels{names.ReleasedLabel: "true"}))
	all, n := map[string]string{}, 0
	for _, cm := range l.Items {
		if cm.Annotations[names.ReleasedNodeAnnotation] != node {
			continue
		}
		n++
		for k, v := range cm.Data {
			if _, dup := all[k]; dup {
				e.t.Fatalf("PV %s recorded twice for node %s", k, node)
			}
			all[k] = v
		}
	}
	return all, n
}

// A node lost again whose record of earlier releases is near the API's
// 1 MiB object limit (issue 25, item 6: a few thousand released PVs, never
// trimmed): today's release is written down all the same, beside it, and the
// node goes; the node that comes back is told of every one of them.
func TestNodeLossRecordNearTheLimit(t *testing.T) {
	nodeloss.RecordsResync = 200 * time.Millisecond
	e, _ := startNodeLoss(t, func(r *nodeloss.Reconciler) {
		r.Grace, r.LeaseDuration, r.Namespace = time.Second, time.Second, "podvol-system"
	})
	e.ns("podvol-system")
	ns := e.ns("near-limit")
	e.must(e.c.Create(bg, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "podvol"}, Provisioner: "podvol.io"}))
	n := e.node("n1", "podvol.io")
	e.eventually("the node's finalizer", func() bool { return e.held("n1") })

	// The record earlier losses of n1 left, as node-loss writes it:
	// 2,621 entries whose values of 400 bytes come to 160 bytes short of
	// 1 MiB, the most the API takes (it counts a ConfigMap's values).
	old := map[string]string{}
	size := 0
	for i := 0; size+400 <= 1<<20-160; i++ {
		k := fmt.Sprintf("pv-old-%05d", i)
		v := fmt.Sprintf("volumeHandle=%s claim=tenant/data-%05d released=2026-11-01T00:00:00Z", k, i)
		v += " " + strings.Repeat("x", 400-len(v)-1)
		old[k] = v
		size += len(v)
	}
	e.must(e.c.Create(bg, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "podvol-system", Name: nodeloss.ReleasedRecordName("n1"),
		Labels:      map[string]string{names.ReleasedLabel: "true", "app.kubernetes.io/managed-by": "podvol-controller"},
		Annotations: map[string]string{names.ReleasedNodeAnnotation: "n1"}}, Data: old}))
	t.Logf("record of earlier losses: %d entries, %d bytes", len(old), size)

	for i := range 3 {
		e.boundOn(ns, fmt.Sprintf("data-db-%d", i), "podvol", "n1")
	}
	e.must(e.c.Delete(bg, n))
	e.eventually("the lost node's volumes released and the node gone", func() bool {
		return !e.pvExists("pv-data-db-0") && !e.pvExists("pv-data-db-1") && !e.pvExists("pv-data-db-2") && e.gone("n1")
	})
	all, shards := e.records("podvol-system", "n1")
	for i := range 3 {
		if v := all[fmt.Sprintf("pv-data-db-%d", i)]; !strings.Contains(v, fmt.Sprintf("volumeHandle=pv-data-db-%d claim=%s/data-db-%d", i, ns, i)) {
			t.Fatalf("pv-data-db-%d recorded as %q", i, v)
		}
	}
	if want := len(old) + 3; len(all) != want {
		t.Fatalf("%d entries recorded for n1, want %d", len(all), want)
	}
	t.Logf("%d entries in %d ConfigMaps", len(all), shards)

	// The node comes back: one event and the metric count every record.
	e.must(e.c.Delete(bg, &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}))
	e.eventually("the old CSINode gone", func() bool {
		return apierrors.IsNotFound(e.c.Get(bg, client.ObjectKey{Name: "n1"}, &storagev1.CSINode{}))
	})
	e.node("n1", "podvol.io")
	want := fmt.Sprintf("%s: %d volume(s) were released while this node was lost", nodeloss.ReasonReleasedVolumes, len(old)+3)
	e.eventually("an event on the node that is back", func() bool { return strings.Contains(e.events(metav1.NamespaceDefault, "n1"), want) })
	t.Logf("event: %s", e.events(metav1.NamespaceDefault, "n1"))
	e.eventually("the metric counting them", func() bool { v, ok := releasedGauge(t, "n1"); return ok && int(v) == len(old)+3 })
}

// One release too large for one record (a small budget here; the API's
// limit is 1 MiB) is spread over several, and nothing is lost.
func TestNodeLossRecordSpreads(t *testing.T) {
	was := nodeloss.RecordBytes
	nodeloss.RecordBytes = 1024
	t.Cleanup(func() { nodeloss.RecordBytes = was })
	e, _ := startNodeLoss(t, func(r *nodeloss.Reconciler) {
		r.Grace, r.LeaseDuration, r.Namespace = time.Second, time.Second, "podvol-system"
	})
	e.ns("podvol-system")
	ns := e.ns("spread")
	e.must(e.c.Create(bg, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "podvol"}, Provisioner: "podvol.io"}))
	n := e.node("n1", "podvol.io")
	e.eventually("the node's finalizer", func() bool { return e.held("n1") })
	const pvs = 30
	for i := range pvs {
		e.boundOn(ns, fmt.Sprintf("data-db-%d", i), "podvol", "n1")
	}
	e.must(e.c.Delete(bg, n))
	e.eventually("the lost node's volumes released and the node gone", func() bool { return e.gone("n1") })
	all, shards := e.records("podvol-system", "n1")
	if len(all) != pvs || shards < 3 {
		t.Fatalf("%d entries in %d ConfigMaps, want %d in 3 or more", len(all), shards, pvs)
	}
	t.Logf("%d entries in %d ConfigMaps of at most %d bytes", len(all), shards, nodeloss.RecordBytes)
}

// A record that cannot be written (here: podvol's namespace does not exist)
// holds the release back, and says so on the Node, not only in a log line;
// once it can be written, the release goes on.
func TestNodeLossRecordFailureIsVisible(t *testing.T) {
	e, _ := startNodeLoss(t, func(r *nodeloss.Reconciler) {
		r.Grace, r.LeaseDuration, r.Namespace = time.Second, time.Second, "podvol-records-missing"
	})
	ns := e.ns("record-failure")
	e.must(e.c.Create(bg, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "podvol"}, Provisioner: "podvol.io"}))
	n := e.node("n1", "podvol.io")
	e.eventually("the node's finalizer", func() bool { return e.held("n1") })
	e.boundOn(ns, "data-db-0", "podvol", "n1")
	e.must(e.c.Delete(bg, n))
	e.eventually("a Warning event on the Node", func() bool {
		return strings.Contains(e.events(metav1.NamespaceDefault, "n1"), nodeloss.ReasonReleaseFailed+": ")
	})
	t.Logf("event: %s", e.events(metav1.NamespaceDefault, "n1"))
	if !e.pvExists("pv-data-db-0") || e.gone("n1") {
		t.Fatal("released without a record")
	}
	e.ns("podvol-records-missing")
	e.eventually("the release once the record can be written", func() bool { return !e.pvExists("pv-data-db-0") && e.gone("n1") })
}

// A static PV of no class (storageClassName "") on a lost node is released
// as any other: it has no class to opt out with. The real client refuses a
// Get of an empty name, so the class is not looked up.
func TestNodeLossClasslessVolume(t *testing.T) {
	e, _ := startNodeLoss(t, func(r *nodeloss.Reconciler) { r.Grace, r.LeaseDuration = time.Second, time.Second })
	ns := e.ns("classless")
	e.must(e.c.Create(bg, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "podvol"}, Provisioner: "podvol.io"}))
	n := e.node("n1", "podvol.io")
	e.eventually("the node's finalizer", func() bool { return e.held("n1") })
	e.boundOn(ns, "static", "", "n1")
	e.boundOn(ns, "dynamic", "podvol", "n1")
	e.must(e.c.Delete(bg, n))
	e.eventually("the lost node's volumes released", func() bool {
		return e.pvc(ns, "static") == nil && !e.pvExists("pv-static") && e.pvc(ns, "dynamic") == nil && !e.pvExists("pv-dynamic")
	})
	e.eventually("the node gone", func() bool { return e.gone("n1") })
}
