package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// testRawBlockVolume: a PVC in Block mode reaches the pod as a device of
// the claim's size that keeps what is written to it, and kubelet reads its
// stats from podvol (NodeGetVolumeStats at kubelet's own map path of the
// device), so the claim has a capacity in the node's stats summary and in
// kubelet_volume_stats_capacity_bytes.
func testRawBlockVolume(t *testing.T) {
	n := ns(t)
	applyFile(t, "block.yaml", map[string]string{"NS": n})
	waitPod(t, n, "raw")
	if got := exec(t, n, "raw", "blockdev --getsize64 /dev/xvda; head -c 12 /dev/xvda"); got != fmt.Sprint(64<<20)+"\npodvol-block" {
		t.Fatalf("the pod's device: %q, want 64 MiB holding what was written", got)
	}
	node := podNode(t, n, "raw")
	eventually(t, 3*time.Minute, func() string {
		out, err := node.Kubelet(ctx(t), "/stats/summary")
		if err != nil {
			return err.Error()
		}
		var summary struct {
			Pods []struct {
				PodRef struct{ Name, Namespace string }
				Volume []struct {
					Name          string
					CapacityBytes *int64 `json:"capacityBytes"`
					PVCRef        *struct{ Name string }
				} `json:"volume"`
			} `json:"pods"`
		}
		if err := json.Unmarshal(out, &summary); err != nil {
			return "stats summary: " + err.Error()
		}
		for _, p := range summary.Pods {
			if p.PodRef.Namespace != n || p.PodRef.Name != "raw" {
				continue
			}
			for _, v := range p.Volume {
				if v.PVCRef != nil && v.PVCRef.Name == "raw" && v.CapacityBytes != nil {
					if *v.CapacityBytes != 64<<20 {
						t.Fatalf("the block claim's capacity in kubelet's stats: %d, want %d", *v.CapacityBytes, 64<<20)
					}
					return ""
				}
			}
			return fmt.Sprintf("pod raw's volumes in the stats summary have no capacity for claim raw: %+v (kubelet log: NodeGetVolumeStats)", p.Volume)
		}
		return "pod raw is not in the stats summary yet"
	})
	metrics, err := node.Kubelet(ctx(t), "/metrics")
	must(t, "kubelet metrics", err)
	want := fmt.Sprintf(`kubelet_volume_stats_capacity_bytes{namespace=%q,persistentvolumeclaim="raw"} 6.7108864e+07`, n)
	if !strings.Contains(string(metrics), want+"\n") {
		t.Fatalf("kubelet metrics lack %s", want)
	}
}
