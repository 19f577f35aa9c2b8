// Package monitoring reaches what podvol gives Prometheus and Grafana, the
// files in charts/podvol/files (one source: the chart ships them, the docs
// show them, the tests run them): the scrape configs, the alert rules and the
// dashboard. It builds the Prometheus tools that check them
// (tools/prometheus), turns the documented scrape configs into a
// configuration a Prometheus outside the cluster can run (the dev cluster's),
// and lists the PromQL expressions of the rules and the dashboard with the
// metric names each uses.
package monitoring

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// The files, relative to the repository's root.
const (
	Dir           = "charts/podvol/files"
	ScrapeFile    = Dir + "/prometheus-scrape.yaml"
	RulesFile     = Dir + "/prometheus-rules.yaml"
	DashboardFile = Dir + "/grafana-dashboard.json"
)

// Tools are the binaries tools/prometheus/build.sh builds.
type Tools struct {
	Prometheus, Promtool, PromQLNames string
}

// BuildTools builds prometheus, promtool and promqlnames at the version
// tools/prometheus/go.mod pins, or finds them in the cache (a cold build
// takes minutes), and returns their paths. Progress goes to progress.
func BuildTools(ctx context.Context, repo string, progress io.Writer) (Tools, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(repo, "tools", "prometheus", "build.sh"))
	cmd.Stderr = progress
	out, err := cmd.Output()
	if err != nil {
		return Tools{}, fmt.Errorf("build prometheus and promtool (tools/prometheus/build.sh; run it alone to see why): %w", err)
	}
	bin := strings.TrimSpace(string(out))
	return Tools{
		Prometheus:  filepath.Join(bin, "prometheus"),
		Promtool:    filepath.Join(bin, "promtool"),
		PromQLNames: filepath.Join(bin, "promqlnames"),
	}, nil
}

// Config is a Prometheus configuration for a Prometheus outside the
// cluster: ScrapeFile's scrape configs with the token in tokenFile and the
// metrics CA's certificate in caFile instead of the files a pod mounts,
// discovery through kubeconfig instead of the in-cluster API, RulesFile
// loaded, and every scrape and rule evaluation at interval (a test wants
// seconds, not the default minute).
func Config(repo, tokenFile, caFile, kubeconfig string, interval time.Duration) ([]byte, error) {
	b, err := os.ReadFile(filepath.Join(repo, ScrapeFile))
	if err != nil {
		return nil, err
	}
	var cfg struct {
		ScrapeConfigs []map[string]any `json:"scrape_configs"`
	}
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		return nil, fmt.Errorf("%s: %w", ScrapeFile, err)
	}
	for _, sc := range cfg.ScrapeConfigs {
		sc["authorization"] = map[string]any{"credentials_file": tokenFile}
		tc, _ := sc["tls_config"].(map[string]any)
		if tc["ca_file"] == nil || tc["server_name"] == nil {
			return nil, fmt.Errorf("%s: job %v verifies no certificate (tls_config ca_file, server_name)", ScrapeFile, sc["job_name"])
		}
		tc["ca_file"] = caFile
		sds, _ := sc["kubernetes_sd_configs"].([]any)
		if len(sds) == 0 {
			return nil, fmt.Errorf("%s: job %v has no kubernetes_sd_configs", ScrapeFile, sc["job_name"])
		}
		for _, sd := range sds {
			sd.(map[string]any)["kubeconfig_file"] = kubeconfig
		}
	}
	return yaml.Marshal(map[string]any{
		"global":         map[string]any{"scrape_interval": interval.String(), "evaluation_interval": interval.String(), "scrape_timeout": interval.String()},
		"rule_files":     []string{filepath.Join(repo, RulesFile)},
		"scrape_configs": cfg.ScrapeConfigs,
	})
}

// Expr is one PromQL expression and where it is.
type Expr struct {
	Where, Expr string
}

// Rule is one alerting rule of RulesFile.
type Rule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

// ReadRules reads RulesFile's alerting rules.
func ReadRules(repo string) ([]Rule, error) {
	b, err := os.ReadFile(filepath.Join(repo, RulesFile))
	if err != nil {
		return nil, err
	}
	var f struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []Rule `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", RulesFile, err)
	}
	var rules []Rule
	for _, g := range f.Groups {
		rules = append(rules, g.Rules...)
	}
	return rules, nil
}

// grafanaVar is a dashboard variable in a query: $name or ${name}.
var grafanaVar = regexp.MustCompile(`\$\{?(\w+)\}?`)

// labelValues is a Grafana template query, not PromQL: its metric is.
var labelValues = regexp.MustCompile(`^label_values\((.+),\s*\w+\)$`)

// Expressions returns every PromQL expression of the alert rules and the
// dashboard. The dashboard's variables are filled in as Grafana would:
// Grafana's own ($__rate_interval...) with a duration, the others with a
// regular expression matching anything.
func Expressions(repo string) ([]Expr, error) {
	rules, err := ReadRules(repo)
	if err != nil {
		return nil, err
	}
	var out []Expr
	for _, r := range rules {
		out = append(out, Expr{Where: RulesFile + ": " + r.Alert, Expr: r.Expr})
	}
	b, err := os.ReadFile(filepath.Join(repo, DashboardFile))
	if err != nil {
		return nil, err
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", DashboardFile, err)
	}
	fill := func(e string) string {
		return grafanaVar.ReplaceAllStringFunc(e, func(v string) string {
			if strings.HasPrefix(strings.Trim(v, "${}"), "__") {
				return "5m"
			}
			return ".*"
		})
	}
	for _, p := range d.Panels {
		for _, t := range p.Targets {
			if t.Expr != "" {
				out = append(out, Expr{Where: fmt.Sprintf("%s: panel %q", DashboardFile, p.Title), Expr: fill(t.Expr)})
			}
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(map[string]any)
		s, _ := q["query"].(string)
		if m := labelValues.FindStringSubmatch(s); m != nil {
			s = m[1]
		}
		out = append(out, Expr{Where: fmt.Sprintf("%s: variable %q", DashboardFile, v.Name), Expr: fill(s)})
	}
	return out, nil
}

// MetricNames parses exprs with Prometheus' parser (promqlnames) and
// returns, for each metric name they use, where. An expression that does not
// parse is an error naming it.
func MetricNames(ctx context.Context, promqlnames string, exprs []Expr) (map[string][]string, error) {
	in := make([]string, len(exprs))
	for i, e := range exprs {
		in[i] = e.Expr
	}
	b, _ := json.Marshal(in)
	cmd := exec.CommandContext(ctx, promqlnames)
	cmd.Stdin = bytes.NewReader(b)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("promqlnames: %w: %s", err, stderr.String())
	}
	var res []struct {
		Metrics []string `json:"metrics"`
		Error   string   `json:"error"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		return nil, fmt.Errorf("promqlnames' answer: %w: %s", err, out)
	}
	if len(res) != len(exprs) {
		return nil, fmt.Errorf("promqlnames answered %d results for %d expressions: %s", len(res), len(exprs), out)
	}
	names := map[string][]string{}
	var bad []string
	for i, r := range res {
		if r.Error != "" {
			bad = append(bad, fmt.Sprintf("%s: %s\n    %s", exprs[i].Where, r.Error, exprs[i].Expr))
		}
		for _, m := range r.Metrics {
			names[m] = append(names[m], exprs[i].Where)
		}
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		return names, fmt.Errorf("expressions that Prometheus cannot use:\n%s", strings.Join(bad, "\n"))
	}
	return names, nil
}
