package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/podvol/podvol/internal/devcluster"
	"github.com/podvol/podvol/internal/kubectlplugin"
	"github.com/podvol/podvol/internal/names"
)

// podvolJSON runs `kubectl podvol args... -o json` and decodes it into v.
func podvolJSON(t *testing.T, v any, args ...string) {
	t.Helper()
	out, _, err := cluster.KubectlPodvol(ctx(t), nil, append(args, "-o", "json")...)
	must(t, "kubectl podvol", err)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("kubectl podvol %v -o json: %v\n%s", args, err, out)
	}
}

// pluginGauges reads a node's pool gauges from its plugin's /metrics (on
// the node's loopback, where kubectl podvol cannot reach them).
func pluginGauges(t *testing.T, node *devcluster.Node, poolName string) (map[string]int64, error) {
	page, err := node.FetchMetrics(ctx(t), devcluster.PluginMetrics)
	if err != nil {
		return nil, err
	}
	g := map[string]int64{}
	// The pool's series, whatever other labels they have (node).
	inPool := `[^}]*pool="` + regexp.QuoteMeta(poolName) + `"[^}]*`
	for k, re := range map[string]string{
		"capacity":  `(?m)^podvol_pool_capacity_bytes\{` + inPool + `\} (\S+)$`,
		"allocated": `(?m)^podvol_pool_allocated_bytes\{` + inPool + `\} (\S+)$`,
		"free":      `(?m)^podvol_pool_free_bytes\{` + inPool + `\} (\S+)$`,
		"volumes":   `(?m)^podvol_volumes\{[^}]*kind="persistent"` + inPool + `\} (\S+)$`,
		"inline":    `(?m)^podvol_volumes\{[^}]*kind="inline"` + inPool + `\} (\S+)$`,
		"snapshots": `(?m)^podvol_snapshots\{` + inPool + `\} (\S+)$`,
	} {
		m := regexp.MustCompile(re).FindStringSubmatch(page)
		if m == nil {
			return nil, fmt.Errorf("node %s's plugin exports no %s", node.Name, re)
		}
		f, err := strconv.ParseFloat(m[1], 64)
		if err != nil {
			return nil, err
		}
		g[k] = int64(f)
	}
	return g, nil
}

// statusAgrees runs `kubectl podvol status` and compares each node's line
// (only's, if named) with what the node's plugin exports: it returns the
// lines, and what differs.
func statusAgrees(t *testing.T, only string) ([]kubectlplugin.NodeStatus, string) {
	var doc struct{ Nodes []kubectlplugin.NodeStatus }
	podvolJSON(t, &doc, "status")
	for _, s := range doc.Nodes {
		if only != "" && s.Node != only {
			continue
		}
		node := cluster.Node(s.Node)
		if node == nil {
			return nil, "status lists " + s.Node + ", not a node of the cluster"
		}
		g, err := pluginGauges(t, node, s.Pool)
		if err != nil {
			return nil, err.Error()
		}
		if s.PoolBytes == nil || s.FreeBytes == nil {
			return nil, fmt.Sprintf("node %s pool %s: no size or free figure: %+v", s.Node, s.Pool, s)
		}
		if *s.PoolBytes != g["capacity"] || *s.FreeBytes != g["free"] || s.AllocatedBytes != g["allocated"] {
			return nil, fmt.Sprintf("node %s: kubectl podvol says pool %d, allocated %d, free %d; the plugin's metrics %d, %d, %d",
				s.Node, *s.PoolBytes, s.AllocatedBytes, *s.FreeBytes, g["capacity"], g["allocated"], g["free"])
		}
		// Released volumes are in the pool, and no PV names them.
		if int64(s.Volumes-s.InlineVolumes+s.Released) != g["volumes"] || int64(s.InlineVolumes) != g["inline"] || int64(s.Snapshots) != g["snapshots"] {
			return nil, fmt.Sprintf("node %s: kubectl podvol counts %d volumes (%d inline), %d released and %d snapshots; the plugin %d persistent, %d inline, %d snapshots",
				s.Node, s.Volumes, s.InlineVolumes, s.Released, s.Snapshots, g["volumes"], g["inline"], g["snapshots"])
		}
	}
	return doc.Nodes, ""
}

// testKubectlPodvol: `kubectl podvol`, the kubectl plugin built from this
// tree, run by kubectl. status lists every node with the pool's numbers the
// node's plugin itself exports (read here from the node, which kubectl
// podvol cannot do), and volumes shows a claim with its pod and node, and
// an inline volume. released and reclaim are tested on a real released
// volume in NodeLost.
func testKubectlPodvol(t *testing.T) {
	n := ns(t)
	pvc(t, n, "data", "podvol", "64Mi", "")
	pod(t, n, "user", "echo hi > /vol/f && dd if=/dev/zero of=/vol/fill bs=1M count=8", "persistentVolumeClaim: {claimName: data}")
	pod(t, n, "scratch", "true", "csi:\n  driver: podvol.io\n  volumeAttributes: {size: 80Mi}")
	waitPod(t, n, "user")
	waitPod(t, n, "scratch")
	userNode := get(t, n, "pod/user", "{.spec.nodeName}")
	pvName := get(t, n, "pvc/data", "{.spec.volumeName}")

	// status: every node's every pool, its numbers those of its plugin
	// (each pool's gauges). The free
	// space comes from CSIStorageCapacity, which external-provisioner
	// refreshes every minute, and a PV of an earlier test may still be
	// going: compare until both sides agree.
	eventually(t, 3*time.Minute, func() string {
		nodes, why := statusAgrees(t, "")
		if why != "" {
			return why
		}
		var got, want []string
		for _, s := range nodes {
			got = append(got, s.Node+"/"+s.Pool)
		}
		for _, nd := range cluster.Nodes {
			for p := range nd.Pools() {
				want = append(want, nd.Name+"/"+p)
			}
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			return fmt.Sprintf("status lists the pools %v, the cluster has %v", got, want)
		}
		for _, s := range nodes {
			if len(s.Health) != 0 || s.Version == "" || s.Plugin == "" {
				return fmt.Sprintf("node %s: health %q, version %q, plugin pod %q", s.Node, s.Health, s.Version, s.Plugin)
			}
		}
		return ""
	})
	table, _, err := cluster.KubectlPodvol(ctx(t), nil, "status")
	must(t, "kubectl podvol status", err)
	t.Logf("kubectl podvol status:\n%s", table)
	for _, node := range cluster.Nodes {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(node.Name) + ` .* ok$`).MatchString(table) {
			t.Errorf("kubectl podvol status has no healthy line for node %s:\n%s", node.Name, table)
		}
	}

	// volumes: the claim with its pod, node, size and the space the pod
	// wrote (the kubelet measures it every minute or so), and the inline
	// volume.
	eventually(t, 3*time.Minute, func() string {
		var doc struct{ Volumes []kubectlplugin.Volume }
		podvolJSON(t, &doc, "volumes", "-n", n)
		if len(doc.Volumes) != 2 {
			return fmt.Sprintf("volumes -n %s: %+v, want the claim and the inline volume", n, doc.Volumes)
		}
		var claim, inline kubectlplugin.Volume
		for _, v := range doc.Volumes {
			if v.Inline != "" {
				inline = v
			} else {
				claim = v
			}
		}
		if claim.Claim != n+"/data" || claim.PV != pvName || strings.Join(claim.Pods, ",") != n+"/user" || claim.Node != userNode ||
			claim.Bytes != 64<<20 || claim.Class != "podvol" || claim.Direct != "no" {
			return fmt.Sprintf("the claim: %+v", claim)
		}
		if claim.UsedBytes == nil || *claim.UsedBytes < 8<<20 || *claim.UsedBytes > 64<<20 {
			return fmt.Sprintf("the claim's used bytes: %v (%s), want 8-64 MiB", claim.UsedBytes, claim.UsedUnknown)
		}
		if inline.Inline != n+"/scratch/vol" || inline.Bytes != 80<<20 || inline.Node != get(t, n, "pod/scratch", "{.spec.nodeName}") {
			return fmt.Sprintf("the inline volume: %+v", inline)
		}
		return ""
	})
	table, _, err = cluster.KubectlPodvol(ctx(t), nil, "volumes", "-n", n)
	must(t, "kubectl podvol volumes", err)
	t.Logf("kubectl podvol volumes -n %s:\n%s", n, table)
	if !regexp.MustCompile(`(?m)^` + n + ` +data +user +` + regexp.QuoteMeta(userNode) + ` +64Mi +[0-9.]+Mi +podvol +no +-$`).MatchString(table) {
		t.Errorf("kubectl podvol volumes has no line for claim data:\n%s", table)
	}
}

// checkReleasedAndReclaim: `kubectl podvol released` lists the volume
// node-loss released from a node that is back, with its reclaim command;
// reclaim asks first and changes nothing without a yes, then deletes the
// image from the node's pool and the entry from the record.
func checkReleasedAndReclaim(t *testing.T, b *devcluster.Node, pv, handle, claim string) {
	var doc struct {
		Released []kubectlplugin.ReleasedVolume
	}
	eventually(t, time.Minute, func() string {
		podvolJSON(t, &doc, "released")
		for _, r := range doc.Released {
			if r.Node == b.Name && r.PV == pv {
				if r.Handle != handle || r.Claim != claim || r.NodeState != "back" || r.Reclaim != "kubectl podvol reclaim "+b.Name+" "+pv {
					return fmt.Sprintf("released: %+v", r)
				}
				return ""
			}
		}
		return fmt.Sprintf("released lists no %s from %s: %+v", pv, b.Name, doc.Released)
	})
	table, _, err := cluster.KubectlPodvol(ctx(t), nil, "released")
	must(t, "kubectl podvol released", err)
	t.Logf("kubectl podvol released:\n%s", table)
	if !strings.Contains(table, "kubectl podvol reclaim "+b.Name+" "+pv) {
		t.Errorf("kubectl podvol released shows no reclaim command for %s:\n%s", pv, table)
	}
	image := b.PoolDir() + "/volumes/" + handle + ".img"
	// The released volume's image is allocated in B's pool: status counts
	// it (node-loss recorded its size) and says it is to be reclaimed.
	eventually(t, 3*time.Minute, func() string {
		nodes, why := statusAgrees(t, b.Name)
		if why != "" {
			return why
		}
		for _, s := range nodes {
			if s.Node == b.Name && (s.Released != 1 || len(s.Health) != 1 || !strings.Contains(s.Health[0], "1 released volume(s) to reclaim")) {
				return fmt.Sprintf("node %s: %d released, health %q", b.Name, s.Released, s.Health)
			}
		}
		return ""
	})

	// Refused: a PV not released from that node, and a node that is not
	// one.
	other := cluster.Nodes[0]
	for _, args := range [][]string{{other.Name, pv}, {"no-such-node", pv}} {
		_, stderr, err := cluster.KubectlPodvol(ctx(t), nil, append([]string{"reclaim", "--yes"}, args...)...)
		if err == nil || !strings.Contains(stderr, "refused") {
			t.Errorf("kubectl podvol reclaim %v: %v %s, want a refusal", args, err, stderr)
		}
	}
	// Reclaim talks to the node's plugin, and refuses until the node's
	// registrar has listed podvol in its CSINode, which may come after the
	// plugin already reports the released volume above.
	eventually(t, 3*time.Minute, func() string {
		drivers, err := cluster.Get(ctx(t), "", "csinode/"+b.Name, "{.spec.drivers[*].name}")
		if err != nil {
			return err.Error()
		}
		if !slices.Contains(strings.Fields(drivers), names.Driver) {
			return fmt.Sprintf("CSINode %s lists drivers %q, no %s", b.Name, drivers, names.Driver)
		}
		return ""
	})
	// No answer but "n": nothing changes.
	_, stderr, err := cluster.KubectlPodvol(ctx(t), strings.NewReader("n\n"), "reclaim", b.Name, pv)
	if err == nil || !strings.Contains(stderr, "deletes volume "+handle) || !strings.Contains(stderr, "nothing was changed") {
		t.Fatalf("kubectl podvol reclaim answered n: %v\n%s", err, stderr)
	}
	if _, err := os.Stat(image); err != nil {
		t.Fatalf("the released image after a reclaim answered no: %v", err)
	}

	// The kubelet that came back first lets go of the volumes of the pods
	// deleted while it was away; reclaim refuses until it has.
	eventually(t, 3*time.Minute, func() string {
		out, stderr, err := cluster.KubectlPodvol(ctx(t), nil, "reclaim", "--yes", b.Name, pv)
		if err != nil {
			return "kubectl podvol reclaim: " + stderr
		}
		t.Logf("kubectl podvol reclaim --yes %s %s:\n%s", b.Name, pv, out)
		return ""
	})
	if _, err := os.Stat(image); !os.IsNotExist(err) {
		t.Errorf("the reclaimed volume's image %s is still in %s's pool: %v", image, b.Name, err)
	}
	podvolJSON(t, &doc, "released")
	for _, r := range doc.Released {
		if r.PV == pv {
			t.Errorf("released still lists the reclaimed volume: %+v", r)
		}
	}
	if out, _ := cluster.RunKubectl(ctx(t), "get", "pv", "reclaim-"+handle, "--ignore-not-found", "-o", "name"); out != "" {
		t.Errorf("reclaim left its PV: %s", out)
	}
}
