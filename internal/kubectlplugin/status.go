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
	"github.com/podvol/podvol/internal/size"
	"github.com/podvol/podvol/internal/snaphandle"
	"github.com/podvol/podvol/internal/topology"
)

// NodeStatus is one node's line of `kubectl podvol status`.
type NodeStatus struct {
	Node string `json:"node"`
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
	Bytes             int64
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
			out = append(out, Inline{Pod: p.Namespace + "/" + p.Name, Volume: v.Name, Node: p.Spec.NodeName, Bytes: n})
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

// freeOn is what the node's CSIStorageCapacity of a podvol class says.
func (st *State) freeOn(node string) *int64 {
	classes := st.podvolClasses()
	for i := range st.Capacities {
		c := &st.Capacities[i]
		if classes[c.StorageClassName] == nil || c.Capacity == nil || c.NodeTopology == nil {
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

// Status is `kubectl podvol status`: one line per Node.
func (st *State) Status() []NodeStatus {
	byNode := map[string]*NodeStatus{}
	var out []*NodeStatus
	for i := range st.Nodes {
		s := &NodeStatus{Node: st.Nodes[i].Name}
		byNode[s.Node] = s
		out = append(out, s)
	}
	for i := range st.PVs {
		if s := byNode[topology.Node(&st.PVs[i])]; s != nil {
			s.Volumes++
			if q, ok := st.PVs[i].Spec.Capacity[corev1.ResourceStorage]; ok {
				s.AllocatedBytes += q.Value()
			}
		}
	}
	for _, in := range st.inlines() {
		if s := byNode[in.Node]; s != nil {
			s.Volumes++
			s.InlineVolumes++
			s.AllocatedBytes += in.Bytes
		}
	}
	for _, c := range st.Contents {
		if s := byNode[st.contentNode(c)]; s != nil && c.Handle != "" {
			s.Snapshots++
			s.AllocatedBytes += c.RestoreBytes
		}
	}
	// A released volume's image stays allocated in its node's pool until
	// it is reclaimed.
	for _, r := range st.Released() {
		if s := byNode[r.Node]; s != nil {
			s.Released++
			s.AllocatedBytes += r.Bytes
		}
	}
	for i := range st.Nodes {
		n := &st.Nodes[i]
		s := byNode[n.Name]
		if s.FreeBytes = st.freeOn(n.Name); s.FreeBytes != nil {
			pool := *s.FreeBytes + s.AllocatedBytes
			s.PoolBytes = &pool
		}
		s.Health = st.health(n, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
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
