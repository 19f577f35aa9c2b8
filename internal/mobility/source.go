package mobility

import (
	"context"
	"errors"
	"fmt"
	"os"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/podvol/podvol/internal/errkind"
	"github.com/podvol/podvol/internal/names"
	"github.com/podvol/podvol/internal/pool"
	"github.com/podvol/podvol/internal/snaphandle"
	"github.com/podvol/podvol/internal/store"
	"github.com/podvol/podvol/internal/topology"
	"github.com/podvol/podvol/internal/transfer"
)

// Images serves this node's ready snapshots, by id, from the pool the id
// names, and its volumes, through a snapshot cut for the claim that pulls
// (Cut). A snapshot's image is never written after it is cut, so what a
// pull reads does not change under it (a snapshot deleted meanwhile is
// still read to the end through the open file).
type Images struct {
	// Pool returns the pool named (pool.PoolOf an id).
	Pool func(name string) (*pool.Pool, bool)
	// Cut returns the snapshot of volume id cut for claim, cutting it the
	// first time (the driver's CutForTransfer); nil: volumes are not
	// served.
	Cut func(id string, claim store.Claim) (*pool.Pool, *store.Snapshot, error)
	// Move returns what a migration's pull for claim reads of volume id
	// (the driver's CutForMove): the pre-copy's snapshot, and, once the
	// volume is no longer in use, the volume marked moving; nil: volumes
	// are not moved.
	Move func(id string, claim store.Claim) (*pool.Pool, *store.Snapshot, *store.Volume, error)
}

func (im Images) Open(_ context.Context, r transfer.Request) (transfer.Image, error) {
	switch {
	case pool.ValidSnapshotID(r.Source):
		name, _ := pool.PoolOf(r.Source)
		p, ok := im.Pool(name)
		if !ok {
			return transfer.Image{}, fmt.Errorf("snapshot %s is of pool %s, which this node does not serve: %w", r.Source, name, errkind.ErrNotFound)
		}
		s, err := p.ReadySnapshot(r.Source)
		if err != nil {
			return transfer.Image{}, err
		}
		return open(p, s)
	case pool.ValidID(r.Source) && r.Move && im.Move != nil:
		return im.move(r)
	case pool.ValidID(r.Source) && im.Cut != nil:
		p, s, err := im.Cut(r.Source, store.Claim{Namespace: r.Claim.Namespace, Name: r.Claim.Name, UID: r.Claim.UID})
		if err != nil {
			return transfer.Image{}, fmt.Errorf("snapshot volume %s for claim %s: %w", r.Source, r.Claim, err)
		}
		// Kept, even sent whole, until Sweeper finds the claim bound or
		// gone: any later pull for the claim (one that stopped, a target
		// that lost its copy, a node that asks again) reads this cut
		// rather than freezing and copying the volume again.
		return open(p, s)
	}
	return transfer.Image{}, fmt.Errorf("%q is not a snapshot or volume id this node serves: %w", r.Source, errkind.ErrNotFound)
}

// move serves a migration: while the volume is in use, the snapshot cut
// for the pre-copy, with More (a pull that already holds it is told to
// come back: errkind.ErrInUse); once it is not, the volume's own image
// (marked moving, it no longer changes), only what changed since the
// pre-copy's snapshot if the caller holds that. The snapshot is not
// deleted when sent: a pull of the last changes needs it; Sweeper deletes
// it once the claim is bound.
func (im Images) move(r transfer.Request) (transfer.Image, error) {
	claim := store.Claim{Namespace: r.Claim.Namespace, Name: r.Claim.Name, UID: r.Claim.UID}
	p, first, moving, err := im.Move(r.Source, claim)
	if err != nil {
		return transfer.Image{}, fmt.Errorf("volume %s, for the migration of claim %s: %w", r.Source, r.Claim, err)
	}
	if moving == nil {
		if r.Since != "" {
			return transfer.Image{}, fmt.Errorf("volume %s is in use on this node: the rest of its data is sent once no pod uses it: %w", r.Source, errkind.ErrInUse)
		}
		img, err := open(p, first)
		img.More = true
		return img, err
	}
	f, err := os.Open(p.ImagePath(moving.ID))
	if err != nil {
		return transfer.Image{}, fmt.Errorf("volume %s's image: %w", moving.ID, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return transfer.Image{}, err
	}
	img := transfer.Image{File: f, Size: fi.Size(), Identity: fmt.Sprintf("%s@moving-%d", moving.ID, moving.Moving.Since.UnixNano())}
	if r.Since == "" || first == nil {
		return img, nil
	}
	if base, err := open(p, first); err == nil {
		if base.Identity == r.Since {
			img.Base = base.File
		} else {
			base.File.Close()
		}
	}
	return img, nil
}

// open opens snapshot s of p for serving.
func open(p *pool.Pool, s *store.Snapshot) (transfer.Image, error) {
	f, err := os.Open(p.SnapshotPath(s.ID))
	if errors.Is(err, os.ErrNotExist) {
		return transfer.Image{}, fmt.Errorf("snapshot %s's image: %w", s.ID, errkind.ErrNotFound)
	}
	if err != nil {
		return transfer.Image{}, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return transfer.Image{}, err
	}
	// The id is never reused, and the image never changes: its creation
	// time tells a snapshot from any other of the same id (a restored
	// store, a recreated pool).
	return transfer.Image{File: f, Size: fi.Size(), Identity: fmt.Sprintf("%s@%d", s.ID, s.Created.UnixNano())}, nil
}

// Kinds the authorizer reads.
var (
	snapshotGVR = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshots"}
	contentGVR  = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshotcontents"}
)

// storageProvisioner is the annotation the PV controller sets on a claim
// with the provisioner that is to provision it.
const storageProvisioner = "volume.kubernetes.io/storage-provisioner"

// ClaimAuthorizer lets a node pull an image only for a claim that is bound
// for that node and is made from that very image, read live from the API
// server: the claim (by namespace, name and UID) is unbound, to be
// provisioned by Driver on the caller's node (its selected node), and its
// data source is, in its own namespace, a VolumeSnapshot whose content is
// Driver's and whose handle names the snapshot asked for on this node, or a
// claim bound to a PV of Driver on this node whose handle is the volume
// asked for. So a node gets only what a claim sent to it references, which
// it would be given anyway; a pod of a tenant has no node certificate at
// all.
type ClaimAuthorizer struct {
	Client  kubernetes.Interface
	Dynamic dynamic.Interface
	// Node is this node; Driver podvol's name.
	Node, Driver string
	// Snapshot returns this node's ready snapshot of that id, as its
	// pool records it (what volume, of what namespace, it was cut from);
	// an error wrapping errkind.ErrNotFound if there is none.
	Snapshot func(id string) (*store.Snapshot, error)
}

func (a ClaimAuthorizer) Authorize(ctx context.Context, r *transfer.Request) error {
	pvc, err := a.Client.CoreV1().PersistentVolumeClaims(r.Claim.Namespace).Get(ctx, r.Claim.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("claim %s does not exist: %w", r.Claim, errkind.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("read claim %s: %w", r.Claim, err)
	}
	switch {
	case string(pvc.UID) != r.Claim.UID:
		return fmt.Errorf("claim %s is another claim now (UID %s, not %s): %w", r.Claim, pvc.UID, r.Claim.UID, errkind.ErrNotFound)
	case pvc.Spec.VolumeName != "" || pvc.Status.Phase == corev1.ClaimBound:
		return fmt.Errorf("claim %s is bound already: %w", r.Claim, errkind.ErrDenied)
	case pvc.Annotations[storageProvisioner] != a.Driver:
		return fmt.Errorf("claim %s is not provisioned by %s: %w", r.Claim, a.Driver, errkind.ErrDenied)
	case pvc.Annotations[names.SelectedNode] != r.Caller:
		return fmt.Errorf("claim %s is to be provisioned on node %q, not on node %s: %w", r.Claim, pvc.Annotations[names.SelectedNode], r.Caller, errkind.ErrDenied)
	case pvc.Annotations[names.Placement] != names.PlacementScheduler:
		// Only a claim meant to move (podvol-controller's or its user's
		// word; a node cannot set this annotation) is pulled for: a node
		// that selects itself for any pending restore or clone gets
		// nothing.
		return fmt.Errorf("claim %s is not left to the scheduler (%s: %s), so its data does not move: %w", r.Claim, names.Placement, names.PlacementScheduler, errkind.ErrDenied)
	}
	if pool.ValidID(r.Source) {
		pv, err := ClonedPV(ctx, a.Client, a.Driver, pvc)
		if err != nil {
			return err
		}
		if pv.Spec.CSI.VolumeHandle != r.Source || topology.Node(pv) != a.Node {
			return fmt.Errorf("claim %s clones volume %s of node %q, not %s of node %s: %w", r.Claim, pv.Spec.CSI.VolumeHandle, topology.Node(pv), r.Source, a.Node, errkind.ErrDenied)
		}
		// podvol-controller's migration marks the PV it moves with the
		// target and the claim it made there (a tenant cannot write PVs).
		r.Move = pv.Annotations[names.MigrationTarget] == r.Caller && pv.Annotations[names.MigrationClaim] == r.Claim.String()
		return nil
	}
	ref := dataSource(pvc)
	if ref == nil || ref.Kind != "VolumeSnapshot" || ref.APIGroup == nil || *ref.APIGroup != snapshotGVR.Group ||
		(ref.Namespace != nil && *ref.Namespace != "" && *ref.Namespace != pvc.Namespace) {
		return fmt.Errorf("claim %s's data source is not a VolumeSnapshot of its namespace: %w", r.Claim, errkind.ErrDenied)
	}
	vs, err := a.Dynamic.Resource(snapshotGVR).Namespace(pvc.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("VolumeSnapshot %s/%s does not exist: %w", pvc.Namespace, ref.Name, errkind.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("read VolumeSnapshot %s/%s: %w", pvc.Namespace, ref.Name, err)
	}
	content, _, _ := unstructured.NestedString(vs.Object, "status", "boundVolumeSnapshotContentName")
	ready, _, _ := unstructured.NestedBool(vs.Object, "status", "readyToUse")
	if content == "" || !ready {
		return fmt.Errorf("VolumeSnapshot %s/%s is not bound to a ready content: %w", pvc.Namespace, ref.Name, errkind.ErrNotFound)
	}
	vsc, err := a.Dynamic.Resource(contentGVR).Get(ctx, content, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("VolumeSnapshotContent %s does not exist: %w", content, errkind.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("read VolumeSnapshotContent %s: %w", content, err)
	}
	// The content must name the snapshot back, as external-provisioner
	// checks: a content's status alone does not make it that snapshot's.
	refNS, _, _ := unstructured.NestedString(vsc.Object, "spec", "volumeSnapshotRef", "namespace")
	refName, _, _ := unstructured.NestedString(vsc.Object, "spec", "volumeSnapshotRef", "name")
	refUID, _, _ := unstructured.NestedString(vsc.Object, "spec", "volumeSnapshotRef", "uid")
	if refNS != vs.GetNamespace() || refName != vs.GetName() || (refUID != "" && refUID != string(vs.GetUID())) {
		return fmt.Errorf("VolumeSnapshotContent %s does not name VolumeSnapshot %s/%s back: %w", content, pvc.Namespace, ref.Name, errkind.ErrDenied)
	}
	if vsc.GetDeletionTimestamp() != nil {
		return fmt.Errorf("VolumeSnapshotContent %s is being deleted: %w", content, errkind.ErrNotFound)
	}
	driver, _, _ := unstructured.NestedString(vsc.Object, "spec", "driver")
	if driver != a.Driver {
		return fmt.Errorf("claim %s restores a snapshot of driver %s, not %s: %w", r.Claim, driver, a.Driver, errkind.ErrDenied)
	}
	// The node that manages a content writes its status, handle
	// included (its csi-snapshotter): only this node's own contents are
	// believed here. No node may change that label (node-policy.yaml).
	if m := vsc.GetLabels()[names.SnapshotManagedBy]; m != a.Node {
		return fmt.Errorf("VolumeSnapshotContent %s is managed by node %s, not by this node (%s): its snapshot is served only by the node whose csi-snapshotter writes it: %w",
			content, orNone(m), a.Node, errkind.ErrDenied)
	}
	// spec.source is immutable, and no node creates contents: the
	// handle of a content made for an existing snapshot (imported by
	// handle) is the one it was made with, and a content cut from a
	// volume names that volume, which the pool's record must match.
	specHandle, _, _ := unstructured.NestedString(vsc.Object, "spec", "source", "snapshotHandle")
	specVolume, _, _ := unstructured.NestedString(vsc.Object, "spec", "source", "volumeHandle")
	handle, _, _ := unstructured.NestedString(vsc.Object, "status", "snapshotHandle")
	switch {
	case specHandle != "" && handle != "" && handle != specHandle:
		return fmt.Errorf("VolumeSnapshotContent %s's status.snapshotHandle %q is not its spec.source.snapshotHandle %q: %w", content, handle, specHandle, errkind.ErrDenied)
	case specHandle != "":
		handle = specHandle
	case specVolume == "":
		return fmt.Errorf("VolumeSnapshotContent %s has neither spec.source.snapshotHandle nor spec.source.volumeHandle: %w", content, errkind.ErrDenied)
	}
	id, node := snaphandle.Parse(handle)
	if node != a.Node || id != r.Source {
		return fmt.Errorf("claim %s restores snapshot %q, not %s of node %s: %w", r.Claim, handle, r.Source, a.Node, errkind.ErrDenied)
	}
	snap, err := a.Snapshot(id)
	if err != nil {
		return fmt.Errorf("claim %s restores snapshot %s: %w", r.Claim, id, err)
	}
	if specHandle != "" {
		// Imported by handle: whoever made the content (an admin, or a
		// backup tool given the right to create contents; no node
		// may) gave the snapshot to the namespace of the VolumeSnapshot
		// it names, whatever namespace its volume was in.
		return nil
	}
	switch {
	case snap.SourceID != specVolume:
		return fmt.Errorf("VolumeSnapshotContent %s was cut from spec.source.volumeHandle %s, and snapshot %s was cut from volume %s: its status.snapshotHandle is not its snapshot's: %w",
			content, specVolume, id, snap.SourceID, errkind.ErrDenied)
	case snap.Namespace == "":
		return fmt.Errorf("snapshot %s was cut from a volume whose namespace podvol did not record (made before it did, or provisioned without --extra-create-metadata), so it is not served to another node: restore it on node %s, or have an admin import it by handle into namespace %s (a VolumeSnapshotContent with spec.source.snapshotHandle %q): %w",
			id, a.Node, pvc.Namespace, handle, errkind.ErrDenied)
	case snap.Namespace != pvc.Namespace:
		return fmt.Errorf("snapshot %s was cut from a volume of namespace %s, not of the claim's namespace %s: %w", id, snap.Namespace, pvc.Namespace, errkind.ErrDenied)
	}
	return nil
}

// orNone is s, or "(none)".
func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// dataSource is the claim's data source, from dataSourceRef or dataSource.
func dataSource(pvc *corev1.PersistentVolumeClaim) *corev1.TypedObjectReference {
	if ref := pvc.Spec.DataSourceRef; ref != nil {
		return ref
	}
	if ds := pvc.Spec.DataSource; ds != nil {
		return &corev1.TypedObjectReference{APIGroup: ds.APIGroup, Kind: ds.Kind, Name: ds.Name}
	}
	return nil
}

// ClonedPV is the PV of Driver that claim pvc clones: its data source is a
// claim of its namespace, bound to that PV, which names the claim back. An
// error wraps errkind.ErrNotFound if there is none (yet), errkind.ErrDenied
// if the source is not a claim of the namespace or not Driver's.
func ClonedPV(ctx context.Context, c kubernetes.Interface, driver string, pvc *corev1.PersistentVolumeClaim) (*corev1.PersistentVolume, error) {
	ref := dataSource(pvc)
	if ref == nil || ref.Kind != "PersistentVolumeClaim" || (ref.APIGroup != nil && *ref.APIGroup != "") ||
		(ref.Namespace != nil && *ref.Namespace != "" && *ref.Namespace != pvc.Namespace) {
		return nil, fmt.Errorf("claim %s/%s's data source is not a claim of its namespace: %w", pvc.Namespace, pvc.Name, errkind.ErrDenied)
	}
	src, err := c.CoreV1().PersistentVolumeClaims(pvc.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("claim %s/%s, which claim %s clones, does not exist: %w", pvc.Namespace, ref.Name, pvc.Name, errkind.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read claim %s/%s: %w", pvc.Namespace, ref.Name, err)
	}
	if src.Spec.VolumeName == "" {
		return nil, fmt.Errorf("claim %s/%s, which claim %s clones, is not bound: %w", pvc.Namespace, ref.Name, pvc.Name, errkind.ErrNotFound)
	}
	pv, err := c.CoreV1().PersistentVolumes().Get(ctx, src.Spec.VolumeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("PV %s of claim %s/%s does not exist: %w", src.Spec.VolumeName, pvc.Namespace, ref.Name, errkind.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read PV %s: %w", src.Spec.VolumeName, err)
	}
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != driver {
		return nil, fmt.Errorf("PV %s of claim %s/%s is not %s's: %w", pv.Name, pvc.Namespace, ref.Name, driver, errkind.ErrDenied)
	}
	// A claim may name any PV in volumeName; the PV must name it back.
	if cr := pv.Spec.ClaimRef; cr == nil || cr.Namespace != src.Namespace || cr.Name != src.Name || (cr.UID != "" && cr.UID != src.UID) {
		return nil, fmt.Errorf("PV %s is not bound to claim %s/%s: %w", pv.Name, pvc.Namespace, ref.Name, errkind.ErrNotFound)
	}
	return pv, nil
}
