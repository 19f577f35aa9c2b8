package nodeloss

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// A released volume is not deleted on its node (the node is gone), so if the
// node comes back its images are still in its pool, unknown to Kubernetes.
// node-loss writes down what it released, before releasing it, in a
// ConfigMap per node in its own namespace, and counts the released volumes
// of every node that is back in a metric; a returning node gets an event.
// docs/operations.md says how to reclaim or recover them.

// ReleasedLabel marks the ConfigMaps that record released volumes;
// ReleasedNodeAnnotation names their node (node names may be longer than a
// label value).
const (
	ReleasedLabel          = "podvol.io/released-volumes"
	ReleasedNodeAnnotation = "podvol.io/node"
	// ReasonReleasedVolumes: a node whose volumes were released is back.
	ReasonReleasedVolumes = "ReleasedVolumesOnNode"
)

// releasedOnNode is the gauge: volumes released from a node that is back in
// the cluster and runs podvol, whose images its pool may still hold.
var releasedOnNode = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "podvol_node_loss_released_volumes",
	Help: "Volumes node-loss released while their node was lost, on nodes that are back: their images may still be in the node's pool (see the ConfigMap podvol-released-<node> in podvol's namespace)",
}, []string{"node"})

func init() { metrics.Registry.MustRegister(releasedOnNode) }

// ReleasedRecordName is the ConfigMap recording the volumes released from
// node.
func ReleasedRecordName(node string) string {
	name := "podvol-released-" + node
	if len(name) > 253 {
		sum := sha256.Sum256([]byte(node))
		name = "podvol-released-" + hex.EncodeToString(sum[:16])
	}
	return name
}

// recordReleased writes the PVs about to be released into their node's
// record, merged with what an earlier release wrote. Keys are PV names;
// values say which volume, which claim and when.
func (r *Reconciler) recordReleased(ctx context.Context, nodeName string, pvs []*corev1.PersistentVolume) error {
	if r.Namespace == "" || len(pvs) == 0 {
		return nil
	}
	entries := map[string]string{}
	now := time.Now().UTC().Format(time.RFC3339)
	for _, pv := range pvs {
		claim := ""
		if ref := pv.Spec.ClaimRef; ref != nil {
			claim = ref.Namespace + "/" + ref.Name
		}
		entries[pv.Name] = fmt.Sprintf("volumeHandle=%s claim=%s released=%s", pv.Spec.CSI.VolumeHandle, claim, now)
	}
	key := client.ObjectKey{Namespace: r.Namespace, Name: ReleasedRecordName(nodeName)}
	cm := &corev1.ConfigMap{}
	err := r.APIReader.Get(ctx, key, cm)
	if apierrors.IsNotFound(err) {
		cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name,
			Labels:      map[string]string{ReleasedLabel: "true", "app.kubernetes.io/managed-by": "podvol-controller"},
			Annotations: map[string]string{ReleasedNodeAnnotation: nodeName}}, Data: entries}
		if err := r.Client.Create(ctx, cm); err != nil {
			return fmt.Errorf("record the volumes released from node %s in ConfigMap %s: %w", nodeName, key, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("read ConfigMap %s (volumes released from node %s): %w", key, nodeName, err)
	}
	patch := client.MergeFrom(cm.DeepCopy())
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	changed := false
	for k, v := range entries {
		if _, ok := cm.Data[k]; !ok {
			cm.Data[k], changed = v, true
		}
	}
	if !changed {
		return nil
	}
	if err := r.Client.Patch(ctx, cm, patch); err != nil {
		return fmt.Errorf("record the volumes released from node %s in ConfigMap %s: %w", nodeName, key, err)
	}
	return nil
}

// releasedRecord returns the PV names released from node, if any.
func (r *Reconciler) releasedRecord(ctx context.Context, nodeName string) ([]string, error) {
	if r.Namespace == "" {
		return nil, nil
	}
	cm := &corev1.ConfigMap{}
	err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: ReleasedRecordName(nodeName)}, cm)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(cm.Data))
	for k := range cm.Data {
		names = append(names, k)
	}
	sort.Strings(names)
	return names, nil
}

// announceReturn leaves an event on a node that runs podvol again after
// some of its volumes were released.
func (r *Reconciler) announceReturn(ctx context.Context, node *corev1.Node) {
	pvs, err := r.releasedRecord(ctx, node.Name)
	if err != nil {
		log.FromContext(ctx).Error(err, "Cannot read the record of volumes released from a node", "node", node.Name)
		return
	}
	if len(pvs) == 0 {
		return
	}
	r.mu.Lock()
	if r.gauged == nil {
		r.gauged = map[string]bool{}
	}
	r.gauged[node.Name] = true
	releasedOnNode.WithLabelValues(node.Name).Set(float64(len(pvs)))
	r.mu.Unlock()
	r.Recorder.Eventf(node, nil, corev1.EventTypeWarning, ReasonReleasedVolumes, "Record",
		"%d volume(s) were released while this node was lost (PVs %s): their images may still be in its pool. ConfigMap %s/%s lists them; reclaim or recover them as docs/operations.md (\"A node comes back\") says, then delete that ConfigMap",
		len(pvs), strings.Join(pvs, ", "), r.Namespace, ReleasedRecordName(node.Name))
}

// RecordsResync is how often the gauge is computed again from the records
// (a record an admin deleted, a node gone again).
var RecordsResync = time.Minute

// gaugeRunnable keeps the gauge in step with the records: one value per
// record whose node is in the cluster and runs podvol.
func (r *Reconciler) gaugeRunnable() manager.RunnableFunc {
	return func(ctx context.Context) error {
		t := time.NewTicker(RecordsResync)
		defer t.Stop()
		for {
			if err := r.updateGauge(ctx); err != nil {
				log.FromContext(ctx).Error(err, "Cannot count the volumes released from nodes that are back")
			}
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			}
		}
	}
}

// isBack tells whether a Node of that name is in the cluster, not being
// deleted, and runs podvol.
func (r *Reconciler) isBack(ctx context.Context, name string) (bool, error) {
	n := &corev1.Node{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: name}, n); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	if n.DeletionTimestamp != nil {
		return false, nil
	}
	return r.runsDriver(ctx, name)
}

func (r *Reconciler) updateGauge(ctx context.Context) error {
	var cms corev1.ConfigMapList
	if err := r.APIReader.List(ctx, &cms, client.InNamespace(r.Namespace), client.MatchingLabels{ReleasedLabel: "true"}); err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, cm := range cms.Items {
		node := cm.Annotations[ReleasedNodeAnnotation]
		if node == "" {
			continue
		}
		back, err := r.isBack(ctx, node)
		if err != nil {
			return err
		}
		if back {
			seen[node] = true
			releasedOnNode.WithLabelValues(node).Set(float64(len(cm.Data)))
		}
	}
	// Drop the nodes whose record went or that are gone again.
	r.mu.Lock()
	defer r.mu.Unlock()
	for n := range r.gauged {
		if !seen[n] {
			releasedOnNode.DeleteLabelValues(n)
		}
	}
	r.gauged = seen
	return nil
}
