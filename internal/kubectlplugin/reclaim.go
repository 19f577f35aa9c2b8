package kubectlplugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/podvol/podvol/internal/names"
)

// ErrRefused is a reclaim that must not be done as things are: the error
// says why and what to do.
var ErrRefused = errors.New("refused")

// ErrNotConfirmed: the user did not confirm.
var ErrNotConfirmed = errors.New("not confirmed")

// ReclaimOptions are Reclaim's.
type ReclaimOptions struct {
	// Namespace is podvol's: the records are there, and so is the claim
	// made to reclaim the volume (the released claim's namespace may be
	// gone).
	Namespace string
	// Confirm asks the user; nil: no question (--yes).
	Confirm func(plan string) (bool, error)
	Out     io.Writer
	// Timeout bounds each wait (binding, deletion).
	Timeout time.Duration
	// Poll is the interval of the waits.
	Poll time.Duration
}

// reclaimName names the PV and claim a reclaim makes, as docs/operations.md
// does.
func reclaimName(handle string) string { return "reclaim-" + handle }

// managedBy marks the objects Reclaim makes.
const managedBy = "kubectl-podvol"

// csiVolumeInUse is how the kubelet names a CSI volume in a Node's
// status.volumesInUse.
func csiVolumeInUse(handle string) corev1.UniqueVolumeName {
	return corev1.UniqueVolumeName("kubernetes.io/csi/" + names.Driver + "^" + handle)
}

// Reclaim does docs/operations.md's "A node comes back" for one released
// volume: a PV naming the volume on its node and a claim bound to it, then
// the claim deleted, so that the node's external-provisioner deletes the
// volume (DeleteVolume: its image and record go), then the entry removed
// from node-loss's record. It refuses, changing nothing, unless the PV is
// recorded as released from node, the node is back and runs podvol, its
// kubelet has let go of the volume, and no other PV names it. Run again
// after an interruption, it takes up what it made.
func Reclaim(ctx context.Context, c Clients, node, pvName string, o ReclaimOptions) error {
	kube := c.Kube
	cms, err := kube.CoreV1().ConfigMaps(o.Namespace).List(ctx, metav1.ListOptions{LabelSelector: names.ReleasedLabel + "=true"})
	if err != nil {
		return fmt.Errorf("list node-loss's records in %s: %w", o.Namespace, err)
	}
	st := &State{Namespace: o.Namespace, Records: cms.Items}
	var entry *ReleasedVolume
	var recorded []string
	for _, r := range st.Released() {
		if r.Node == node {
			recorded = append(recorded, r.PV)
			if r.PV == pvName {
				entry = &r
			}
		}
	}
	if entry == nil {
		if len(recorded) == 0 {
			return fmt.Errorf("%w: no volume is recorded as released from node %s (no ConfigMap labelled %s=true in %s names it): there is nothing to reclaim there; `kubectl podvol released` lists what is", ErrRefused, node, names.ReleasedLabel, o.Namespace)
		}
		return fmt.Errorf("%w: PV %s is not recorded as released from node %s, which has %s: `kubectl podvol released` lists them", ErrRefused, pvName, node, strings.Join(recorded, ", "))
	}
	if entry.Handle == "" {
		return fmt.Errorf("%w: the record of PV %s in %s names no volume handle: reclaim it by hand (docs/operations.md, \"A node comes back\")", ErrRefused, pvName, entry.Record)
	}

	n, err := kube.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%w: node %s is not back: there is no Node %s, so its pool cannot be reached; reclaim once the node has rejoined the cluster and runs podvol (or, if it never comes back, its images went with it: delete the record, kubectl -n %s delete configmap -l %s=%s)", ErrRefused, node, node, o.Namespace, names.ReleasedNodeLabel, node)
	case err != nil:
		return fmt.Errorf("read Node %s: %w", node, err)
	case n.DeletionTimestamp != nil:
		return fmt.Errorf("%w: node %s is being deleted: reclaim once it is back and runs podvol", ErrRefused, node)
	}
	cn, err := kube.StorageV1().CSINodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("read CSINode %s: %w", node, err)
	}
	if err != nil || !registered(cn) {
		return fmt.Errorf("%w: node %s is back but podvol does not run there yet (its CSINode lists no %s): wait for its podvol-node pod, then run this again", ErrRefused, node, names.Driver)
	}
	if slices.Contains(n.Status.VolumesInUse, csiVolumeInUse(entry.Handle)) {
		return fmt.Errorf("%w: the kubelet on node %s still has volume %s in use (Node status.volumesInUse): wait until it has torn down the pods deleted while it was away, then run this again", ErrRefused, node, entry.Handle)
	}
	name := reclaimName(entry.Handle)
	pvs, err := kube.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list PersistentVolumes: %w", err)
	}
	for _, pv := range pvs.Items {
		if pv.Spec.CSI != nil && pv.Spec.CSI.Driver == names.Driver && pv.Spec.CSI.VolumeHandle == entry.Handle && pv.Name != name {
			return fmt.Errorf("%w: PV %s already names volume %s (someone is recovering its data?): leave it, or delete that PV's claim to delete the volume, then drop the record's entry", ErrRefused, pv.Name, entry.Handle)
		}
	}

	if o.Confirm != nil {
		plan := fmt.Sprintf("This deletes volume %s from the pool of node %s, with its data: it was PV %s of claim %s, released %s.\n"+
			"It makes PV and claim %s/%s bound to it, deletes the claim (the node's external-provisioner then deletes the volume), and removes the entry from %s.",
			entry.Handle, node, pvName, orDash(entry.Claim), orDash(entry.Released), o.Namespace, name, entry.Record)
		ok, err := o.Confirm(plan)
		if err != nil {
			return err
		}
		if !ok {
			return ErrNotConfirmed
		}
	}
	say := func(format string, a ...any) {
		if o.Out != nil {
			fmt.Fprintf(o.Out, format+"\n", a...)
		}
	}

	if err := makeReclaimObjects(ctx, c, node, entry.Handle, name, o.Namespace); err != nil {
		return err
	}
	say("persistentvolume/%s and persistentvolumeclaim/%s/%s made", name, o.Namespace, name)
	err = wait.PollUntilContextTimeout(ctx, o.Poll, o.Timeout, true, func(ctx context.Context) (bool, error) {
		pvc, err := kube.CoreV1().PersistentVolumeClaims(o.Namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil // deleted by an earlier run
		}
		return err == nil && pvc.Status.Phase == corev1.ClaimBound, fatal(err)
	})
	if err != nil {
		return fmt.Errorf("claim %s/%s did not bind to PV %s within %s (kubectl describe pvc -n %s %s): %w", o.Namespace, name, name, o.Timeout, o.Namespace, name, err)
	}
	err = kube.CoreV1().PersistentVolumeClaims(o.Namespace).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete claim %s/%s: %w", o.Namespace, name, err)
	}
	say("persistentvolumeclaim/%s/%s deleted: node %s's external-provisioner deletes the volume", o.Namespace, name, node)
	var last *corev1.PersistentVolume
	err = wait.PollUntilContextTimeout(ctx, o.Poll, o.Timeout, true, func(ctx context.Context) (bool, error) {
		pv, err := kube.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		last = pv
		return false, fatal(err)
	})
	if err != nil {
		why := ""
		if last != nil {
			why = fmt.Sprintf(" (phase %s %s)", last.Status.Phase, last.Status.Message)
		}
		return fmt.Errorf("PV %s was not deleted within %s%s: see its events (kubectl describe pv %s) and node %s's csi-provisioner log; run this again once fixed: %w", name, o.Timeout, why, name, node, err)
	}
	say("volume %s deleted from node %s", entry.Handle, node)
	if err := dropEntry(ctx, c, o.Namespace, entry); err != nil {
		return err
	}
	say("entry %s removed from configmap %s", pvName, entry.Record)
	return nil
}

// fatal stops a poll on errors other than a missing object.
func fatal(err error) error {
	if err == nil || apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// makeReclaimObjects creates docs/operations.md's PV and claim (or keeps
// them from an earlier run). Their size only has to let them bind: the
// claim is never mounted. Neither has a class, so that no class need still
// exist and no default class is given.
func makeReclaimObjects(ctx context.Context, c Clients, node, handle, name, ns string) error {
	size := resource.MustParse("1Mi")
	labels := map[string]string{"app.kubernetes.io/managed-by": managedBy}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels,
			// The node's external-provisioner deletes only what names it
			// as the provisioner and lives on its node.
			Annotations: map[string]string{"pv.kubernetes.io/provisioned-by": names.Driver}},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			StorageClassName:              "",
			ClaimRef:                      &corev1.ObjectReference{Namespace: ns, Name: name},
			PersistentVolumeSource:        corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: names.Driver, VolumeHandle: handle}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: names.TopologyKey, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
			}}}},
		},
	}
	existing, err := c.Kube.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		if _, err := c.Kube.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create PV %s naming volume %s on node %s: %w", name, handle, node, err)
		}
	case err != nil:
		return fmt.Errorf("read PV %s: %w", name, err)
	default:
		if existing.Labels["app.kubernetes.io/managed-by"] != managedBy || existing.Spec.CSI == nil || existing.Spec.CSI.VolumeHandle != handle {
			return fmt.Errorf("%w: PV %s exists and was not made by an earlier reclaim of volume %s: look at it, and delete it if it is a leftover", ErrRefused, name, handle)
		}
		if existing.Status.Phase == corev1.VolumeReleased {
			return nil // the claim went: deletion under way
		}
	}
	empty := ""
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: &empty,
			VolumeName:       name,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
		},
	}
	if _, err := c.Kube.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create claim %s/%s bound to PV %s: %w", ns, name, name, err)
	}
	return nil
}

// dropEntry removes the PV's entry from its record, and the record once it
// is empty (only if nothing was added to it meanwhile).
func dropEntry(ctx context.Context, c Clients, ns string, e *ReleasedVolume) error {
	_, cmName, _ := strings.Cut(e.Record, "/")
	patch, err := json.Marshal(map[string]any{"data": map[string]any{e.PV: nil}})
	if err != nil {
		return err
	}
	cm, err := c.Kube.CoreV1().ConfigMaps(ns).Patch(ctx, cmName, types.MergePatchType, patch, metav1.PatchOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove entry %s from ConfigMap %s (the volume is deleted; remove the entry by hand): %w", e.PV, e.Record, err)
	}
	if len(cm.Data) > 0 {
		return nil
	}
	rv, uid := cm.ResourceVersion, cm.UID
	err = c.Kube.CoreV1().ConfigMaps(ns).Delete(ctx, cmName, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv, UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete the emptied record %s: %w", e.Record, err)
	}
	return nil
}
