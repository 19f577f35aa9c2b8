package monitoring

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// repo is the source tree's root, from this package's directory.
const repo = "../.."

var (
	toolsOnce sync.Once
	tools     Tools
	toolsErr  error
)

// promTools builds the tools once for the package's tests, as make lint
// builds golangci-lint: a missing binary is built, never a reason to skip.
func promTools(t *testing.T) Tools {
	t.Helper()
	toolsOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
		defer cancel()
		tools, toolsErr = BuildTools(ctx, repo, os.Stderr)
	})
	if toolsErr != nil {
		t.Fatal(toolsErr)
	}
	return tools
}

func promtool(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(promTools(t).Promtool, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// The rules file is valid, and promtool's unit tests of it pass.
func TestRulesPassPromtool(t *testing.T) {
	promtool(t, "check", "rules", "--lint=all", "--lint-fatal", filepath.Join(repo, RulesFile))
	out := promtool(t, "test", "rules", filepath.Join("testdata", "rules-test.yaml"))
	t.Logf("promtool test rules:\n%s", out)
}

// Every alert has a unit test in which it fires and one in which it does
// not: a rule whose expression can never be true (or is always) fails one.
func TestEveryAlertIsTestedBothWays(t *testing.T) {
	rules, err := ReadRules(repo)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join("testdata", "rules-test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		RuleFiles []string `json:"rule_files"`
		Tests     []struct {
			Name          string `json:"name"`
			AlertRuleTest []struct {
				Alertname string `json:"alertname"`
				ExpAlerts []any  `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	fires, silent := map[string]bool{}, map[string]bool{}
	for _, tc := range f.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				silent[a.Alertname] = true
			}
		}
	}
	if len(rules) == 0 {
		t.Fatalf("%s has no alerting rules", RulesFile)
	}
	for _, r := range rules {
		if !fires[r.Alert] {
			t.Errorf("%s: no test in testdata/rules-test.yaml fires %s", RulesFile, r.Alert)
		}
		if !silent[r.Alert] {
			t.Errorf("%s: no test in testdata/rules-test.yaml checks that %s stays silent", RulesFile, r.Alert)
		}
	}
}

// Every alert links to its runbook: a section of docs/operations.md whose
// heading's anchor is the runbook_url's fragment.
func TestEveryAlertHasARunbook(t *testing.T) {
	rules, err := ReadRules(repo)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(repo, "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, line := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(line, "#") {
			anchors[anchor(strings.TrimSpace(strings.TrimLeft(line, "#")))] = true
		}
	}
	for _, r := range rules {
		for _, k := range []string{"summary", "description", "runbook_url"} {
			if r.Annotations[k] == "" {
				t.Errorf("%s: %s has no %s annotation", RulesFile, r.Alert, k)
			}
		}
		if s := r.Labels["severity"]; s != "warning" && s != "critical" {
			t.Errorf("%s: %s has severity %q, want warning or critical", RulesFile, r.Alert, s)
		}
		u := r.Annotations["runbook_url"]
		doc, frag, _ := strings.Cut(u, "#")
		if doc != "docs/operations.md" || !anchors[frag] {
			t.Errorf("%s: %s's runbook_url %q is not a section of docs/operations.md", RulesFile, r.Alert, u)
		}
		if frag != anchor(r.Alert) {
			t.Errorf("%s: %s's runbook_url %q: want the section named after the alert (#%s)", RulesFile, r.Alert, u, anchor(r.Alert))
		}
	}
}

var notInAnchor = regexp.MustCompile(`[^a-z0-9 _-]`)

// anchor is the fragment a Markdown renderer (GitHub's) gives a heading.
func anchor(heading string) string {
	heading = strings.ReplaceAll(heading, "`", "")
	return strings.ReplaceAll(notInAnchor.ReplaceAllString(strings.ToLower(heading), ""), " ", "-")
}

func TestAnchor(t *testing.T) {
	for in, want := range map[string]string{
		"PodvolPoolNearlyFull":                   "podvolpoolnearlyfull",
		"Scraping podvol with Prometheus":        "scraping-podvol-with-prometheus",
		"A node comes back":                      "a-node-comes-back",
		"Importing a snapshot (pre-provisioned)": "importing-a-snapshot-pre-provisioned",
	} {
		if got := anchor(in); got != want {
			t.Errorf("anchor(%q) = %q, want %q", in, got, want)
		}
	}
}

// conditionAdd is how internal/node/health.go records a condition.
var conditionAdd = regexp.MustCompile(`add\((Degraded|Inaccessible|DataLoss), "(\w+)"`)

// Every health condition the metric can carry is in the runbook of the
// alert its severity fires. Those found only by asking a microVM's runtime
// are not: the metric does not ask it.
func TestEveryHealthConditionHasARunbook(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(repo, "internal", "node", "health.go"))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(repo, "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	section := func(alert string) string {
		_, after, ok := strings.Cut(string(doc), "\n### "+alert+"\n")
		if !ok {
			t.Fatalf("docs/operations.md has no section ### %s", alert)
		}
		body, _, _ := strings.Cut(after, "\n#")
		return body
	}
	found := conditionAdd.FindAllStringSubmatch(string(src), -1)
	if len(found) < 10 {
		t.Fatalf("found %d conditions in internal/node/health.go: has the way it adds them changed?", len(found))
	}
	for _, m := range found {
		severity, reason := m[1], m[2]
		if strings.HasPrefix(reason, "Runtime") {
			continue
		}
		if !strings.Contains(section("PodvolVolume"+severity), "`"+reason+"`") {
			t.Errorf("docs/operations.md's PodvolVolume%s runbook does not say what to do about %s", severity, reason)
		}
	}
}
