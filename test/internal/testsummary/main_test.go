package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The streams in testdata were recorded with go test -json -count=1 on a
// module of small packages named as podvol's are:
//
//	pass-skip.json   internal/ok (a passing test and a subtest skipped),
//	                 test/microvm (both tests skipped: QEMU cannot start),
//	                 cmd/notests (no test files)
//	fail.json        internal/ok, test/plugin (a subtest fails; a passing
//	                 test logs), test/microvm skipped, internal/broken (does
//	                 not compile)
//	timeout.json     test/e2e with -timeout 3s (a test still running:
//	                 panic), internal/ok
//	microvm-ran.json internal/ok, test/microvm with both tests passing
func summarizeFile(t *testing.T, name string, require []string, goTestErr error) (string, bool) {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b strings.Builder
	ok := summarize(f, &b, require, func() error { return goTestErr })
	t.Logf("summary of %s (ok %v):\n%s", name, ok, b.String())
	return b.String(), ok
}

// after says whether, in out, every want comes after the last line that
// matches marker (the end of the progress output).
func after(t *testing.T, out, marker string, want ...string) {
	t.Helper()
	locs := regexp.MustCompile(marker).FindAllStringIndex(out, -1)
	if len(locs) == 0 {
		t.Fatalf("no %q in the output", marker)
	}
	tail := out[locs[len(locs)-1][1]:]
	for _, w := range want {
		if !strings.Contains(tail, w) {
			t.Errorf("%q is not listed after the last %q", w, marker)
		}
	}
}

func TestSkipsListedAtTheEnd(t *testing.T) {
	out, ok := summarizeFile(t, "pass-skip.json", nil, nil)
	if !ok {
		t.Error("a run with skips but no failure failed")
	}
	for _, w := range []string{"ok  \tgithub.com/podvol/podvol/internal/ok", "ok  \tgithub.com/podvol/podvol/test/microvm", "?   \tgithub.com/podvol/podvol/cmd/notests\t[no test files]"} {
		if !strings.Contains(out, w) {
			t.Errorf("progress output lacks %q", w)
		}
	}
	after(t, out, `(?m)^(ok|\?) .*$`,
		"SKIP github.com/podvol/podvol/test/microvm TestBoot: microvm_test.go:5: QEMU cannot start a microvm machine here",
		"SKIP github.com/podvol/podvol/test/microvm TestExpand:",
		"SKIP github.com/podvol/podvol/internal/ok TestB/two: ok_test.go:8: two needs a disk this host has not",
		"every test skipped: github.com/podvol/podvol/test/microvm (2 of 2)")
	if strings.Contains(out, "=== RUN") || strings.Contains(out, "fine") {
		t.Error("passing tests' output is shown")
	}
}

func TestRequiredPackageSkipped(t *testing.T) {
	out, ok := summarizeFile(t, "pass-skip.json", []string{"./test/microvm"}, nil)
	if ok {
		t.Error("test/microvm skipped its tests and the run passed")
	}
	after(t, out, `(?m)^(ok|\?) .*$`, "github.com/podvol/podvol/test/microvm must run every test (-require-run) and skipped 2")

	if _, ok := summarizeFile(t, "microvm-ran.json", []string{"./test/microvm"}, nil); !ok {
		t.Error("test/microvm ran every test and the run failed")
	}
	if out, ok := summarizeFile(t, "microvm-ran.json", []string{"github.com/podvol/podvol/test/absent"}, nil); ok || !strings.Contains(out, "github.com/podvol/podvol/test/absent must run every test (-require-run) and did not run") {
		t.Error("a required package that did not run at all passed")
	}
}

func TestFailuresShownAndRepeatedAtTheEnd(t *testing.T) {
	out, ok := summarizeFile(t, "fail.json", nil, errors.New("exit status 1"))
	if ok {
		t.Fatal("a run with failures passed")
	}
	for _, w := range []string{
		"leftover: /dev/loop7 attached to pool/vol-1.img", "--- FAIL: TestCrash/DeleteVolume", "plugin: started pid 4242",
		"declared and not used: unused", "FAIL\tgithub.com/podvol/podvol/internal/broken [build failed]",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q", w)
		}
	}
	if strings.Contains(out, "this passing test's log is not shown") || strings.Contains(out, "step 1 ok") {
		t.Error("a passing test's output is shown")
	}
	after(t, out, `SKIP github.com/podvol/podvol/test/microvm TestExpand`,
		"FAIL github.com/podvol/podvol/test/plugin: TestCrash/DeleteVolume",
		"FAIL github.com/podvol/podvol/internal/broken: build failed")
}

func TestTimeoutShown(t *testing.T) {
	out, ok := summarizeFile(t, "timeout.json", nil, errors.New("exit status 1"))
	if ok {
		t.Fatal("a timed-out run passed")
	}
	for _, w := range []string{"panic: test timed out after 3s", "== bringing the dev cluster up", "waiting for pod podvol-e2e/writer"} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q", w)
		}
	}
	after(t, out, `ok  \tgithub.com/podvol/podvol/internal/ok`, "FAIL github.com/podvol/podvol/test/e2e: TestLifecycle (no result: it was running when the package failed)")
}

// go test stopped (interrupted) with a package running: its output so far
// is shown, and the package is a failure.
func TestUnfinishedPackageShown(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "timeout.json"))
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	for _, l := range strings.Split(string(raw), "\n") {
		// The e2e package's end: its FAIL line and its fail event.
		if strings.Contains(l, `"Package":"github.com/podvol/podvol/test/e2e"`) && (strings.Contains(l, `"Action":"fail"`) || strings.Contains(l, `FAIL\t`)) {
			continue
		}
		kept = append(kept, l)
	}
	var b strings.Builder
	ok := summarize(strings.NewReader(strings.Join(kept, "\n")), &b, nil, func() error { return errors.New("signal: interrupt") })
	out := b.String()
	t.Logf("summary:\n%s", out)
	if ok {
		t.Error("an interrupted run passed")
	}
	for _, w := range []string{"github.com/podvol/podvol/test/e2e did not finish", "waiting for pod podvol-e2e/writer", "FAIL github.com/podvol/podvol/test/e2e: no result (go test stopped before it finished)"} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q", w)
		}
	}
	if strings.Contains(out, "e2e_test.go:14: ok") {
		t.Error("a passing test's output is shown")
	}
}

// go test's exit status counts even when its stream shows no failure (a
// bad flag, a package that does not exist).
func TestGoTestExitStatus(t *testing.T) {
	if _, ok := summarizeFile(t, "pass-skip.json", nil, errors.New("exit status 2")); ok {
		t.Error("go test failed and the summary passed")
	}
	var b strings.Builder
	if code := execute([]string{"sh", "-c", "cat testdata/microvm-ran.json; exit 3"}, nil, &b); code == 0 {
		t.Error("the command exited 3 and execute returned 0")
	}
	if code := execute([]string{"sh", "-c", "cat testdata/microvm-ran.json"}, []string{"./test/microvm"}, &b); code != 0 {
		t.Errorf("a clean run returned %d", code)
	}
}

// make test and make check run go test through this program, and CI (.ci/run)
// requires test/microvm to run.
func TestMakeRunsGoTestThroughIt(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("make", "-n", "-C", root, "test")
	cmd.Env = append(os.Environ(), "PODVOL_REQUIRE_MICROVM=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make -n test: %v\n%s", err, out)
	}
	var summarized []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, " test ") && strings.Contains(l, "-count=1") && !strings.Contains(l, "-fuzz") {
			if !strings.Contains(l, "./test/internal/testsummary") || !strings.Contains(l, " -json ") {
				t.Errorf("go test not run with -json through test/internal/testsummary: %s", l)
			}
			summarized = append(summarized, l)
		}
	}
	// make check's, and make test's two chains': the host's packages and
	// the dev cluster's.
	if len(summarized) != 3 {
		t.Fatalf("want the go test of make check and of make test's two chains, found %d:\n%s", len(summarized), out)
	}
	// Every package of the module is tested by one of them: none is lost
	// when the chains are drawn anew.
	list, err := exec.Command("go", "list", "-C", root, "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	all := strings.ReplaceAll(strings.Join(summarized, " "), ";", " ") + " "
	for _, pkg := range strings.Fields(string(list)) {
		short := "./" + strings.TrimPrefix(pkg, "github.com/podvol/podvol/")
		if !strings.Contains(all, " "+pkg+" ") && !strings.Contains(all, " "+short+" ") {
			t.Errorf("make test does not test %s", pkg)
		}
	}
	microvm := ""
	for _, l := range summarized {
		if strings.Contains(l, "/test/microvm ") {
			microvm = l
		}
	}
	if !strings.Contains(microvm, "-require-run ./test/microvm") {
		t.Errorf("with PODVOL_REQUIRE_MICROVM=1, make test does not require test/microvm to run: %q", microvm)
	}
	ci, err := os.ReadFile(filepath.Join(root, ".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^export PODVOL_REQUIRE_MICROVM=1$`).Match(ci) {
		t.Error(".ci/run does not export PODVOL_REQUIRE_MICROVM=1")
	}
}
