package chart

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/podvol/podvol/internal/names"
)

// The optional monitoring objects carry what charts/podvol/files/ holds
// (internal/monitoring tests those files): the PrometheusRule exactly the
// rules file's groups, the dashboard ConfigMap exactly the dashboard, and
// one PodMonitor per job of the scrape config, with its job name (the alert
// rules select on it) and path. Off by default: nothing is rendered.
func TestMonitoringObjects(t *testing.T) {
	out, err := Template(context.Background(), helm(t), repo, "--values", everyOption)
	if err != nil {
		t.Fatal(err)
	}
	docs, _, err := Split(out)
	if err != nil {
		t.Fatal(err)
	}
	file := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join(repo, Dir, "files", name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	var rules map[string]any
	if err := yaml.Unmarshal(file("prometheus-rules.yaml"), &rules); err != nil {
		t.Fatal(err)
	}
	var scrape struct {
		ScrapeConfigs []struct {
			JobName     string `json:"job_name"`
			MetricsPath string `json:"metrics_path"`
		} `json:"scrape_configs"`
	}
	if err := yaml.Unmarshal(file("prometheus-scrape.yaml"), &scrape); err != nil {
		t.Fatal(err)
	}
	type endpoint struct {
		Path        string
		Relabelings []struct {
			TargetLabel string `json:"targetLabel"`
			Replacement string
		}
	}
	var monitors, jobs []string
	var sawRule, sawDashboard bool
	for _, doc := range docs["monitoring.yaml"] {
		var o struct {
			Kind     string
			Metadata struct{ Name string }
			Spec     struct {
				Groups              any
				PodMetricsEndpoints []endpoint `json:"podMetricsEndpoints"`
			}
			Data map[string]string
		}
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatal(err)
		}
		switch o.Kind {
		case "PrometheusRule":
			sawRule = true
			if !reflect.DeepEqual(o.Spec.Groups, rules["groups"]) {
				t.Errorf("the PrometheusRule's groups are not files/prometheus-rules.yaml's")
			}
		case "ConfigMap":
			sawDashboard = true
			if o.Data["podvol.json"] != string(file("grafana-dashboard.json")) {
				t.Errorf("the dashboard ConfigMap does not hold files/grafana-dashboard.json")
			}
		case "PodMonitor":
			if len(o.Spec.PodMetricsEndpoints) != 1 {
				t.Fatalf("PodMonitor %s has %d endpoints", o.Metadata.Name, len(o.Spec.PodMetricsEndpoints))
			}
			e := o.Spec.PodMetricsEndpoints[0]
			job := ""
			for _, r := range e.Relabelings {
				if r.TargetLabel == "job" {
					job = r.Replacement
				}
			}
			monitors = append(monitors, job+" "+e.Path)
		}
	}
	for _, j := range scrape.ScrapeConfigs {
		jobs = append(jobs, j.JobName+" "+j.MetricsPath)
	}
	slices.Sort(monitors)
	slices.Sort(jobs)
	if !sawRule || !sawDashboard || !slices.Equal(monitors, jobs) {
		t.Errorf("rule %v, dashboard %v; PodMonitors (job path) %q, want the scrape config's %q", sawRule, sawDashboard, monitors, jobs)
	}

	out, err = Template(context.Background(), helm(t), repo)
	if err != nil {
		t.Fatal(err)
	}
	if docs, _, _ := Split(out); len(docs["monitoring.yaml"]) != 0 {
		t.Errorf("with the default values the chart renders monitoring objects: %q", docs["monitoring.yaml"])
	}
}

// The PodMonitors verify the servers' certificates: by default against
// podvol's metrics CA (the ConfigMap podvol-controller publishes in the
// release's namespace) and the name podvol issues for the component, with
// a token for podvol's metrics audience; monitoring.podMonitor.tlsConfig
// replaces that for an admin's own certificate. Nothing skips verification.
func TestPodMonitorsVerifyTheServers(t *testing.T) {
	type tlsConfig struct {
		InsecureSkipVerify bool   `json:"insecureSkipVerify"`
		ServerName         string `json:"serverName"`
		CA                 struct {
			ConfigMap struct{ Name, Key string } `json:"configMap"`
			Secret    struct{ Name, Key string } `json:"secret"`
		} `json:"ca"`
	}
	render := func(args ...string) map[string]tlsConfig {
		out, err := Template(context.Background(), helm(t), repo, args...)
		if err != nil {
			t.Fatal(err)
		}
		docs, _, err := Split(out)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]tlsConfig{}
		for _, doc := range docs["monitoring.yaml"] {
			var o struct {
				Kind     string
				Metadata struct{ Name string }
				Spec     struct {
					Selector            struct{ MatchLabels map[string]string } `json:"selector"`
					PodMetricsEndpoints []struct {
						TLSConfig tlsConfig `json:"tlsConfig"`
					} `json:"podMetricsEndpoints"`
				}
			}
			if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
				t.Fatal(err)
			}
			if o.Kind == "PodMonitor" {
				got[o.Spec.Selector.MatchLabels["app.kubernetes.io/component"]+" "+o.Metadata.Name] = o.Spec.PodMetricsEndpoints[0].TLSConfig
			}
		}
		if len(got) == 0 {
			t.Fatalf("no PodMonitor rendered with %q", args)
		}
		return got
	}
	for name, c := range render("--set", "monitoring.podMonitor.enabled=true") {
		want := names.MetricsNodeServerName
		if strings.HasPrefix(name, "controller ") {
			want = names.MetricsControllerServerName
		}
		if c.InsecureSkipVerify || c.ServerName != want || c.CA.ConfigMap.Name != names.MetricsCA || c.CA.ConfigMap.Key != names.TransferCAKey {
			t.Errorf("PodMonitor %s: tlsConfig %+v, want ConfigMap %s key %s and serverName %s", name, c, names.MetricsCA, names.TransferCAKey, want)
		}
	}
	for name, c := range render("--values", everyOption) {
		if c.InsecureSkipVerify || c.ServerName != "metrics.example.invalid" || c.CA.Secret.Name != "my-metrics-ca" || c.CA.ConfigMap.Name != "" {
			t.Errorf("PodMonitor %s with monitoring.podMonitor.tlsConfig: %+v, want the value's", name, c)
		}
	}
}
