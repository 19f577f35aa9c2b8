package kubectlplugin

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/podvol/podvol/internal/names"
)

// ReleasedVolume is one entry of node-loss's records: a volume whose claim
// and PV were deleted while its node was lost, and whose image stays in
// that node's pool until it is reclaimed.
type ReleasedVolume struct {
	Node string `json:"node"`
	PV   string `json:"pv"`
	// Handle is the volume's id in the node's pool.
	Handle   string `json:"volumeHandle"`
	Claim    string `json:"claim"`
	Released string `json:"released"`
	// Bytes is the volume's size, which its image keeps allocated in the
	// node's pool; 0 in records written before node-loss kept it.
	Bytes int64 `json:"sizeBytes"`
	// NodeState: "back" (the Node is there and runs podvol: reclaim
	// works), "absent", "being deleted", "not running podvol".
	NodeState string `json:"nodeState"`
	Reclaim   string `json:"reclaimCommand"`
	// Record is the ConfigMap holding the entry.
	Record string `json:"record"`
}

// parseEntry reads what node-loss writes for a PV:
// "volumeHandle=<h> claim=<ns>/<name> released=<RFC 3339> size=<bytes>".
func parseEntry(v string) (e ReleasedVolume) {
	for _, f := range strings.Fields(v) {
		k, val, _ := strings.Cut(f, "=")
		switch k {
		case "volumeHandle":
			e.Handle = val
		case "claim":
			e.Claim = val
		case "released":
			e.Released = val
		case "size":
			e.Bytes, _ = strconv.ParseInt(val, 10, 64)
		}
	}
	return e
}

// nodeState says whether a released volume's node is back.
func (st *State) nodeState(node string) string {
	for i := range st.Nodes {
		n := &st.Nodes[i]
		if n.Name != node {
			continue
		}
		switch {
		case n.DeletionTimestamp != nil:
			return "being deleted"
		case !registered(st.csiNode(node)):
			return "not running podvol"
		}
		return "back"
	}
	return "absent"
}

// ReclaimCommand is the command that reclaims a released volume.
func ReclaimCommand(node, pv string) string {
	return fmt.Sprintf("kubectl podvol reclaim %s %s", node, pv)
}

// Released is `kubectl podvol released`: every entry of every record, by
// node, then PV.
func (st *State) Released() []ReleasedVolume {
	var out []ReleasedVolume
	seen := map[[2]string]bool{}
	for _, cm := range st.Records {
		node := cm.Annotations[names.ReleasedNodeAnnotation]
		if node == "" {
			continue
		}
		for pv, v := range cm.Data {
			// A PV is written once per node; a second copy (a record
			// merged by hand) is the same volume.
			if seen[[2]string{node, pv}] {
				continue
			}
			seen[[2]string{node, pv}] = true
			e := parseEntry(v)
			e.Node, e.PV, e.NodeState, e.Reclaim, e.Record = node, pv, st.nodeState(node), ReclaimCommand(node, pv), cm.Namespace+"/"+cm.Name
			out = append(out, e)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Node != out[j].Node {
			return out[i].Node < out[j].Node
		}
		return out[i].PV < out[j].PV
	})
	return out
}
