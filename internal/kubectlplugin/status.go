package kubectlplugin

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/podvol/podvol/internal/names"
	"github.com/podvol/podvol/internal/pool"
	"github.com/podvol/podvol/internal/size"
	"github.com/podvol/podvol/internal/snaphandle"
	"github.com/podvol/podvol/internal/topology"
)

// NodeStatus is one line of `kubectl podvol status`: a node's pool.
type NodeStatus struct {
	Node string `json:"node"`
	// Pool is the pool's name (pool.DefaultName for a node's only pool).
	Pool string `json:"pool"`
	// PoolBytes is FreeBytes + AllocatedBytes; nil with FreeBytes when
	// the node publishes no capacity.
	PoolBytes *int64 `json:"poolBytes"`
	// AllocatedBytes: the sizes of the node's PVs, inline volumes,
	// snapshots and released volumes, as the API has them.
	AllocatedBytes int64 `json:"allocatedBytes"`
	// FreeBytes: the node's CSIStorageCapacity (what the plugin answers
	// GetCapacity, refreshed by external-provisioner every minute).
	FreeBytes     *int64 `json:"freeBytes"`
	Volumes       int    `json:"volumes"`
	InlineVolumes int    `json:"inlineVolumes"`
	Snapshots     int    `json:"snapshots"`
	// Released counts the volumes node-loss released from this node
	// (ConfigMaps labelled podvol.io/released-node), still to reclaim.
	Released int `json:"released"`
	// Health lists what is wrong, as the API shows it; empty: nothing.
	Health []string `json:"health"`
	// Version is the plugin's image tag, Image the whole reference.
	Version string `json:"version"`
	Image   string `json:"image"`
	Plugin  string `json:"pluginPod"`
}

func (st *State) podvolClasses() map[string]*storagev1.StorageClass {
	m := map[string]*storagev1.StorageClass{}
	for i := range st.Classes {
		if st.Classes[i].Provisioner == names.Driver {
			m[st.Classes[i].Name] = &st.Classes[i]
		}
	}
	return m
}

// pluginPod is the podvol-node pod on node (the newest if several).
func (st *State) pluginPod(node string) *corev1.Pod {
	var p *corev1.Pod
	for i := range st.Plugin {
		q := &st.Plugin[i]
		if q.Spec.NodeName == node && (p == nil || p.CreationTimestamp.Before(&q.CreationTimestamp)) {
			p = q
		}
	}
	return p
}

func pluginContainer(p *corev1.Pod) (*corev1.Container, *corev1.ContainerStatus) {
	var c *corev1.Container
	for i := range p.Spec.Containers {
		if p.Spec.Containers[i].Name == PluginContainer {
			c = &p.Spec.Containers[i]
		}
	}
	for i := range p.Status.ContainerStatuses {
		if p.Status.ContainerStatuses[i].Name == PluginContainer {
			return c, &p.Status.ContainerStatuses[i]
		}
	}
	return c, nil
}

// inlineDefault is the size the node's plugin gives an inline volume that
// names none (its --inline-default-size).
func (st *State) inlineDefault(node string) string {
	if p := st.pluginPod(node); p != nil {
		if c, _ := pluginContainer(p); c != nil {
			for _, a := range c.Args {
				if v, ok := strings.CutPrefix(a, inlineSizeFlag); ok {
					return v
				}
			}
		}
	}
	return defaultInlineSize
}

// Inline is a CSI inline podvol volume of a pod.
type Inline struct {
	Pod, Volume, Node string
	// Pool is the pool its attributes name.
	Pool  string
	Bytes int64
}

// inlines are the inline podvol volumes of pods that have not finished,
// sized as the plugin sizes them.
func (st *State) inlines() []Inline {
	var out []Inline
	for i := range st.Pods {
		p := &st.Pods[i]
		if p.Spec.NodeName == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		for _, v := range p.Spec.Volumes {
			if v.CSI == nil || v.CSI.Driver != names.Driver {
				continue
			}
			q, fs := st.inlineDefault(p.Spec.NodeName), "ext4"
			if s, ok := v.CSI.VolumeAttributes["size"]; ok {
				q = s
			}
			if f := v.CSI.VolumeAttributes[names.ParamFsType]; f != "" {
				fs = f
			}
			var n int64
			if b, err := size.ParseQuantity(q); err == nil {
				n, _ = size.For(b, 0, fs)
			}
			poolName := v.CSI.VolumeAttributes[names.ParamPool]
			if poolName == "" {
				poolName = pool.DefaultName
			}
			out = append(out, Inline{Pod: p.Namespace + "/" + p.Name, Volume: v.Name, Node: p.Spec.NodeName, Pool: poolName, Bytes: n})
		}
	}
	return out
}

// contentNode is the node whose pool holds a snapshot: named in its handle,
// or, for a handle from before podvol named nodes, its source volume's node.
func (st *State) contentNode(c Content) string {
	if _, node := snaphandle.Parse(c.Handle); node != "" {
		return node
	}
	for i := range st.PVs {
		if c.SourceVolume != "" && st.PVs[i].Spec.CSI.VolumeHandle == c.SourceVolume {
			return topology.Node(&st.PVs[i])
		}
	}
	return ""
}

// classPool is the pool a podvol class's volumes go to.
func classPool(c *storagev1.StorageClass) string {
	if p := c.Parameters[names.ParamPool]; p != "" {
		return p
	}
	return pool.DefaultName
}

// poolOfHandle is the pool a volume or snapshot handle names (the default
// pool for one that names none, or is not podvol's shape).
func poolOfHandle(handle string) string {
	id, _ := snaphandle.Parse(handle)
	if p, ok := pool.PoolOf(id); ok {
		return p
	}
	return pool.DefaultName
}

// freeOn is what the node's CSIStorageCapacity of a podvol class of the
// pool says.
func (st *State) freeOn(node, poolName string) *int64 {
	classes := st.podvolClasses()
	for i := range st.Capacities {
		c := &st.Capacities[i]
		class := classes[c.StorageClassName]
		if class == nil || classPool(class) != poolName || c.Capacity == nil || c.NodeTopology == nil {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(c.NodeTopology)
		if err != nil || !sel.Matches(labels.Set{names.TopologyKey: node}) {
			continue
		}
		v := c.Capacity.Value()
		return &v
	}
	return nil
}

func registered(cn *storagev1.CSINode) bool {
	return cn != nil && slices.ContainsFunc(cn.Spec.Drivers, func(d storagev1.CSINodeDriver) bool { return d.Name == names.Driver })
}

func (st *State) csiNode(node string) *storagev1.CSINode {
	for i := range st.CSINodes {
		if st.CSINodes[i].Name == node {
			return &st.CSINodes[i]
		}
	}
	return nil
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// imageTag is the tag (or digest) of an image reference.
func imageTag(ref string) string {
	if _, d, ok := strings.Cut(ref, "@"); ok {
		return d
	}
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		return ref[i+1:]
	}
	return "latest"
}

// Status is `kubectl podvol status`: a line per node and pool. Every node
// has a line of its default pool; another pool has one where the API shows
// it: capacity published for a class of it, or a volume or snapshot in it.
// (A node without a class's pool publishes capacity 0 for the class.)
func (st *State) Status() []NodeStatus {
	byKey := map[[2]string]*NodeStatus{}
	var out []*NodeStatus
	row := func(node, poolName string, create bool) *NodeStatus {
		k := [2]string{node, poolName}
		if s := byKey[k]; s != nil || !create {
			return s
		}
		s := &NodeStatus{Node: node, Pool: poolName}
		byKey[k] = s
		out = append(out, s)
		return s
	}
	nodes := map[string]*corev1.Node{}
	for i := range st.Nodes {
		nodes[st.Nodes[i].Name] = &st.Nodes[i]
		row(st.Nodes[i].Name, pool.DefaultName, true)
	}
	pools := map[string]bool{}
	for _, c := range st.podvolClasses() {
		pools[classPool(c)] = true
	}
	for n := range nodes {
		for p := range pools {
			if f := st.freeOn(n, p); f != nil && *f > 0 {
				row(n, p, true)
			}
		}
	}
	// Objects of a pool make its line on their node (if the node is one).
	on := func(node, poolName string) *NodeStatus {
		if nodes[node] == nil {
			return nil
		}
		return row(node, poolName, true)
	}
	for i := range st.PVs {
		pv := &st.PVs[i]
		if s := on(topology.Node(pv), poolOfHandle(pv.Spec.CSI.VolumeHandle)); s != nil {
			s.Volumes++
			if q, ok := pv.Spec.Capacity[corev1.ResourceStorage]; ok {
				s.AllocatedBytes += q.Value()
			}
		}
	}
	for _, in := range st.inlines() {
		if s := on(in.Node, in.Pool); s != nil {
			s.Volumes++
			s.InlineVolumes++
			s.AllocatedBytes += in.Bytes
		}
	}
	for _, c := range st.Contents {
		if c.Handle == "" {
			continue
		}
		if s := on(st.contentNode(c), poolOfHandle(c.Handle)); s != nil {
			s.Snapshots++
			s.AllocatedBytes += c.RestoreBytes
		}
	}
	// A released volume's image stays allocated in its node's pool until
	// it is reclaimed.
	for _, r := range st.Released() {
		if s := on(r.Node, poolOfHandle(r.Handle)); s != nil {
			s.Released++
			s.AllocatedBytes += r.Bytes
		}
	}
	for _, s := range out {
		if s.FreeBytes = st.freeOn(s.Node, s.Pool); s.FreeBytes != nil {
			size := *s.FreeBytes + s.AllocatedBytes
			s.PoolBytes = &size
		}
		s.Health = st.health(nodes[s.Node], s)
	}
	// Nodes in name order, each node's default pool first.
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Node != b.Node {
			return a.Node < b.Node
		}
		if (a.Pool == pool.DefaultName) != (b.Pool == pool.DefaultName) {
			return a.Pool == pool.DefaultName
		}
		return a.Pool < b.Pool
	})
	res := make([]NodeStatus, len(out))
	for i, s := range out {
		res[i] = *s
	}
	return res
}

// health is what the API shows to be wrong with podvol on a node. The
// plugin's /healthz (pool writable, store readable) is its liveness probe,
// so a failing one shows as restarts.
func (st *State) health(n *corev1.Node, s *NodeStatus) []string {
	h := []string{}
	if n.DeletionTimestamp != nil {
		h = append(h, "Node being deleted (node-loss waits for its Lease)")
	} else if !nodeReady(n) {
		h = append(h, "Node not Ready")
	}
	p := st.pluginPod(n.Name)
	if p == nil {
		return append(h, "no podvol-node pod")
	}
	s.Plugin = p.Name
	c, cs := pluginContainer(p)
	if c != nil {
		s.Image, s.Version = c.Image, imageTag(c.Image)
	}
	switch {
	case cs == nil:
		h = append(h, fmt.Sprintf("plugin not started (pod %s)", p.Status.Phase))
	case cs.State.Waiting != nil:
		h = append(h, fmt.Sprintf("plugin waiting: %s", cs.State.Waiting.Reason))
	case !cs.Ready:
		h = append(h, "plugin not ready")
	}
	if cs != nil && cs.RestartCount > 0 {
		why := ""
		if t := cs.LastTerminationState.Terminated; t != nil {
			why = fmt.Sprintf(", last: %s at %s", t.Reason, t.FinishedAt.UTC().Format("2006-01-02T15:04:05Z"))
		}
		h = append(h, fmt.Sprintf("plugin restarted %d times%s", cs.RestartCount, why))
	}
	if !registered(st.csiNode(n.Name)) {
		h = append(h, "not registered with the kubelet (CSINode)")
	}
	if s.FreeBytes == nil {
		h = append(h, "no CSIStorageCapacity")
	}
	if s.Released > 0 && registered(st.csiNode(n.Name)) && n.DeletionTimestamp == nil {
		h = append(h, fmt.Sprintf("%d released volume(s) to reclaim (kubectl podvol released)", s.Released))
	}
	return h
}
