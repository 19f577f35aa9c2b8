package monitoring

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
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
	m := metrics.New("node-1")
	m.AddPool("default", func() (metrics.PoolStats, error) {
		return metrics.PoolStats{CapacityBytes: 10 << 30, AllocatedBytes: 1 << 30, Volumes: 1, InlineVolumes: 1, Snapshots: 1}, nil
	})
	m.AddHealth("default", func(context.Context) ([]metrics.VolumeCondition, error) {
		return []metrics.VolumeCondition{{Volume: "v", Reason: "ImageMissing", Severity: "DataLoss"}}, nil
	})
	m.AddFilesystem("default", func() (metrics.FilesystemStats, error) {
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

// The configuration the dev cluster's Prometheus runs is one promtool and
// the prometheus binary accept: a discovery mechanism the build left out
// (tools/prometheus/build.sh's tags) is an unknown field to prometheus.
func TestConfigRuns(t *testing.T) {
	dir := t.TempDir()
	token, kubeconfig := filepath.Join(dir, "token"), filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(token, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	// An API server nobody listens at: discovery fails and retries, the
	// configuration loads.
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	abs, err := filepath.Abs(repo)
	if err != nil {
		t.Fatal(err)
	}
	ca := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(ca, testCA(t), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Config(abs, token, ca, kubeconfig, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(p, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s", promtool(t, "check", "config", p))

	var out lockedBuffer
	cmd := exec.Command(promTools(t).Prometheus, "--config.file="+p, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address=127.0.0.1:0")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		log := out.String()
		switch {
		case strings.Contains(log, "Server is ready to receive web requests"):
			return
		case strings.Contains(log, "Error loading config"), time.Now().After(deadline):
			t.Fatalf("prometheus does not run the configuration:\n%s\n%s", log, cfg)
		}
	}
}

// lockedBuffer is a process's output, read while it writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// testCA is a CA certificate (PEM) for a configuration to load.
func testCA(t *testing.T) []byte {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, IsCA: true, BasicConstraintsValid: true,
		NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
