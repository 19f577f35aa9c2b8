package monitoring

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/podvol/podvol/internal/controller/nodeloss"
	"github.com/podvol/podvol/internal/metrics"
)

// Not podvol's, but what the rules and the dashboard may use beside it:
// Prometheus' own up, and the CSI sidecars' call histogram
// (kubernetes-csi/csi-lib-utils), which the plugin's and the controller's
// servers re-serve at /metrics/<sidecar>.
var notPodvols = []string{
	"up",
	"csi_sidecar_operations_seconds_bucket", "csi_sidecar_operations_seconds_count", "csi_sidecar_operations_seconds_sum",
}

// exported returns the metric names podvol's real registries export: the
// plugin's, with every collector showing a sample (a histogram's series
// under their _bucket, _count and _sum names), and the controller's gauges
// by their descriptions.
func exported(t *testing.T) map[string]bool {
	t.Helper()
	m := metrics.New("node-1", func() (metrics.PoolStats, error) {
		return metrics.PoolStats{CapacityBytes: 10 << 30, AllocatedBytes: 1 << 30, Volumes: 1, InlineVolumes: 1, Snapshots: 1}, nil
	})
	m.AddHealth(func(context.Context) ([]metrics.VolumeCondition, error) {
		return []metrics.VolumeCondition{{Volume: "v", Reason: "ImageMissing", Severity: "DataLoss"}}, nil
	})
	m.AddFilesystem(func() (metrics.FilesystemStats, error) {
		return metrics.FilesystemStats{UsedBytes: 1 << 20, AvailableBytes: 5 << 30}, nil
	})
	m.ObserveRPC("NodeStageVolume", "OK", time.Second)
	fams, err := m.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, f := range fams {
		switch f.GetType() {
		case dto.MetricType_HISTOGRAM:
			for _, s := range []string{"_bucket", "_count", "_sum"} {
				names[f.GetName()+s] = true
			}
		case dto.MetricType_SUMMARY:
			for _, s := range []string{"", "_count", "_sum"} {
				names[f.GetName()+s] = true
			}
		default:
			names[f.GetName()] = true
		}
	}
	for _, c := range nodeloss.Collectors() {
		ch := make(chan *prometheus.Desc, 16)
		c.Describe(ch)
		close(ch)
		for d := range ch {
			names[descName(t, d)] = true
		}
	}
	for _, n := range notPodvols {
		names[n] = true
	}
	return names
}

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// descName is a description's metric name (Desc has no accessor for it).
func descName(t *testing.T, d *prometheus.Desc) string {
	m := fqName.FindStringSubmatch(d.String())
	if m == nil {
		t.Fatalf("no metric name in %s", d)
	}
	return m[1]
}

// Every expression of the alert rules and the dashboard parses, and every
// metric it uses is one podvol exports: a renamed metric breaks this test,
// not an admin's dashboard at 3 a.m.
func TestRulesAndDashboardUseExportedMetrics(t *testing.T) {
	exprs, err := Expressions(repo)
	if err != nil {
		t.Fatal(err)
	}
	if len(exprs) < 10 {
		t.Fatalf("only %d expressions in the rules and the dashboard: is the dashboard's JSON read right?", len(exprs))
	}
	used, err := MetricNames(context.Background(), promTools(t).PromQLNames, exprs)
	if err != nil {
		t.Fatal(err)
	}
	have := exported(t)
	var missing []string
	for name, where := range used {
		if !have[name] {
			missing = append(missing, name+" (in "+strings.Join(where, "; ")+")")
		}
	}
	sort.Strings(missing)
	for _, m := range missing {
		t.Errorf("no podvol registry exports %s", m)
	}
	if t.Failed() {
		var h []string
		for n := range have {
			h = append(h, n)
		}
		sort.Strings(h)
		t.Logf("exported: %s", strings.Join(h, " "))
	}
}

// docs/operations.md shows the scrape configs as they are.
func TestDocsShowTheScrapeConfigs(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(repo, "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(repo, ScrapeFile))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "```yaml\n"+string(b)+"```\n") {
		t.Errorf("docs/operations.md does not show %s as it is (in a ```yaml block): copy it there again", ScrapeFile)
	}
}

// The configuration the dev cluster's Prometheus runs is one Prometheus
// accepts.
func TestConfigPassesPromtool(t *testing.T) {
	dir := t.TempDir()
	token, kubeconfig := filepath.Join(dir, "token"), filepath.Join(dir, "kubeconfig")
	for _, f := range []string{token, kubeconfig} {
		if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	abs, err := filepath.Abs(repo)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := Config(abs, token, kubeconfig, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(p, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s", promtool(t, "check", "config", p))
}
