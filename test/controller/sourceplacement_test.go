package controller

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/podvol/podvol/internal/controller/sourceplacement"
	"github.com/podvol/podvol/internal/names"
)

// placementBackoff is source-placement's Backoff in these tests: long
// enough to see that nothing happens before it ends.
const placementBackoff = 5 * time.Second

// placementWait is source-placement's Wait in these tests.
const placementWait = 500 * time.Millisecond

// placementClasses creates podvol's WaitForFirstConsumer class "podvol", an
// Immediate podvol class and another driver's WaitForFirstConsumer class.
func (e *env) placementClasses() {
	e.t.Helper()
	for name, c := range map[string]struct {
		prov string
		mode storagev1.VolumeBindingMode
	}{
		"podvol":     {"podvol.io", storagev1.VolumeBindingWaitForFirstConsumer},
		"podvol-now": {"podvol.io", storagev1.VolumeBindingImmediate},
		"other":      {"other.csi", storagev1.VolumeBindingWaitForFirstConsumer},
	} {
		e.must(e.c.Create(bg, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: c.prov, VolumeBindingMode: ptr.To(c.mode)}))
	}
}

// sourceOn creates a PVC bound (both ways) to a PV of driver on node.
func (e *env) sourceOn(ns, name, driver, node string) {
	e.t.Helper()
	s := spec.DeepCopy()
	s.VolumeName = "pv-" + ns + "-" + name
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: *s}
	e.must(e.c.Create(bg, pvc))
	e.pvFor(pvc, driver, node)
}

func (e *env) pvFor(pvc *corev1.PersistentVolumeClaim, driver, node string) {
	e.t.Helper()
	e.must(e.c.Create(bg, &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv-" + pvc.Namespace + "-" + pvc.Name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:               corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:            []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName:       "podvol",
			ClaimRef:               &corev1.ObjectReference{Namespace: pvc.Namespace, Name: pvc.Name, UID: pvc.UID},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: "pv-" + pvc.Name}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: names.TopologyKey, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}},
		},
	}))
}

// fromClaim and fromSnapshot are data sources.
func fromClaim(name string) *corev1.TypedObjectReference {
	return &corev1.TypedObjectReference{Kind: "PersistentVolumeClaim", Name: name}
}

func fromSnapshot(name string) *corev1.TypedObjectReference {
	return &corev1.TypedObjectReference{APIGroup: ptr.To("snapshot.storage.k8s.io"), Kind: "VolumeSnapshot", Name: name}
}

// restore creates an unbound claim of class made from src, with the given
// annotations.
func (e *env) restore(ns, name, class string, src *corev1.TypedObjectReference, ann map[string]string, owners ...metav1.OwnerReference) {
	e.t.Helper()
	s := spec.DeepCopy()
	s.StorageClassName = ptr.To(class)
	s.DataSourceRef = src
	e.must(e.c.Create(bg, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: ann, OwnerReferences: owners}, Spec: *s}))
}

// use creates a pod, use-<claim>, that uses the claim: source-placement
// places only claims that a pod uses.
func (e *env) use(ns string, claims ...string) {
	e.t.Helper()
	for _, c := range claims {
		e.must(e.c.Create(bg, podWith(ns, "use-"+c, claimVol(c))))
	}
}

func (e *env) ann(ns, name, key string) string {
	e.t.Helper()
	p := e.pvc(ns, name)
	if p == nil {
		e.t.Fatalf("PVC %s/%s is gone", ns, name)
	}
	return p.Annotations[key]
}

func (e *env) placedOn(ns, name, node string) bool {
	return e.ann(ns, name, names.SelectedNode) == node && e.ann(ns, name, names.SourceNode) == node
}

func (e *env) untouched(ns, name string) bool {
	return e.ann(ns, name, names.SelectedNode) == "" && e.ann(ns, name, names.SourceNode) == ""
}

// snapshot creates VolumeSnapshot ns/name and, if content is not "", its
// content, of driver, with a handle in its status (dynamic) or, if
// imported, in its spec (pre-provisioned), and binds the two.
func (e *env) snapshot(ns, name, content, driver, handle string, imported bool) {
	e.t.Helper()
	vs := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{
		"volumeSnapshotClassName": "podvol", "source": map[string]any{"persistentVolumeClaimName": "golden"}}}}
	vs.SetGroupVersionKind(sourceplacement.SnapshotGVK)
	vs.SetNamespace(ns)
	vs.SetName(name)
	e.must(e.c.Create(bg, vs))
	if content != "" {
		e.bindSnapshot(ns, name, content, driver, handle, imported)
	}
}

func (e *env) bindSnapshot(ns, name, content, driver, handle string, imported bool) {
	e.t.Helper()
	vs := &unstructured.Unstructured{}
	vs.SetGroupVersionKind(sourceplacement.SnapshotGVK)
	e.must(e.c.Get(bg, client.ObjectKey{Namespace: ns, Name: name}, vs))
	src := map[string]any{"volumeHandle": "pv-golden"}
	if imported {
		src = map[string]any{"snapshotHandle": handle}
	}
	c := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{
		"driver": driver, "deletionPolicy": "Delete", "source": src,
		"volumeSnapshotRef": map[string]any{"namespace": ns, "name": name, "uid": string(vs.GetUID())},
	}}}
	c.SetGroupVersionKind(sourceplacement.ContentGVK)
	c.SetName(content)
	e.must(e.c.Create(bg, c))
	if !imported {
		e.must(unstructured.SetNestedField(c.Object, handle, "status", "snapshotHandle"))
		e.must(e.c.Status().Update(bg, c))
	}
	e.must(unstructured.SetNestedField(vs.Object, content, "status", "boundVolumeSnapshotContentName"))
	e.must(e.c.Status().Update(bg, vs))
}

// A clone is provisioned on the node of its source's PV: the claim gets
// that node as its selected node (and podvol's mark), with an event, on its
// pod too when it is a generic ephemeral volume; a node the scheduler chose
// first is replaced; a clone of a claim not bound yet is placed once it is.
func TestSourcePlacementClone(t *testing.T) {
	e := start(t, "source-placement")
	ns := e.ns("placement-clone")
	e.placementClasses()
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		e.node(n)
	}
	e.sourceOn(ns, "golden", "podvol.io", "node-a")

	e.restore(ns, "copy", "podvol", fromClaim("golden"), nil)
	e.use(ns, "copy")
	e.eventually("the clone placed on node-a", func() bool { return e.placedOn(ns, "copy", "node-a") })
	e.eventually("the PlacedWithSource event", func() bool {
		return strings.Contains(e.events(ns, "copy"), sourceplacement.ReasonPlaced+": provisioned on node node-a, which holds its data source PersistentVolumeClaim/golden")
	})

	// The scheduler got there first (its selected node says that a pod
	// uses the claim: no pod is needed here).
	e.restore(ns, "late", "podvol", fromClaim("golden"), map[string]string{names.SelectedNode: "node-c"})
	e.eventually("the scheduler's node-c replaced by node-a", func() bool { return e.placedOn(ns, "late", "node-a") })
	e.eventually("an event naming the node replaced", func() bool { return strings.Contains(e.events(ns, "late"), "node-a (instead of node node-c)") })

	// A generic ephemeral volume: the pod gets the events too.
	pod := podWith(ns, "web", ephemeralVol("scratch"))
	e.must(e.c.Create(bg, pod))
	e.restore(ns, "web-scratch", "podvol", fromClaim("golden"), nil, metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: "web", UID: pod.UID,
		Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)})
	e.eventually("the ephemeral clone placed", func() bool { return e.placedOn(ns, "web-scratch", "node-a") })
	e.eventually("the event on the pod", func() bool {
		return strings.Contains(e.events(ns, "web"), sourceplacement.ReasonPlaced+": volume claim web-scratch: provisioned on node node-a")
	})

	// A source not bound yet: nothing, then its node once bound.
	pending := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pending"}, Spec: spec}
	e.must(e.c.Create(bg, pending))
	e.restore(ns, "early", "podvol", fromClaim("pending"), nil)
	e.use(ns, "early")
	e.never("a clone of an unbound claim placed", func() bool { return !e.untouched(ns, "early") })
	e.pvFor(pending, "podvol.io", "node-b")
	e.must(e.c.Get(bg, client.ObjectKeyFromObject(pending), pending))
	pending.Spec.VolumeName = "pv-" + ns + "-pending"
	e.must(e.c.Update(bg, pending))
	e.eventually("the clone placed once its source is bound", func() bool { return e.placedOn(ns, "early", "node-b") })
}

// A restore is provisioned on the node its snapshot's handle names, from
// the content's status (a dynamic snapshot) or spec (an imported one); a
// snapshot not bound to its content yet is waited for, without events.
func TestSourcePlacementRestore(t *testing.T) {
	e := start(t, "source-placement")
	ns := e.ns("placement-restore")
	e.placementClasses()
	e.node("node-a")
	e.node("node-b")

	e.snapshot(ns, "nightly", "snapcontent-nightly", "podvol.io", "snap-0123456789abcdef01234567@node-b", false)
	e.restore(ns, "restored", "podvol", fromSnapshot("nightly"), nil)
	e.use(ns, "restored")
	e.eventually("the restore placed on node-b", func() bool { return e.placedOn(ns, "restored", "node-b") })
	e.eventually("the PlacedWithSource event", func() bool {
		return strings.Contains(e.events(ns, "restored"), sourceplacement.ReasonPlaced+": provisioned on node node-b, which holds its data source VolumeSnapshot/nightly")
	})

	e.snapshot(ns, "imported", "snapcontent-imported", "podvol.io", "snap-0123456789abcdef01234568@node-a", true)
	e.restore(ns, "from-import", "podvol", fromSnapshot("imported"), nil)
	e.use(ns, "from-import")
	e.eventually("the restore of an imported snapshot placed on node-a", func() bool { return e.placedOn(ns, "from-import", "node-a") })

	// Not bound yet.
	e.snapshot(ns, "cutting", "", "", "", false)
	e.restore(ns, "soon", "podvol", fromSnapshot("cutting"), nil)
	e.use(ns, "soon")
	e.never("a restore of an unbound snapshot placed", func() bool { return !e.untouched(ns, "soon") })
	if ev := e.events(ns, "soon"); ev != "" {
		t.Fatalf("events while the snapshot is not bound: %s", ev)
	}
	e.bindSnapshot(ns, "cutting", "snapcontent-cutting", "podvol.io", "snap-0123456789abcdef01234569@node-b", false)
	e.eventually("the restore placed once the snapshot is bound", func() bool { return e.placedOn(ns, "soon", "node-b") })
}

// A source whose node is not in the cluster, or that names no node, is not
// placed: a Warning event says why.
func TestSourcePlacementNodeUnknown(t *testing.T) {
	e := start(t, "source-placement")
	ns := e.ns("placement-lost")
	e.placementClasses()
	e.sourceOn(ns, "golden", "podvol.io", "node-z")
	e.restore(ns, "copy", "podvol", fromClaim("golden"), nil)
	e.snapshot(ns, "old", "snapcontent-old", "podvol.io", "snap-0123456789abcdef01234567", false)
	e.restore(ns, "restored", "podvol", fromSnapshot("old"), nil)
	e.use(ns, "copy", "restored")

	e.eventually("a SourceNodeMissing warning", func() bool {
		return strings.Contains(e.events(ns, "copy"), sourceplacement.ReasonNodeMissing+": its data source PersistentVolumeClaim/golden is on node node-z, which is not in the cluster")
	})
	e.eventually("a SourceNodeUnknown warning", func() bool {
		return strings.Contains(e.events(ns, "restored"), sourceplacement.ReasonNoNode+": its data source VolumeSnapshot/old has handle")
	})
	e.never("a claim placed on a missing or unknown node", func() bool { return !e.untouched(ns, "copy") || !e.untouched(ns, "restored") })

	// The node comes (back): the claim is placed at the next look.
	e.node("node-z")
	e.eventually("the clone placed once its node is there", func() bool { return e.placedOn(ns, "copy", "node-z") })
}

// What is not podvol's to place is left alone: a source in another
// namespace (with a Warning event saying what to do), another driver's
// class or source, an Immediate class, a claim with no source. A clone
// placed meanwhile shows that the controller was at work.
func TestSourcePlacementLeavesOthersAlone(t *testing.T) {
	e := start(t, "source-placement")
	ns, other := e.ns("placement-others"), e.ns("placement-golden")
	e.placementClasses()
	e.node("node-a")
	e.sourceOn(ns, "golden", "podvol.io", "node-a")
	e.sourceOn(other, "golden", "podvol.io", "node-a")
	e.sourceOn(ns, "foreign", "other.csi", "node-a")
	e.snapshot(ns, "foreign-snap", "snapcontent-foreign", "other.csi", "snap-0123456789abcdef01234567@node-a", false)

	e.restore(ns, "across", "podvol", &corev1.TypedObjectReference{Kind: "PersistentVolumeClaim", Name: "golden", Namespace: ptr.To(other)}, nil)
	if p := e.pvc(ns, "across"); p.Spec.DataSourceRef == nil || p.Spec.DataSourceRef.Namespace == nil {
		t.Fatal("the API server dropped dataSourceRef.namespace: CrossNamespaceVolumeDataSource is off")
	}
	e.restore(ns, "other-class", "other", fromClaim("golden"), nil)
	e.restore(ns, "immediate", "podvol-now", fromClaim("golden"), nil)
	e.restore(ns, "of-foreign", "podvol", fromClaim("foreign"), nil)
	e.restore(ns, "of-foreign-snap", "podvol", fromSnapshot("foreign-snap"), nil)
	e.must(e.c.Create(bg, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "empty"}, Spec: spec}))
	e.restore(ns, "control", "podvol", fromClaim("golden"), nil)
	e.use(ns, "across", "other-class", "immediate", "of-foreign", "of-foreign-snap", "empty", "control")

	e.eventually("the control clone placed", func() bool { return e.placedOn(ns, "control", "node-a") })
	e.eventually("a SourceInOtherNamespace warning", func() bool {
		return strings.Contains(e.events(ns, "across"), sourceplacement.ReasonOtherNamespace+": its data source PersistentVolumeClaim/golden is in namespace "+other)
	})
	left := []string{"across", "other-class", "immediate", "of-foreign", "of-foreign-snap", "empty"}
	e.never("a claim that is not podvol's to place placed", func() bool {
		for _, n := range left {
			if !e.untouched(ns, n) {
				return true
			}
		}
		return false
	})
	for _, n := range left[1:] {
		if ev := e.events(ns, n); ev != "" {
			t.Errorf("events on %s: %s", n, ev)
		}
	}
}

// giveBack removes the claim's selected node, as external-provisioner's
// rescheduleProvisioning does when the node has no room.
func (e *env) giveBack(ns, name string) time.Time {
	e.t.Helper()
	p := e.pvc(ns, name)
	delete(p.Annotations, names.SelectedNode)
	e.must(e.c.Update(bg, p))
	return time.Now()
}

// The source's node has no room: its csi-provisioner removes the selected
// node to ask for another, and the scheduler may pick one. The controller
// says so and places the claim on the source's node again, but only after
// its backoff, which doubles with each give-back.
func TestSourcePlacementBackoff(t *testing.T) {
	e := start(t, "source-placement")
	ns := e.ns("placement-full")
	e.placementClasses()
	e.node("node-a")
	e.node("node-c")
	e.sourceOn(ns, "golden", "podvol.io", "node-a")
	e.restore(ns, "copy", "podvol", fromClaim("golden"), nil)
	e.use(ns, "copy")
	e.eventually("the clone placed on node-a", func() bool { return e.placedOn(ns, "copy", "node-a") })

	for round, rescheduled := range []bool{false, true} {
		removed := e.giveBack(ns, "copy")
		if rescheduled {
			// The scheduler picks another node meanwhile.
			time.Sleep(500 * time.Millisecond)
			p := e.pvc(ns, "copy")
			p.Annotations[names.SelectedNode] = "node-c"
			e.must(e.c.Update(bg, p))
		}
		backoff := placementBackoff << round
		e.never("the claim placed again before the backoff", func() bool { return e.ann(ns, "copy", names.SelectedNode) == "node-a" })
		e.eventually("the claim placed on node-a again", func() bool { return e.placedOn(ns, "copy", "node-a") })
		if d := time.Since(removed); d < backoff {
			t.Fatalf("round %d: placed again after %s, before the backoff (%s)", round, d, backoff)
		}
		e.eventually("the SourceNodeFull warning", func() bool {
			return strings.Contains(e.events(ns, "copy"), sourceplacement.ReasonNoRoom+": node node-a, which holds its data source PersistentVolumeClaim/golden, has no room for this claim (see ProvisioningFailed events); podvol retries on node-a in "+backoff.String())
		})
	}
}

// A claim that no pod uses is not placed (WaitForFirstConsumer provisions
// nothing for it, nor may podvol): not while the only pods that name it
// are finished or being deleted, nor for a pod whose generic ephemeral
// volume has its name but that does not own it; once a pod uses it, it is.
func TestSourcePlacementNeedsConsumer(t *testing.T) {
	e := start(t, "source-placement")
	ns := e.ns("placement-consumer")
	e.placementClasses()
	e.node("node-a")
	e.sourceOn(ns, "golden", "podvol.io", "node-a")
	e.snapshot(ns, "nightly", "snapcontent-nightly", "podvol.io", "snap-0123456789abcdef01234567@node-a", false)

	// The pods first: a pod is created live, then finished or deleted, and
	// a claim that existed meanwhile would rightly have been placed.
	done := podWith(ns, "done", claimVol("app-data"), corev1.Volume{Name: "w", VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "restored"}}})
	e.must(e.c.Create(bg, done))
	setPhase(e, done, corev1.PodSucceeded)
	going := podWith(ns, "going", claimVol("app-data"))
	going.Finalizers = []string{"test.podvol.io/hold"}
	e.must(e.c.Create(bg, going))
	e.must(e.c.Delete(bg, going))
	// Its ephemeral volume "data" would be claim app-data, were it the pod's.
	e.must(e.c.Create(bg, podWith(ns, "app", ephemeralVol("data"))))
	// podvol-controller's cache sees pods and claims through two watches:
	// give the pods' last states time to arrive before the claims do.
	time.Sleep(2 * time.Second)
	e.restore(ns, "app-data", "podvol", fromClaim("golden"), nil)
	e.restore(ns, "restored", "podvol", fromSnapshot("nightly"), nil)
	e.never("a claim with no consumer placed", func() bool { return !e.untouched(ns, "app-data") || !e.untouched(ns, "restored") })
	if ev := e.events(ns, "app-data") + e.events(ns, "restored"); ev != "" {
		t.Fatalf("events on claims with no consumer: %s", ev)
	}

	e.use(ns, "app-data", "restored")
	e.eventually("the clone placed once a pod uses it", func() bool { return e.placedOn(ns, "app-data", "node-a") })
	e.eventually("the restore placed once a pod uses it", func() bool { return e.placedOn(ns, "restored", "node-a") })
	e.must(e.c.Get(bg, client.ObjectKeyFromObject(going), going))
	going.Finalizers = nil
	e.must(e.c.Update(bg, going))
}

// A claim given back is not placed again once no pod uses it any more.
func TestSourcePlacementStopsWithoutConsumer(t *testing.T) {
	e := start(t, "source-placement")
	ns := e.ns("placement-gone")
	e.placementClasses()
	e.node("node-a")
	e.sourceOn(ns, "golden", "podvol.io", "node-a")
	e.restore(ns, "copy", "podvol", fromClaim("golden"), nil)
	e.use(ns, "copy")
	e.eventually("the clone placed on node-a", func() bool { return e.placedOn(ns, "copy", "node-a") })

	e.giveBack(ns, "copy")
	e.must(e.c.Delete(bg, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "use-copy"}}))
	e.neverFor(2*placementBackoff, "the claim placed again with no pod using it", func() bool {
		return e.ann(ns, "copy", names.SelectedNode) != ""
	})
	if n := strings.Count(e.events(ns, "copy"), sourceplacement.ReasonNoRoom); n > 1 {
		t.Fatalf("%d SourceNodeFull warnings", n)
	}

	// A pod uses it again: it is placed again.
	e.use(ns, "copy")
	e.eventually("the clone placed again for the new pod", func() bool { return e.placedOn(ns, "copy", "node-a") })
}

// A claim created before its StorageClass is placed once the class comes.
func TestSourcePlacementClassLater(t *testing.T) {
	e := start(t, "source-placement")
	ns := e.ns("placement-class")
	e.placementClasses()
	e.node("node-a")
	e.sourceOn(ns, "golden", "podvol.io", "node-a")
	e.restore(ns, "copy", "podvol-later", fromClaim("golden"), nil)
	e.use(ns, "copy")
	e.never("a claim of a class not there placed", func() bool { return !e.untouched(ns, "copy") })
	e.must(e.c.Create(bg, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "podvol-later"}, Provisioner: "podvol.io",
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer)}))
	e.eventually("the clone placed once its class is there", func() bool { return e.placedOn(ns, "copy", "node-a") })
}

// noSnapshots is a RESTMapper of a cluster without the snapshot CRDs.
type noSnapshots struct{ meta.RESTMapper }

func (m noSnapshots) RESTMapping(gk schema.GroupKind, versions ...string) (*meta.RESTMapping, error) {
	if gk.Group == sourceplacement.SnapshotGVK.Group {
		return nil, &meta.NoKindMatchError{GroupKind: gk, SearchedVersions: versions}
	}
	return m.RESTMapper.RESTMapping(gk, versions...)
}

func (m noSnapshots) RESTMappings(gk schema.GroupKind, versions ...string) ([]*meta.RESTMapping, error) {
	if gk.Group == sourceplacement.SnapshotGVK.Group {
		return nil, &meta.NoKindMatchError{GroupKind: gk, SearchedVersions: versions}
	}
	return m.RESTMapper.RESTMappings(gk, versions...)
}

// Started without the snapshot CRDs, podvol-controller places clones, and
// says on each restore that it must be restarted to place it.
func TestSourcePlacementNoSnapshotCRDs(t *testing.T) {
	e := startWith(t, func(m meta.RESTMapper) meta.RESTMapper { return noSnapshots{m} }, "source-placement")
	ns := e.ns("placement-nocrds")
	e.placementClasses()
	e.node("node-a")
	e.sourceOn(ns, "golden", "podvol.io", "node-a")
	e.snapshot(ns, "nightly", "snapcontent-nightly", "podvol.io", "snap-0123456789abcdef01234567@node-a", false)
	e.restore(ns, "restored", "podvol", fromSnapshot("nightly"), nil)
	e.restore(ns, "copy", "podvol", fromClaim("golden"), nil)
	e.use(ns, "restored", "copy")
	e.eventually("the clone placed", func() bool { return e.placedOn(ns, "copy", "node-a") })
	e.eventually("a SnapshotAPIMissing warning", func() bool {
		ev := e.events(ns, "restored")
		return strings.Contains(ev, sourceplacement.ReasonNoSnapshotAPI+": its data source is VolumeSnapshot/nightly") &&
			strings.Contains(ev, "podvol-controller is restarted after installing the snapshot CRDs")
	})
	if !e.untouched(ns, "restored") {
		t.Fatal("a restore placed without the snapshot API")
	}
}

// Restores waiting on a snapshot that is not bound cost no API request:
// the snapshot kinds are read from the cache, and looked at again less and
// less often (besides the watches that wake them).
func TestSourcePlacementWaitIsCheap(t *testing.T) {
	e := start(t, "source-placement")
	ns := e.ns("placement-wait")
	e.placementClasses()
	e.node("node-b")
	e.snapshot(ns, "cutting", "", "", "", false)
	e.restore(ns, "soon", "podvol", fromSnapshot("cutting"), nil)
	e.use(ns, "soon")
	e.eventually("a look at the snapshot", func() bool { return e.snapshotReads.Load() > 0 })
	time.Sleep(12 * placementWait)
	// A fixed Wait would look 12 times more, a doubling one ~4 times.
	if n := e.snapshotReads.Load(); n > 7 {
		t.Errorf("the snapshot was read %d times in %s with Wait %s: the looks do not grow apart", n, 12*placementWait, placementWait)
	}
	e.bindSnapshot(ns, "cutting", "snapcontent-cutting", "podvol.io", "snap-0123456789abcdef01234569@node-b", false)
	e.eventually("the restore placed once the snapshot is bound", func() bool { return e.placedOn(ns, "soon", "node-b") })
	for _, r := range []string{"volumesnapshots", "volumesnapshotcontents"} {
		if n := e.liveGets.count(r); n > 0 {
			t.Errorf("%d GETs of %s from the API server, not the cache", n, r)
		}
	}
}

// An ephemeral clone placed on its source's node is created again, at each
// reset, already placed there: the scheduler then considers that node only
// for the next pod, and source-placement neither reads the claim as given
// back (no SourceNodeFull, no backoff) nor has anything left to do.
func TestResetKeepsPlacement(t *testing.T) {
	e := start(t, "clone-lifecycle", "source-placement")
	ns := e.ns("placement-reset")
	e.placementClasses()
	e.node("node-a")
	e.node("node-c")
	e.sourceOn(ns, "golden", "podvol.io", "node-a")
	e.restore(ns, "work", "podvol", fromClaim("golden"), map[string]string{names.Lifecycle: names.ResetOnDetach})
	user := podWith(ns, "user", claimVol("work"))
	e.must(e.c.Create(bg, user))
	setPhase(e, user, corev1.PodRunning)
	e.eventually("the clone placed on node-a and marked used", func() bool {
		return e.placedOn(ns, "work", "node-a") && e.ann(ns, "work", names.Used) == "true"
	})
	// Provisioned there, as node-a's provisioner would.
	first := e.pvc(ns, "work")
	e.pvFor(first, "podvol.io", "node-a")
	first.Spec.VolumeName = "pv-" + ns + "-work"
	e.must(e.c.Update(bg, first))

	// The claim as it is created again, from a watch started before the
	// reset: what the scheduler and the provisioner see first.
	w, err := e.c.Watch(bg, &corev1.PersistentVolumeClaimList{}, client.InNamespace(ns))
	e.must(err)
	defer w.Stop()
	e.must(e.c.Delete(bg, user, client.GracePeriodSeconds(0)))
	var created *corev1.PersistentVolumeClaim
	for timeout := time.After(time.Minute); created == nil; {
		select {
		case ev := <-w.ResultChan():
			if p, ok := ev.Object.(*corev1.PersistentVolumeClaim); ok && ev.Type == watch.Added && p.Name == "work" && p.UID != first.UID {
				created = p
			}
		case <-timeout:
			t.Fatal("timed out waiting for the clone to be created again")
		}
	}
	if got := created.Annotations[names.SelectedNode]; got != "node-a" {
		t.Errorf("the reset clone was created with %s=%q, want node-a (its source's node): %v", names.SelectedNode, got, created.Annotations)
	}
	if got := created.Annotations[names.SourceNode]; got != "node-a" {
		t.Errorf("the reset clone was created with %s=%q, want node-a: %v", names.SourceNode, got, created.Annotations)
	}

	// The next pod: the claim stays placed on node-a, with no warning and
	// no wait for a backoff.
	e.must(e.c.Create(bg, podWith(ns, "next", claimVol("work"))))
	e.neverFor(placementBackoff+time.Second, "a SourceNodeFull warning, or the placement lost", func() bool {
		p := e.pvc(ns, "work")
		return p == nil || p.UID != created.UID || !e.placedOn(ns, "work", "node-a") ||
			strings.Contains(e.events(ns, "work"), sourceplacement.ReasonNoRoom)
	})
}

// A restore or clone can only be provisioned on its source's node: when a
// pod that uses it cannot run there (the node cordoned, a taint it does not
// tolerate, its nodeSelector, node affinity or nodeName), the claim is
// placed there still, and a Warning on the claim and on the pod says why the
// pod will not start. A pod that can run there gets none.
func TestSourcePlacementPodCannotRun(t *testing.T) {
	e := start(t, "source-placement")
	ns := e.ns("placement-unfit")
	e.placementClasses()
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		e.node(n)
	}
	// Each node as it is once ready: the API server taints new Nodes
	// not-ready (TaintNodesByCondition), which the node lifecycle
	// controller, not running here, removes.
	change := func(name string, f func(*corev1.Node)) {
		n := &corev1.Node{}
		e.must(e.c.Get(bg, client.ObjectKey{Name: name}, n))
		n.Spec.Taints = nil
		f(n)
		e.must(e.c.Update(bg, n))
	}
	change("node-a", func(n *corev1.Node) { n.Spec.Unschedulable = true })
	change("node-b", func(n *corev1.Node) {
		n.Spec.Taints = []corev1.Taint{{Key: "dedicated", Value: "db", Effect: corev1.TaintEffectNoSchedule},
			{Key: "spare", Effect: corev1.TaintEffectPreferNoSchedule}}
	})
	change("node-c", func(n *corev1.Node) { n.Labels = map[string]string{"zone": "c"} })
	for _, n := range []string{"a", "b", "c"} {
		e.sourceOn(ns, "golden-"+n, "podvol.io", "node-"+n)
	}
	zone := func(op corev1.NodeSelectorOperator, v string) *corev1.Affinity {
		return &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: op, Values: []string{v}}}}}}}}
	}
	for _, c := range []struct {
		claim, node string
		pod         func(*corev1.Pod)
		// why is what the warning says, "" for none.
		why string
	}{
		{"cordoned", "a", func(*corev1.Pod) {}, "the node is cordoned"},
		{"cordoned-tolerated", "a", func(p *corev1.Pod) {
			p.Spec.Tolerations = []corev1.Toleration{{Key: corev1.TaintNodeUnschedulable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
		}, ""},
		{"tainted", "b", func(*corev1.Pod) {}, "taint dedicated=db:NoSchedule, which the pod does not tolerate"},
		{"tolerated", "b", func(p *corev1.Pod) {
			p.Spec.Tolerations = []corev1.Toleration{{Key: "dedicated", Value: "db", Effect: corev1.TaintEffectNoSchedule}}
		}, ""},
		{"selector", "c", func(p *corev1.Pod) { p.Spec.NodeSelector = map[string]string{"zone": "x"} }, "the pod's nodeSelector or required node affinity excludes the node"},
		{"affinity", "c", func(p *corev1.Pod) { p.Spec.Affinity = zone(corev1.NodeSelectorOpNotIn, "c") }, "the pod's nodeSelector or required node affinity excludes the node"},
		{"affinity-fits", "c", func(p *corev1.Pod) { p.Spec.Affinity = zone(corev1.NodeSelectorOpIn, "c") }, ""},
		{"node-name", "c", func(p *corev1.Pod) { p.Spec.NodeName = "node-b" }, "it is bound to node node-b (spec.nodeName)"},
	} {
		e.restore(ns, c.claim, "podvol", fromClaim("golden-"+c.node), nil)
		pod := podWith(ns, "use-"+c.claim, claimVol(c.claim))
		c.pod(pod)
		e.must(e.c.Create(bg, pod))
		e.eventually(c.claim+" placed on its source's node", func() bool { return e.placedOn(ns, c.claim, "node-"+c.node) })
		if c.why == "" {
			continue
		}
		want := "node node-" + c.node + ", which holds its data source PersistentVolumeClaim/golden-" + c.node + ", cannot run pod use-" + c.claim + ": " + c.why
		e.eventually(c.claim+": the warning on the claim and on the pod", func() bool {
			return strings.Contains(e.events(ns, c.claim), sourceplacement.ReasonNodeUnfit+": "+want) &&
				strings.Contains(e.events(ns, "use-"+c.claim), sourceplacement.ReasonNodeUnfit+": volume claim "+c.claim+": "+want)
		})
	}
	// Looked at again (the placement's own update, the watches), each
	// warns once; the pods that can run there got none.
	time.Sleep(4 * placementWait)
	for _, c := range []string{"cordoned", "tainted", "selector", "affinity", "node-name"} {
		if n := strings.Count(e.events(ns, c), sourceplacement.ReasonNodeUnfit); n != 1 {
			t.Errorf("%d %s warnings on %s:\n%s", n, sourceplacement.ReasonNodeUnfit, c, e.events(ns, c))
		}
	}
	for _, c := range []string{"cordoned-tolerated", "tolerated", "affinity-fits"} {
		if ev := e.events(ns, c) + e.events(ns, "use-"+c); strings.Contains(ev, sourceplacement.ReasonNodeUnfit) {
			t.Errorf("a warning for a pod that can run on the source's node (%s):\n%s", c, ev)
		}
	}
}

// Claims as admission policy podvol-placement-gate admits them, with the
// selected node no node is: one nobody uses stays so (the placeholder is not
// the scheduler's choice, which would mean a consumer); once used, a clone
// is placed on its source's node, and one podvol cannot place (its source
// names no node; another driver's source) is left to kube-scheduler, the
// placeholder removed, or its pod could never be scheduled.
func TestSourcePlacementGate(t *testing.T) {
	e := start(t, "source-placement")
	ns := e.ns("placement-gate")
	e.placementClasses()
	e.node("node-a")
	e.sourceOn(ns, "golden", "podvol.io", "node-a")
	e.sourceOn(ns, "theirs", "other.csi", "node-a")
	e.snapshot(ns, "old", "snapcontent-gate-old", "podvol.io", "snap-0123456789abcdef01234567", false)
	gated := map[string]string{names.SelectedNode: names.AwaitingPlacement}
	e.restore(ns, "app-data", "podvol", fromClaim("golden"), gated)
	e.restore(ns, "restored", "podvol", fromSnapshot("old"), gated)
	e.restore(ns, "foreign", "podvol", fromClaim("theirs"), gated)

	e.never("a gated claim nobody uses placed or released", func() bool {
		for _, c := range []string{"app-data", "restored", "foreign"} {
			if e.ann(ns, c, names.SelectedNode) != names.AwaitingPlacement || e.ann(ns, c, names.SourceNode) != "" {
				return true
			}
		}
		return false
	})

	e.use(ns, "app-data", "restored", "foreign")
	e.eventually("the clone placed on its source's node", func() bool { return e.placedOn(ns, "app-data", "node-a") })
	if ev := e.events(ns, "app-data"); strings.Contains(ev, "instead of") {
		t.Fatalf("the placement's event speaks of the placeholder as a node: %s", ev)
	}
	for _, c := range []string{"restored", "foreign"} {
		e.eventually(c+" left to the scheduler", func() bool {
			return e.ann(ns, c, names.SelectedNode) == "" && e.ann(ns, c, names.Placement) == names.PlacementScheduler && e.ann(ns, c, names.SourceNode) == ""
		})
	}
}
