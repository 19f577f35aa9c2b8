package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/podvol/podvol/internal/chart"
)

// The dev cluster runs podvol as an admin installs it: the chart's release.
func testInstalledByTheChart(t *testing.T) {
	out, err := cluster.RunKubectl(ctx(t), "-n", chart.Namespace, "get", "daemonset,deployment,cronjob", "-o",
		`jsonpath={range .items[*]}{.metadata.name} {.metadata.labels.app\.kubernetes\.io/managed-by} {.metadata.labels.app\.kubernetes\.io/instance} {.metadata.annotations.meta\.helm\.sh/release-name}{"\n"}{end}`)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"podvol-node", "podvol-controller", "podvol-remove-finalizers"} {
		want := name + " Helm " + chart.Release + " " + chart.Release
		if !strings.Contains(out, want+"\n") {
			t.Errorf("no %q among podvol's workloads (name, managed-by, instance, release):\n%s", want, out)
		}
	}
}

// Every object the chart renders with every value set is one the cluster's
// API accepts (kubectl create or replace --dry-run=server: schema,
// defaulting, validation, admission; nothing is changed).
func testChartEveryOptionDryRun(t *testing.T) {
	helm, err := cluster.Helm(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	out, err := chart.Template(ctx(t), helm, cluster.Repo, "--values", filepath.Join(cluster.Repo, chart.EveryOptionValues))
	if err != nil {
		t.Fatal(err)
	}
	docs, order, err := chart.Split(out)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	n := 0
	for _, file := range order {
		for i, doc := range docs[file] {
			var o struct {
				APIVersion string `json:"apiVersion"`
				Kind       string
				Metadata   struct{ Name string }
			}
			if err := yaml.Unmarshal([]byte(doc), &o); err != nil || o.Kind == "" {
				t.Errorf("%s, document %d: not an object (%v):\n%s", file, i, err, doc)
				continue
			}
			f := filepath.Join(dir, strings.TrimSuffix(file, ".yaml")+"-"+o.Kind+"-"+o.Metadata.Name+".yaml")
			if err := os.WriteFile(f, []byte(doc), 0o644); err != nil {
				t.Fatal(err)
			}
			// The object as it is, not merged into the installed one
			// (apply would merge a renamed port's list entry into the
			// old ports): created, or replaced where podvol's release
			// has it already.
			out, err := cluster.RunKubectl(ctx(t), "create", "--dry-run=server", "-f", f)
			if err != nil && strings.Contains(out, "AlreadyExists") {
				out, err = cluster.RunKubectl(ctx(t), "replace", "--dry-run=server", "-f", f)
			}
			// The Prometheus Operator's kinds, when this cluster does not
			// serve them (internal/chart's TestMonitoringObjects checks
			// what they hold).
			if err != nil && strings.HasPrefix(o.APIVersion, "monitoring.coreos.com/") && strings.Contains(out, "no matches for kind") {
				t.Logf("%s %s: not served by this cluster (no Prometheus Operator), not checked here", o.Kind, o.Metadata.Name)
				continue
			}
			if err != nil {
				t.Errorf("%s %s (%s): the API refuses it: %v\n%s", o.Kind, o.Metadata.Name, file, err, out)
			}
			n++
		}
	}
	if n < 20 {
		t.Errorf("only %d objects rendered with %s", n, chart.EveryOptionValues)
	}
	t.Logf("%d objects of the chart with every value set accepted by the API server", n)
}
