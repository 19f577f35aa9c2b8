package controller

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/podvol/podvol/internal/controller/grouprouting"
	"github.com/podvol/podvol/internal/controller/snapshotimport"
)

// An admin imports podvol snapshots as pre-provisioned
// VolumeSnapshotContents: each is labelled with the node its handle names,
// so that node's csi-snapshotter takes it; a handle that names no node gets
// an event saying what to do; contents snapshot-controller made (labelled)
// and other drivers' contents are left alone.
func TestImportedSnapshotsReachTheirNode(t *testing.T) {
	e := start(t, "snapshot-import")
	e.node("node-a", "podvol.io")
	e.vsc("imported", "podvol.io", "snap-0123456789abcdef01234567@node-a", nil)
	e.vsc("gone-node", "podvol.io", "snap-0123456789abcdef01234568@node-z", nil)
	e.vsc("old-handle", "podvol.io", "snap-0123456789abcdef01234569", nil)
	e.vsc("bad-node", "podvol.io", "snap-0123456789abcdef0123456c@not a node/name", nil)
	e.vsc("dynamic", "podvol.io", "snap-0123456789abcdef0123456a@node-a", map[string]string{snapshotimport.ManagedBy: "node-b"})
	e.vsc("other-driver", "other.csi", "snap-0123456789abcdef0123456b@node-a", nil)

	e.eventually("imported content labelled node-a", func() bool { return e.vscLabel("imported") == "node-a" })
	e.eventually("content of a node not in the cluster labelled with it", func() bool { return e.vscLabel("gone-node") == "node-z" })
	e.eventually("events on the imported contents", func() bool {
		return strings.Contains(e.events("default", "imported"), snapshotimport.ReasonRouted) &&
			strings.Contains(e.events("default", "gone-node"), snapshotimport.ReasonNodeMissing) &&
			strings.Contains(e.events("default", "old-handle"), snapshotimport.ReasonNoNode) &&
			strings.Contains(e.events("default", "bad-node"), "cannot be the value of label")
	})
	e.never("a content that names no node, is already routed, or is another driver's labelled", func() bool {
		return e.vscLabel("old-handle") != "" || e.vscLabel("bad-node") != "" || e.vscLabel("dynamic") != "node-b" || e.vscLabel("other-driver") != ""
	})
}

func (e *env) vsc(name, driver, handle string, labels map[string]string) {
	e.t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{
		"spec": map[string]any{
			"driver": driver, "deletionPolicy": "Retain",
			"source":            map[string]any{"snapshotHandle": handle},
			"volumeSnapshotRef": map[string]any{"name": name, "namespace": "default"},
		},
	}}
	u.SetGroupVersionKind(snapshotimport.ContentGVK)
	u.SetName(name)
	u.SetLabels(labels)
	e.must(e.c.Create(bg, u))
}

func (e *env) vscLabel(name string) string {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(snapshotimport.ContentGVK)
	e.must(e.c.Get(bg, client.ObjectKey{Name: name}, u))
	return u.GetLabels()[snapshotimport.ManagedBy]
}

// VolumeGroupSnapshotContents snapshot-controller makes reach the node of
// their members' volumes (its podvol-group-snapshotter takes only those
// labelled with it); one whose volumes live on two nodes is refused on the
// VolumeGroupSnapshot, where its user looks; one that names a volume whose
// PV comes later is routed when it comes. The members' contents that
// snapshot-controller then makes, unlabelled, reach the node their group's
// handle names.
func TestGroupSnapshotsReachTheirNode(t *testing.T) {
	e := start(t, "group-snapshot-routing", "snapshot-import")
	ns := e.ns("groups")
	e.boundOn(ns, "data", "podvol", "node-a")
	e.boundOn(ns, "wal", "podvol", "node-a")
	e.boundOn(ns, "other", "podvol", "node-b")
	e.vgsc("together", ns, "pv-data", "pv-wal")
	e.vgsc("apart", ns, "pv-data", "pv-other")
	e.vgsc("later", ns, "pv-data", "pv-late")
	e.eventually("group of node-a's volumes labelled node-a", func() bool { return e.vgscLabel("together") == "node-a" })
	e.eventually("group spanning nodes refused on its VolumeGroupSnapshot", func() bool {
		ev := e.events(ns, "vgs-apart")
		return strings.Contains(ev, grouprouting.ReasonSpansNodes) && strings.Contains(ev, "node-b ("+ns+"/other)")
	})
	e.eventually("group waiting for a PV says so", func() bool {
		return strings.Contains(e.events(ns, "vgs-later"), grouprouting.ReasonWaiting)
	})
	e.boundOn(ns, "late", "podvol", "node-a")
	e.eventually("group routed once its PV exists", func() bool { return e.vgscLabel("later") == "node-a" })
	e.never("a group spanning nodes labelled", func() bool { return e.vgscLabel("apart") != "" })

	// As snapshot-controller makes a member: a volume as source, the
	// group's handle, no label.
	m := &unstructured.Unstructured{Object: map[string]any{
		"spec": map[string]any{
			"driver": "podvol.io", "deletionPolicy": "Delete",
			"source":            map[string]any{"volumeHandle": "pv-data"},
			"volumeSnapshotRef": map[string]any{"name": "member", "namespace": ns},
		},
	}}
	m.SetGroupVersionKind(snapshotimport.ContentGVK)
	m.SetName("member")
	m.SetAnnotations(map[string]string{snapshotimport.GroupHandleAnnotation: "group-0123456789abcdef01234567@node-a"})
	e.must(e.c.Create(bg, m))
	e.eventually("group member labelled with its group's node", func() bool { return e.vscLabel("member") == "node-a" })
}

func (e *env) vgsc(name, ns string, handles ...string) {
	e.t.Helper()
	hs := make([]any, len(handles))
	for i, h := range handles {
		hs[i] = h
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"spec": map[string]any{
			"driver": "podvol.io", "deletionPolicy": "Delete",
			"source":                 map[string]any{"volumeHandles": hs},
			"volumeGroupSnapshotRef": map[string]any{"name": "vgs-" + name, "namespace": ns},
		},
	}}
	u.SetGroupVersionKind(grouprouting.ContentGVK)
	u.SetName(name)
	e.must(e.c.Create(bg, u))
}

func (e *env) vgscLabel(name string) string {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(grouprouting.ContentGVK)
	e.must(e.c.Get(bg, client.ObjectKey{Name: name}, u))
	return u.GetLabels()[snapshotimport.ManagedBy]
}
