package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// A Ginkgo JUnit report as e2e.test writes it: a spec skipped by
// --ginkgo.focus/--ginkgo.skip has the message "skipped", one the suite
// skipped at run time "skipped - <reason>".
func junitOf(cases ...string) string {
	return `<?xml version="1.0" encoding="UTF-8"?>
<testsuites><testsuite name="Kubernetes e2e suite">
<testcase name="[SynchronizedBeforeSuite]" status="passed" time="1"></testcase>
` + strings.Join(cases, "\n") + `
<testcase name="[SynchronizedAfterSuite]" status="passed" time="1"></testcase>
</testsuite></testsuites>`
}

const junitPrefix = "[It] External Storage [Driver: podvol.io] [Testpattern: Dynamic PV (default fs)] "

func passed(name string) string {
	return `<testcase name="` + junitPrefix + name + ` [Driver: podvol.io]" status="passed" time="3"></testcase>`
}

func notSelected(name string) string {
	return `<testcase name="` + junitPrefix + name + ` [Driver: podvol.io]" status="skipped" time="0"><skipped message="skipped"></skipped></testcase>`
}

func failedSpec(name, why string) string {
	return `<testcase name="` + junitPrefix + name + ` [Driver: podvol.io]" status="failed" time="300"><failure message="` + why + `" type="failed"></failure></testcase>`
}

func skippedAtRunTime(name, why string) string {
	return `<testcase name="` + junitPrefix + name + ` [Driver: podvol.io]" status="skipped" time="0"><skipped message="skipped - ` + why + `"></skipped></testcase>`
}

// reportDir writes a run's report, and a definition and a start-up log that
// the definition check accepts, so that only the JUnit report decides.
func reportDir(t *testing.T, junitXML string) (def, dir string) {
	t.Helper()
	dir = t.TempDir()
	def = filepath.Join(dir, "ext4.yaml")
	write := func(p, s string) {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(def, "DriverInfo:\n  Name: podvol.io\n  SupportedSizeRange: {Min: 1Gi}\n  Capabilities: {persistence: true}\n")
	write(filepath.Join(dir, "e2e.log"), "I1201 external.go:1] Driver loaded from path ["+def+"]: &{DriverInfo:{Name:podvol.io InTreePluginName: Capabilities:map[persistence:true] SupportedSizeRange:{Max: Min:1Gi Unit:} }}\n")
	write(filepath.Join(dir, "junit.xml"), junitXML)
	return def, dir
}

func many(n int, f func(string) string) []string {
	var cs []string
	for i := range n {
		cs = append(cs, f(fmt.Sprintf("spec %d", i)))
	}
	return cs
}

func runNamed(t *testing.T, name string) driver {
	t.Helper()
	for _, d := range drivers {
		if d.name == name {
			return d
		}
	}
	t.Fatalf("no run %s", name)
	return driver{}
}

// The run's result from its JUnit report, against the floor recorded
// beside the run.
func TestRunResult(t *testing.T) {
	d := runNamed(t, "ext4-rest")
	floor := d.floor
	if floor == 0 {
		t.Fatal("ext4-rest has no floor")
	}
	for _, c := range []struct {
		name     string
		cases    []string
		wantFail bool
		want     string
	}{
		{"every spec of the floor passed", many(floor, passed), false, fmt.Sprintf("ran %d (floor %d): passed %d", floor, floor, floor)},
		{"more than the floor (a host without the limits)", many(floor+6, passed), false, fmt.Sprintf("ran %d (floor %d)", floor+6, floor)},
		{"a pattern that matches nothing: every spec not selected", many(43, notSelected), true, "ran 0 specs, fewer than this run's floor"},
		{"fewer than the floor", append(many(floor-1, passed), notSelected("z")), true, fmt.Sprintf("ran %d specs, fewer than this run's floor of %d", floor-1, floor)},
		{"every spec skipped by the suite at run time", many(floor, func(n string) string { return skippedAtRunTime(n, "Driver podvol.io doesn't support X") }), true, fmt.Sprintf("the suite skipped all %d specs", floor)},
		{"a failed spec", append(many(floor, passed), failedSpec("z", "timed out")), true, "FAILED External Storage"},
	} {
		t.Run(c.name, func(t *testing.T) {
			def, dir := reportDir(t, junitOf(c.cases...))
			r := summarize(d, def, dir, false, 0)
			t.Logf("%s", r.text)
			if r.failed != c.wantFail {
				t.Errorf("failed = %v, want %v; summary:\n%s", r.failed, c.wantFail, r.text)
			}
			if !strings.Contains(r.text, c.want) {
				t.Errorf("summary does not say %q:\n%s", c.want, r.text)
			}
		})
	}
}

// An emptied pattern, through the run's own arguments: the suite, given a
// focus that matches none of its specs, reports every spec as not selected
// and passes; the run must not.
func TestEmptiedPatternFails(t *testing.T) {
	focusOf := func(d driver) *regexp.Regexp {
		for _, a := range suiteArgs(d, "xfs.yaml", "repo-list.yaml", false) {
			if v, ok := strings.CutPrefix(a, "--ginkgo.focus="); ok {
				return regexp.MustCompile(v)
			}
		}
		t.Fatal("no --ginkgo.focus")
		return nil
	}
	specs := []string{
		"[Testpattern: Dynamic Snapshot (delete policy)] snapshottable[Feature:VolumeSnapshotDataSource] volume snapshot controller should check snapshot fields",
		"[Testpattern: Dynamic PV (default fs)] provisioning should provision storage with defaults",
	}
	// What the suite would report for a run with this focus (Ginkgo
	// matches "<suite description> <spec name>").
	report := func(d driver) tally {
		re := focusOf(d)
		var cases []string
		for _, n := range specs {
			if re.MatchString("Kubernetes e2e suite External Storage [Driver: podvol.io] " + n) {
				cases = append(cases, passed(n))
			} else {
				cases = append(cases, notSelected(n))
			}
		}
		tl, err := readJUnit([]byte(junitOf(cases...)))
		if err != nil {
			t.Fatal(err)
		}
		return tl
	}
	d := runNamed(t, "xfs-snapshots")
	if tl := report(d); tl.ran() != 1 {
		t.Fatalf("the run's own focus selects %d of the snapshot spec and another, want 1", tl.ran())
	}
	d.focus = `Snapshotable` // a typo: no spec's text has it
	tl := report(d)
	why := d.shortfall(tl, false)
	if tl.ran() != 0 || len(why) == 0 {
		t.Fatalf("focus %q ran %d, shortfall %q: an emptied pattern must fail the run", d.focus, tl.ran(), why)
	}
	t.Logf("%s", why)
}

func TestShortfall(t *testing.T) {
	block := runNamed(t, "block")
	inline := runNamed(t, "inline")
	for _, c := range []struct {
		name  string
		d     driver
		slow  bool
		t     tally
		wantN int
	}{
		{"[Slow] floor", block, true, tally{passed: make([]string, 7)}, 1},
		{"[Slow] at the floor", block, true, tally{passed: make([]string, 8)}, 0},
		{"[Slow] with no floor recorded and nothing selected", inline, true, tally{notSelected: 40}, 0},
		{"[Slow] with no floor recorded, every spec skipped at run time", inline, true, tally{skipped: map[string][]string{"x": {"a", "b"}}}, 1},
		{"-focus: the floor does not apply", driver{name: "block", floor: 11, exact: []string{"a"}}, false, tally{passed: []string{"a"}}, 0},
		{"-focus selected other specs than it listed", driver{name: "block", floor: 11, exact: []string{"a", "b"}}, false, tally{passed: []string{"a"}}, 1},
	} {
		if got := c.d.shortfall(c.t, c.slow); len(got) != c.wantN {
			t.Errorf("%s: shortfall %q, want %d reasons", c.name, got, c.wantN)
		}
	}
}

// The floors are the measured counts of docs/conformance.md: 87 specs in six runs.
func TestFloorsRecorded(t *testing.T) {
	sum := 0
	for _, d := range drivers {
		if d.floor <= 0 {
			t.Errorf("run %s has no floor", d.name)
		}
		sum += d.floor
	}
	if sum != 87 {
		t.Errorf("floors add up to %d, the runs passed 87 specs when measured (docs/conformance.md)", sum)
	}
}

func TestSummaryTable(t *testing.T) {
	rs := []result{
		{name: "ext4-rest", floor: 27, t: tally{passed: make([]string, 27), skipped: map[string][]string{"x": make([]string, 16)}}},
		{name: "inline", floor: 4, failed: true},
	}
	got := table(rs)
	for _, want := range []string{
		"run                ran passed failed skipped floor  result",
		"ext4-rest           27     27      0      16    27  ok",
		"inline               0      0      0       0     4  FAILED",
		"all                 27     27      0      16",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
}
