package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/podvol/podvol/internal/devcluster"
	"github.com/podvol/podvol/internal/monitoring"
)

// The jobs of monitoring.ScrapeFile with a target on every node (the plugin
// and the sidecars its server re-serves), and the controller's.
var (
	perNodeJobs    = []string{"podvol-plugin", "podvol-csi-provisioner", "podvol-csi-resizer", "podvol-csi-snapshotter", "podvol-group-snapshotter"}
	controllerJobs = []string{"podvol-controller", "podvol-snapshot-controller"}
	sidecarJobs    = perNodeJobs[1:]
)

// Metric names the rules or the dashboard use that exist only while what
// they count does, so a quiet cluster has no series of them (make check
// reads them from the controller's registry instead).
var onlyWhenThereIsSomething = map[string]string{
	"podvol_node_loss_released_volumes": "a node came back after node-loss released its volumes",
}

// testPrometheus runs the Prometheus built from Go modules
// (tools/prometheus) with the documented scrape configs and alert rules,
// and asks it what it sees: every podvol target up (so its token was
// accepted), pool and volume series for each node, the sidecars' latency
// histograms, a volume's health condition and the alert it fires, every
// rule loaded and evaluated, and every metric the rules and the dashboard
// use present in what was scraped.
func testPrometheus(t *testing.T) {
	n := ns(t)
	pvc(t, n, "h", "podvol", "64Mi", "")
	pod(t, n, "h", "true", "persistentVolumeClaim: {claimName: h}")
	waitPod(t, n, "h")
	handle := get(t, "", "pv", `{.items[?(@.spec.claimRef.namespace=="`+n+`")].spec.csi.volumeHandle}`)
	nodeName := get(t, n, "pod/h", `{.spec.nodeName}`)
	var node *devcluster.Node
	for _, nd := range cluster.Nodes {
		if nd.Name == nodeName {
			node = nd
		}
	}
	if handle == "" || node == nil {
		t.Fatalf("claim h: volume %q on node %q, want one of the cluster's", handle, nodeName)
	}

	prom, err := cluster.StartPrometheus(ctx(t))
	must(t, "start prometheus", err)
	t.Cleanup(func() {
		if err := cluster.StopPrometheus(); err != nil {
			t.Errorf("stop prometheus: %v", err)
		}
	})
	var nodes []string
	for _, nd := range cluster.Nodes {
		nodes = append(nodes, nd.Name)
	}
	sort.Strings(nodes)

	t.Run("TargetsUp", func(t *testing.T) {
		eventually(t, 3*time.Minute, func() string {
			var r struct {
				ActiveTargets []struct {
					Labels    map[string]string `json:"labels"`
					Health    string            `json:"health"`
					LastError string            `json:"lastError"`
					ScrapeURL string            `json:"scrapeUrl"`
				} `json:"activeTargets"`
			}
			if err := promAPI(prom, "/api/v1/targets?state=active", &r); err != nil {
				return err.Error()
			}
			up := map[string][]string{}
			var bad []string
			for _, tg := range r.ActiveTargets {
				job := tg.Labels["job"]
				if tg.Health != "up" {
					bad = append(bad, fmt.Sprintf("%s %s: %s %s", job, tg.ScrapeURL, tg.Health, tg.LastError))
					continue
				}
				up[job] = append(up[job], tg.Labels["instance"])
			}
			for _, j := range perNodeJobs {
				sort.Strings(up[j])
				if strings.Join(up[j], " ") != strings.Join(nodes, " ") {
					bad = append(bad, fmt.Sprintf("job %s is up on %v, want every node %v", j, up[j], nodes))
				}
			}
			for _, j := range controllerJobs {
				if len(up[j]) != 1 {
					bad = append(bad, fmt.Sprintf("job %s has %d targets up, want 1", j, len(up[j])))
				}
			}
			return strings.Join(bad, "\n")
		})
	})

	t.Run("SeriesPerNode", func(t *testing.T) {
		for _, q := range []string{
			"count by (node) (podvol_pool_capacity_bytes)",
			"count by (node) (podvol_pool_allocated_bytes)",
			"count by (node) (podvol_pool_used_bytes)",
			`count by (node) (podvol_volumes{kind="persistent"})`,
			`count by (node) (podvol_volumes{kind="inline"})`,
		} {
			eventually(t, time.Minute, func() string {
				got, err := promLabelValues(prom, q, "node")
				if err != nil {
					return err.Error()
				}
				if strings.Join(got, " ") != strings.Join(nodes, " ") {
					return fmt.Sprintf("%s: nodes %v, want %v", q, got, nodes)
				}
				return ""
			})
		}
		for _, j := range sidecarJobs {
			q := fmt.Sprintf(`count by (instance) (csi_sidecar_operations_seconds_bucket{job=%q})`, j)
			eventually(t, time.Minute, func() string {
				got, err := promLabelValues(prom, q, "instance")
				if err != nil {
					return err.Error()
				}
				if strings.Join(got, " ") != strings.Join(nodes, " ") {
					return fmt.Sprintf("%s: the sidecar's latency histogram is on %v, want every node %v", q, got, nodes)
				}
				return ""
			})
		}
	})

	// The volume's image moved away is what ImageMissing detects; moved back
	// (before the namespace goes), the volume is whole again: the loop
	// device kept it open meanwhile.
	t.Run("HealthConditionFiresItsAlert", func(t *testing.T) {
		img := node.PoolDir() + "/volumes/" + handle + ".img"
		must(t, "move the image away", os.Rename(img, img+".away"))
		t.Cleanup(func() {
			if err := os.Rename(img+".away", img); err != nil {
				t.Errorf("move the image back: %v", err)
			}
		})
		q := fmt.Sprintf(`podvol_volume_health_condition{volume=%q,reason="ImageMissing",severity="DataLoss"}`, handle)
		eventually(t, time.Minute, func() string {
			got, err := promLabelValues(prom, q, "node")
			if err != nil {
				return err.Error()
			}
			if len(got) != 1 || got[0] != nodeName {
				return fmt.Sprintf("%s: on nodes %v, want [%s]", q, got, nodeName)
			}
			return ""
		})
		// The rule's "for" is a minute: a few evaluations more.
		eventually(t, 3*time.Minute, func() string {
			var r struct {
				Alerts []struct {
					Labels map[string]string `json:"labels"`
					State  string            `json:"state"`
				} `json:"alerts"`
			}
			if err := promAPI(prom, "/api/v1/alerts", &r); err != nil {
				return err.Error()
			}
			var seen []string
			for _, a := range r.Alerts {
				if a.Labels["alertname"] == "PodvolVolumeDataLoss" && a.Labels["volume"] == handle {
					if a.State == "firing" {
						return ""
					}
					seen = append(seen, a.State)
				}
			}
			return fmt.Sprintf("PodvolVolumeDataLoss for volume %s is not firing (states seen: %v)", handle, seen)
		})
	})

	t.Run("RulesLoadAndEvaluate", func(t *testing.T) {
		rules, err := monitoring.ReadRules(devcluster.RepoRoot())
		must(t, "read the rules", err)
		eventually(t, time.Minute, func() string {
			var r struct {
				Groups []struct {
					Name  string `json:"name"`
					Rules []struct {
						Name           string `json:"name"`
						Type           string `json:"type"`
						Health         string `json:"health"`
						LastError      string `json:"lastError"`
						LastEvaluation string `json:"lastEvaluation"`
					} `json:"rules"`
				} `json:"groups"`
			}
			if err := promAPI(prom, "/api/v1/rules", &r); err != nil {
				return err.Error()
			}
			var bad []string
			alerts := 0
			for _, g := range r.Groups {
				for _, rl := range g.Rules {
					if rl.Type == "alerting" {
						alerts++
					}
					if rl.Health != "ok" || strings.HasPrefix(rl.LastEvaluation, "0001-") {
						bad = append(bad, fmt.Sprintf("%s/%s: health %q %s, last evaluated %s", g.Name, rl.Name, rl.Health, rl.LastError, rl.LastEvaluation))
					}
				}
			}
			if alerts != len(rules) {
				bad = append(bad, fmt.Sprintf("Prometheus has %d alerting rules, %s %d", alerts, monitoring.RulesFile, len(rules)))
			}
			return strings.Join(bad, "\n")
		})
	})

	// Last: the health condition above made its series.
	t.Run("DashboardAndRulesMetricsScraped", func(t *testing.T) {
		tools, err := monitoring.BuildTools(ctx(t), devcluster.RepoRoot(), io.Discard)
		must(t, "prometheus tools", err)
		exprs, err := monitoring.Expressions(devcluster.RepoRoot())
		must(t, "read the rules and the dashboard", err)
		used, err := monitoring.MetricNames(ctx(t), tools.PromQLNames, exprs)
		must(t, "their metric names", err)
		var r []string
		must(t, "scraped metric names", promAPI(prom, "/api/v1/label/__name__/values", &r))
		have := map[string]bool{}
		for _, name := range r {
			have[name] = true
		}
		for name, where := range used {
			if why, ok := onlyWhenThereIsSomething[name]; ok {
				t.Logf("%s is not required in what was scraped: it exists only when %s", name, why)
				continue
			}
			if !have[name] {
				t.Errorf("%s (in %s) is not in what Prometheus scraped from podvol", name, strings.Join(where, "; "))
			}
		}
	})
}

// promAPI GETs path from Prometheus' HTTP API and decodes its data into v.
func promAPI(prom, path string, v any) error {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(c, http.MethodGet, prom+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	var r struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return fmt.Errorf("%s: %s: %w: %s", path, resp.Status, err, b)
	}
	if r.Status != "success" {
		return fmt.Errorf("%s: %s: %s", path, resp.Status, r.Error)
	}
	return json.Unmarshal(r.Data, v)
}

// promLabelValues runs an instant query and returns the sorted values of
// label across its result.
func promLabelValues(prom, query, label string) ([]string, error) {
	var r struct {
		Result []struct {
			Metric map[string]string `json:"metric"`
		} `json:"result"`
	}
	if err := promAPI(prom, "/api/v1/query?query="+url.QueryEscape(query), &r); err != nil {
		return nil, err
	}
	var out []string
	for _, s := range r.Result {
		out = append(out, s.Metric[label])
	}
	sort.Strings(out)
	return out, nil
}
