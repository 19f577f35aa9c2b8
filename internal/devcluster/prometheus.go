package devcluster

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/podvol/podvol/internal/monitoring"
	"github.com/podvol/podvol/internal/names"
)

// The dev cluster's Prometheus, started on request (podvol-dev up
// --prometheus, the e2e test): the prometheus tools/prometheus builds, run on
// the host as an admin would run one outside the cluster, with podvol's
// documented scrape configs (internal/monitoring.ScrapeFile), a token of
// MetricsReader (bound to the metrics-reader ClusterRole) for podvol's
// metrics audience, podvol's metrics CA to verify the servers with, and the
// alert rules loaded. It listens on the host's loopback only.
const (
	prometheusName = "prometheus"
	// PrometheusURL is where it answers.
	PrometheusURL = "http://127.0.0.1:19090"
	// PrometheusInterval is how often it scrapes and evaluates the rules:
	// seconds, so that a test sees a change within a few.
	PrometheusInterval = 5 * time.Second
)

// StartPrometheus starts the cluster's Prometheus, or restarts it with the
// current scrape configs and rules, and waits until it is ready; it returns
// its URL. The cluster must be up.
func (c *Cluster) StartPrometheus(ctx context.Context) (string, error) {
	tools, err := monitoring.BuildTools(ctx, c.Repo, c.Out)
	if err != nil {
		return "", err
	}
	dir := c.path(prometheusName)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	// The account and its binding; the scrapes need a token of their own
	// that outlives the cluster (hours at most), as Prometheus reads it
	// again at each scrape but nothing would renew it.
	if _, err := c.MetricsToken(ctx); err != nil {
		return "", err
	}
	token, err := c.kubectl(ctx, "-n", "podvol-system", "create", "token", MetricsReader, "--audience="+names.MetricsAudience, "--duration=24h")
	if err != nil {
		return "", fmt.Errorf("a token for Prometheus: %w", err)
	}
	tokenFile := c.path(prometheusName, "token")
	if err := os.WriteFile(tokenFile, []byte(strings.TrimSpace(token)), 0o600); err != nil {
		return "", err
	}
	ca, err := c.MetricsCA(ctx)
	if err != nil {
		return "", err
	}
	caFile := c.path(prometheusName, "ca.crt")
	if err := os.WriteFile(caFile, []byte(ca), 0o600); err != nil {
		return "", err
	}
	cfg, err := monitoring.Config(c.Repo, tokenFile, caFile, c.Kubeconfig(), PrometheusInterval)
	if err != nil {
		return "", err
	}
	cfgFile := c.path(prometheusName, "prometheus.yml")
	if err := os.WriteFile(cfgFile, cfg, 0o600); err != nil {
		return "", err
	}
	// A running one keeps the configuration it read: start afresh.
	if err := c.stopProcess(prometheusName, 30*time.Second); err != nil {
		return "", err
	}
	if err := c.startProcess(prometheusName, nil, tools.Prometheus,
		"--config.file="+cfgFile,
		"--storage.tsdb.path="+c.path(prometheusName, "data"),
		"--storage.tsdb.retention.time=1d",
		"--web.listen-address="+PrometheusURL[len("http://"):],
	); err != nil {
		return "", err
	}
	if err := waitHTTP(ctx, PrometheusURL+"/-/ready", 2*time.Minute); err != nil {
		return "", fmt.Errorf("prometheus did not become ready (logs/%s.log): %w", prometheusName, err)
	}
	c.p.note("prometheus: %s (config %s)", PrometheusURL, cfgFile)
	return PrometheusURL, nil
}

// StopPrometheus stops the cluster's Prometheus if it runs (make down).
func (c *Cluster) StopPrometheus() error { return c.stopProcess(prometheusName, 30*time.Second) }

// waitHTTP waits until url answers 200.
func waitHTTP(ctx context.Context, url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("%s: %s", url, resp.Status)
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %w)", ctx.Err(), last)
		case <-time.After(time.Second):
		}
	}
}
