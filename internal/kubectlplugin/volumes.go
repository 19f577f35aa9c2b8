package kubectlplugin

import (
	"math"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/podvol/podvol/internal/names"
	"github.com/podvol/podvol/internal/topology"
)

// Volume is one line of `kubectl podvol volumes`.
type Volume struct {
	// Claim is namespace/name; empty for an inline volume.
	Claim string `json:"claim"`
	// Inline is pod/volume for a CSI inline volume.
	Inline string `json:"inline,omitempty"`
	PV     string `json:"pv,omitempty"`
	Handle string `json:"volumeHandle,omitempty"`
	Phase  string `json:"phase,omitempty"`
	// Pods are the pods (namespace/name) that use it and have not
	// finished.
	Pods  []string `json:"pods"`
	Node  string   `json:"node"`
	Bytes int64    `json:"sizeBytes"`
	// UsedBytes is what the kubelet last measured (NodeGetVolumeStats) of
	// a mounted filesystem volume; nil when unknown, UsedUnknown says why.
	UsedBytes   *int64 `json:"usedBytes"`
	UsedUnknown string `json:"usedUnknown,omitempty"`
	Class       string `json:"class"`
	// Direct: "yes" (handed to a microVM), "no" (a host mount), "auto"
	// (directAssign: auto and no pod uses it now: decided at each stage).
	Direct    string   `json:"directAssigned"`
	Snapshots []string `json:"snapshots"`
}

// VolumeFilter narrows `kubectl podvol volumes`.
type VolumeFilter struct {
	// Namespace of the claim (or the inline volume's pod); empty: all.
	Namespace string
	// Node; empty: all.
	Node string
}

// usersOf maps namespace/claim to the pods (namespace/name) using it.
func (st *State) usersOf() map[string][]*corev1.Pod {
	m := map[string][]*corev1.Pod{}
	for i := range st.Pods {
		p := &st.Pods[i]
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		for _, v := range p.Spec.Volumes {
			claim := ""
			switch {
			case v.PersistentVolumeClaim != nil:
				claim = v.PersistentVolumeClaim.ClaimName
			case v.Ephemeral != nil:
				claim = p.Name + "-" + v.Name
			default:
				continue
			}
			k := p.Namespace + "/" + claim
			m[k] = append(m[k], p)
		}
	}
	return m
}

// used finds what the node's kubelet measured of a volume, by claim or,
// for an inline volume, by pod and volume name.
func (st *State) used(node, claim, pod, volume string) (*int64, string) {
	if node == "" {
		return nil, "no node"
	}
	if st.Stats == nil {
		return nil, "kubelet stats not read"
	}
	s := st.Stats[node]
	if s == nil {
		if err := st.StatsErr[node]; err != nil {
			return nil, err.Error()
		}
		return nil, "no kubelet stats for node " + node
	}
	for _, ps := range s.Pods {
		for _, vs := range ps.VolumeStats {
			match := false
			if claim != "" {
				match = vs.PVCRef != nil && vs.PVCRef.Namespace+"/"+vs.PVCRef.Name == claim
			} else {
				match = ps.PodRef.Namespace+"/"+ps.PodRef.Name == pod && vs.Name == volume
			}
			if match && vs.UsedBytes != nil {
				// A filesystem's used bytes fit in an int64.
				v := int64(min(*vs.UsedBytes, math.MaxInt64))
				return &v, ""
			}
		}
	}
	return nil, "not measured by the kubelet (no pod mounts it, or a raw block volume)"
}

// direct tells whether a volume is handed to a microVM.
func (st *State) direct(class *string, users []*corev1.Pod) string {
	mode := ""
	if class != nil {
		for _, c := range st.Classes {
			if c.Name == *class {
				mode = c.Parameters[names.ParamDirectAssign]
			}
		}
	}
	switch mode {
	case "always":
		return "yes"
	case "auto":
		for _, p := range users {
			if rc := p.Spec.RuntimeClassName; rc != nil && st.DirectRuntimes[*rc] {
				return "yes"
			}
		}
		if len(users) > 0 {
			return "no"
		}
		return "auto"
	}
	return "no"
}

// Volumes is `kubectl podvol volumes`: podvol's PVs and inline volumes.
func (st *State) Volumes(f VolumeFilter) []Volume {
	users := st.usersOf()
	snaps := map[string][]string{}
	for _, c := range st.Contents {
		if c.SourceVolume != "" {
			name := c.Snapshot
			if name == "" {
				name = "content/" + c.Name
			}
			snaps[c.SourceVolume] = append(snaps[c.SourceVolume], name)
		}
	}
	var out []Volume
	for i := range st.PVs {
		pv := &st.PVs[i]
		v := Volume{PV: pv.Name, Handle: pv.Spec.CSI.VolumeHandle, Phase: string(pv.Status.Phase), Node: topology.Node(pv),
			Class: pv.Spec.StorageClassName, Pods: []string{}, Snapshots: []string{}}
		if ref := pv.Spec.ClaimRef; ref != nil {
			v.Claim = ref.Namespace + "/" + ref.Name
		}
		if q, ok := pv.Spec.Capacity[corev1.ResourceStorage]; ok {
			v.Bytes = q.Value()
		}
		if f.Node != "" && v.Node != f.Node || f.Namespace != "" && !strings.HasPrefix(v.Claim, f.Namespace+"/") {
			continue
		}
		us := users[v.Claim]
		for _, p := range us {
			v.Pods = append(v.Pods, p.Namespace+"/"+p.Name)
		}
		v.UsedBytes, v.UsedUnknown = st.used(v.Node, v.Claim, "", "")
		if pv.Spec.VolumeMode != nil && *pv.Spec.VolumeMode == corev1.PersistentVolumeBlock {
			v.UsedBytes, v.UsedUnknown = nil, "a raw block volume: its filesystem, if any, is the pod's"
		}
		class := pv.Spec.StorageClassName
		v.Direct = st.direct(&class, us)
		v.Snapshots = append(v.Snapshots, snaps[v.Handle]...)
		sort.Strings(v.Snapshots)
		out = append(out, v)
	}
	for _, in := range st.inlines() {
		ns, pod, _ := strings.Cut(in.Pod, "/")
		if f.Node != "" && in.Node != f.Node || f.Namespace != "" && ns != f.Namespace {
			continue
		}
		v := Volume{Inline: in.Pod + "/" + in.Volume, Pods: []string{in.Pod}, Node: in.Node, Bytes: in.Bytes,
			Direct: "no", Snapshots: []string{}}
		v.UsedBytes, v.UsedUnknown = st.used(in.Node, "", ns+"/"+pod, in.Volume)
		out = append(out, v)
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i].Claim+out[i].Inline, out[j].Claim+out[j].Inline
		return a < b
	})
	return out
}
