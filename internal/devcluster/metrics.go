package devcluster

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/podvol/podvol/internal/names"
)

// PluginMetrics is the plugin's metrics as seen from its node (deploy/base
// serves them on port 9808 of every address of the node).
const PluginMetrics = "https://127.0.0.1:9808" + names.MetricsPath

// MetricsReader is the ServiceAccount (in podvol-system) the dev cluster's
// tests and benchmarks scrape podvol with, bound to names.MetricsReaderRole.
const MetricsReader = "podvol-dev-metrics"

// metricsToken caches the reader's token: tokens last an hour, a test
// scrapes many times a minute.
type metricsToken struct {
	mu    sync.Mutex
	token string
	at    time.Time
}

// MetricsToken returns a token of MetricsReader for podvol's metrics
// audience, making the account and its binding on first use.
func (c *Cluster) MetricsToken(ctx context.Context) (string, error) {
	c.metrics.mu.Lock()
	defer c.metrics.mu.Unlock()
	if c.metrics.token != "" && time.Since(c.metrics.at) < 30*time.Minute {
		return c.metrics.token, nil
	}
	err := c.Apply(ctx, fmt.Sprintf(`apiVersion: v1
kind: ServiceAccount
metadata: {name: %[1]s, namespace: podvol-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: %[1]s}
subjects: [{kind: ServiceAccount, name: %[1]s, namespace: podvol-system}]
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: %[2]s}
`, MetricsReader, names.MetricsReaderRole))
	if err != nil {
		return "", fmt.Errorf("metrics reader account: %w", err)
	}
	out, err := c.kubectl(ctx, "-n", "podvol-system", "create", "token", MetricsReader, "--audience="+names.MetricsAudience)
	if err != nil {
		return "", fmt.Errorf("metrics reader token: %w", err)
	}
	c.metrics.token, c.metrics.at = strings.TrimSpace(out), time.Now()
	return c.metrics.token, nil
}

// FetchMetrics GETs an HTTPS url of podvol's metrics from inside the node's
// network namespace with MetricsReader's token, as Prometheus scrapes them
// (the certificate is self-signed: not verified).
func (n *Node) FetchMetrics(ctx context.Context, url string) (string, error) {
	token, err := n.c.MetricsToken(ctx)
	if err != nil {
		return "", err
	}
	return n.c.run(ctx, "nsenter", "--net="+n.netNS(), "--", "busybox", "wget", "-q", "-O", "-", "--no-check-certificate",
		"--header", "Authorization: Bearer "+token, url)
}

// MetricsCA returns the certificate (PEM) of podvol's metrics CA, which a
// scraper verifies the servers against, waiting for podvol-controller to
// publish it (ConfigMap names.MetricsCA).
func (c *Cluster) MetricsCA(ctx context.Context) (string, error) {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		out, err := c.kubectl(ctx, "-n", "podvol-system", "get", "configmap", names.MetricsCA, "-o", "jsonpath={.data.ca\\.crt}")
		if err == nil && strings.Contains(out, "BEGIN CERTIFICATE") {
			return out, nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = errors.New("no certificate in it")
			}
			return "", fmt.Errorf("podvol's metrics CA (ConfigMap podvol-system/%s, made by podvol-controller), got %q: %w", names.MetricsCA, out, err)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}
