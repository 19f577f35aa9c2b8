package controller

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

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
