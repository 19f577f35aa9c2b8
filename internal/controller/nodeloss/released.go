package nodeloss

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
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

	"github.com/podvol/podvol/internal/names"
)

// A released volume is not deleted on its node (the node is gone), so if the
// node comes back its images are still in its pool, unknown to Kubernetes.
// node-loss writes down what it released, before releasing it (and takes
// back out what a release cut short did not release, if the node then proves
// alive), in ConfigMaps of its own namespace, and counts the released volumes of every
// node that is back in a metric; a returning node gets an event.
// docs/operations.md says how to reclaim or recover them.
//
// A node's record is one ConfigMap (ReleasedRecordName) while it fits, and
// more, found by label, once it does not: an entry is 100-400 bytes and the
// API refuses an object over 1 MiB, so a node that held a few thousand
// volumes, or was lost again and again without its record being cleared,
// would otherwise have a record that can never be written again, and a
// release that fails for ever with the Node held Terminating.

const (
	// ReasonReleasedVolumes: a node whose volumes were released is back.
	ReasonReleasedVolumes = "ReleasedVolumesOnNode"
)

// RecordBytes is the most bytes of entries (keys and values) one record
// ConfigMap is given: half the API's 1 MiB limit on a ConfigMap's data,
// which leaves room for an admin's notes and keeps each write small.
var RecordBytes = 512 << 10

// releasedOnNode is the gauge: volumes released from a node that is back in
// the cluster and runs podvol, whose images its pool may still hold.
var releasedOnNode = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "podvol_node_loss_released_volumes",
	Help: "Volumes node-loss released while their node was lost, on nodes that are back: their images may still be in the node's pool (see the ConfigMaps labelled podvol.io/released-node=<node> in podvol's namespace)",
}, []string{"node"})

func init() { metrics.Registry.MustRegister(releasedOnNode) }

// Collectors are the metrics this package registers with
// controller-runtime's registry: internal/monitoring checks the alert rules
// and the dashboard against their names (a gauge with no node yet is not in
// the registry's output).
func Collectors() []prometheus.Collector { return []prometheus.Collector{releasedOnNode} }

// ReleasedRecordName is the first ConfigMap recording the volumes released
// from node.
func ReleasedRecordName(node string) string {
	name := "podvol-released-" + node
	if len(name) > 253 {
		sum := sha256.Sum256([]byte(node))
		name = "podvol-released-" + hex.EncodeToString(sum[:16])
	}
	return name
}

// ReleasedNodeLabelValue is the value of ReleasedNodeLabel on node's
// records: the node's name (a node name of up to 63 characters is a valid
// label value), or a hash of a longer one.
func ReleasedNodeLabelValue(node string) string {
	if len(node) <= 63 {
		return node
	}
	sum := sha256.Sum256([]byte(node))
	return "sha256-" + hex.EncodeToString(sum[:16])
}

// records returns the ConfigMaps that record the volumes released from
// node, ReleasedRecordName first: those labelled for it, and the first one
// also when an older podvol-controller wrote it without that label.
func (r *Reconciler) records(ctx context.Context, nodeName string) ([]*corev1.ConfigMap, error) {
	var l corev1.ConfigMapList
	if err := r.APIReader.List(ctx, &l, client.InNamespace(r.Namespace),
		client.MatchingLabels{names.ReleasedLabel: "true", names.ReleasedNodeLabel: ReleasedNodeLabelValue(nodeName)}); err != nil {
		return nil, fmt.Errorf("list the ConfigMaps recording the volumes released from node %s: %w", nodeName, err)
	}
	first := ReleasedRecordName(nodeName)
	var recs []*corev1.ConfigMap
	found := false
	for i := range l.Items {
		cm := &l.Items[i]
		if cm.Annotations[names.ReleasedNodeAnnotation] != nodeName {
			continue // another node whose long name hashes alike
		}
		found = found || cm.Name == first
		recs = append(recs, cm)
	}
	if !found {
		cm := &corev1.ConfigMap{}
		err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: first}, cm)
		if err != nil && !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("read ConfigMap %s/%s (volumes released from node %s): %w", r.Namespace, first, nodeName, err)
		}
		if err == nil && cm.Annotations[names.ReleasedNodeAnnotation] == nodeName {
			recs = append(recs, cm)
		}
	}
	sort.Slice(recs, func(i, j int) bool {
		if (recs[i].Name == first) != (recs[j].Name == first) {
			return recs[i].Name == first
		}
		return recs[i].Name < recs[j].Name
	})
	return recs, nil
}

func recordSize(data map[string]string) int {
	n := 0
	for k, v := range data {
		n += len(k) + len(v)
	}
	return n
}

// recordReleased writes the PVs about to be released into their node's
// records, beside what earlier releases wrote: each record is filled up to
// RecordBytes, then a new one is made. Keys are PV names; values say which
// volume, which claim, when and its size.
func (r *Reconciler) recordReleased(ctx context.Context, nodeName string, pvs []*corev1.PersistentVolume) error {
	if r.Namespace == "" || len(pvs) == 0 {
		return nil
	}
	recs, err := r.records(ctx, nodeName)
	if err != nil {
		return err
	}
	have := map[string]bool{}
	for _, cm := range recs {
		for k := range cm.Data {
			have[k] = true
		}
	}
	type entry struct{ k, v string }
	var todo []entry
	now := time.Now().UTC().Format(time.RFC3339)
	for _, pv := range pvs {
		if have[pv.Name] {
			continue
		}
		have[pv.Name] = true
		claim := ""
		if ref := pv.Spec.ClaimRef; ref != nil {
			claim = ref.Namespace + "/" + ref.Name
		}
		// The size: the image stays allocated in the node's pool until it is
		// reclaimed, and nothing else in the API has it then.
		size := pv.Spec.Capacity[corev1.ResourceStorage]
		todo = append(todo, entry{pv.Name, fmt.Sprintf("volumeHandle=%s claim=%s released=%s size=%d", pv.Spec.CSI.VolumeHandle, claim, now, size.Value())})
	}
	labels := map[string]string{names.ReleasedLabel: "true", names.ReleasedNodeLabel: ReleasedNodeLabelValue(nodeName),
		"app.kubernetes.io/managed-by": "podvol-controller"}
	// fill moves entries from todo into data while they fit (one at least
	// into an empty record, whatever its size).
	fill := func(data map[string]string) bool {
		size, added := recordSize(data), false
		for len(todo) > 0 && (len(data) == 0 || size+len(todo[0].k)+len(todo[0].v) <= RecordBytes) {
			data[todo[0].k] = todo[0].v
			size += len(todo[0].k) + len(todo[0].v)
			todo, added = todo[1:], true
		}
		return added
	}
	for _, cm := range recs {
		if len(todo) == 0 {
			return nil
		}
		patch := client.MergeFrom(cm.DeepCopy())
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		added := fill(cm.Data)
		labelled := cm.Labels[names.ReleasedNodeLabel] == labels[names.ReleasedNodeLabel]
		if !added && labelled {
			continue
		}
		if cm.Labels == nil {
			cm.Labels = map[string]string{}
		}
		cm.Labels[names.ReleasedNodeLabel] = labels[names.ReleasedNodeLabel]
		if err := r.Client.Patch(ctx, cm, patch); err != nil {
			return fmt.Errorf("record the volumes released from node %s in ConfigMap %s/%s: %w", nodeName, cm.Namespace, cm.Name, err)
		}
	}
	for first := len(recs) == 0; len(todo) > 0; first = false {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: r.Namespace, Labels: labels,
			Annotations: map[string]string{names.ReleasedNodeAnnotation: nodeName}}, Data: map[string]string{}}
		if first {
			cm.Name = ReleasedRecordName(nodeName)
		} else {
			// The API server shortens the prefix to fit a random suffix.
			cm.GenerateName = ReleasedRecordName(nodeName) + "-"
		}
		fill(cm.Data)
		err := r.Client.Create(ctx, cm)
		if first && apierrors.IsAlreadyExists(err) {
			// The name is another node's record (a node named
			// "<this node>-<suffix>" whose record had a suffix).
			cm.Name, cm.GenerateName = "", ReleasedRecordName(nodeName)+"-"
			err = r.Client.Create(ctx, cm)
		}
		if err != nil {
			return fmt.Errorf("record the volumes released from node %s in a new ConfigMap in %s: %w", nodeName, r.Namespace, err)
		}
	}
	return nil
}

// unrecord takes PVs out of node's records: volumes a release wrote down
// but did not release, kept once the node proved alive. The record is
// written before the release, so a release cut short names more than it
// released, and docs/operations.md has an admin give each recorded volume a
// new PV and delete it, which deletes its image: a volume still in use must
// not be named there.
func (r *Reconciler) unrecord(ctx context.Context, nodeName string, pvs []string) error {
	if r.Namespace == "" || len(pvs) == 0 {
		return nil
	}
	recs, err := r.records(ctx, nodeName)
	if err != nil {
		return err
	}
	for _, cm := range recs {
		patch := client.MergeFrom(cm.DeepCopy())
		removed := false
		for _, pv := range pvs {
			if _, ok := cm.Data[pv]; ok {
				delete(cm.Data, pv)
				removed = true
			}
		}
		if !removed {
			continue
		}
		if err := r.Client.Patch(ctx, cm, patch); err != nil {
			return fmt.Errorf("take the volumes kept on node %s out of ConfigMap %s/%s, which records them as released: %w", nodeName, cm.Namespace, cm.Name, err)
		}
		log.FromContext(ctx).Info("Volumes recorded as released were kept: taken out of the record", "node", nodeName, "configMap", cm.Name)
	}
	return nil
}

// releasedRecord returns the PV names released from node, if any.
func (r *Reconciler) releasedRecord(ctx context.Context, nodeName string) ([]string, error) {
	if r.Namespace == "" {
		return nil, nil
	}
	recs, err := r.records(ctx, nodeName)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, cm := range recs {
		for k := range cm.Data {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	return slices.Compact(names), nil
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
	// An event's message is limited to 1 kB: name the first few.
	named := strings.Join(pvs, ", ")
	if len(pvs) > 5 {
		named = fmt.Sprintf("%s and %d more", strings.Join(pvs[:5], ", "), len(pvs)-5)
	}
	r.Recorder.Eventf(node, nil, corev1.EventTypeWarning, ReasonReleasedVolumes, "Record",
		"%d volume(s) were released while this node was lost (PVs %s): their images may still be in its pool. The ConfigMaps labelled %s=%s in %s list them; reclaim or recover them as docs/operations.md (\"A node comes back\") says, then delete those ConfigMaps",
		len(pvs), named, names.ReleasedNodeLabel, ReleasedNodeLabelValue(node.Name), r.Namespace)
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
	if err := r.APIReader.List(ctx, &cms, client.InNamespace(r.Namespace), client.MatchingLabels{names.ReleasedLabel: "true"}); err != nil {
		return err
	}
	// A node's records hold distinct PVs (recordReleased writes each once).
	counts := map[string]int{}
	for _, cm := range cms.Items {
		if node := cm.Annotations[names.ReleasedNodeAnnotation]; node != "" {
			counts[node] += len(cm.Data)
		}
	}
	seen := map[string]bool{}
	for node, n := range counts {
		back, err := r.isBack(ctx, node)
		if err != nil {
			return err
		}
		if back {
			seen[node] = true
			releasedOnNode.WithLabelValues(node).Set(float64(n))
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
