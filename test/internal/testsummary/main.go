// Command testsummary runs go test -json and prints its output as go test
// without -json does (each package's ok line; a failed package's output
// less its passing tests'), then every test that skipped, with its reason,
// and every failure again, so that neither a skip nor a failure printed
// early in a long run is lost. make check and make test run go test through
// it:
//
//	go run ./test/internal/testsummary [-require-run PKG]... -- go test -json ...
//
// Its exit status is not 0 when go test's is not, when a package failed,
// or when a package named by -require-run (an import path or ./dir) skipped
// a test or did not run: CI (.ci/run) requires test/microvm, whose tests
// skip where QEMU is missing or cannot start, on a machine where make deps
// installed QEMU.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"sort"
	"strings"
	"syscall"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	var require list
	flag.Var(&require, "require-run", "a package (import path or ./dir) that must run every test: a skip, or not running, fails (repeatable)")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: testsummary [-require-run PKG]... -- go test -json [flags] [packages]")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	os.Exit(execute(flag.Args(), require, os.Stdout))
}

// execute runs go test (args) and summarises its stream: the exit status.
func execute(args []string, require []string, out io.Writer) int {
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stderr = os.Stderr
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintln(os.Stderr, "testsummary:", err)
		return 1
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "testsummary:", err)
		return 1
	}
	// An interrupt reaches go test too (one process group): this one
	// outlives it to say what ran. A signal sent to this one alone is
	// passed on.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		for s := range sigs {
			_ = cmd.Process.Signal(s)
		}
	}()
	ok := summarize(pipe, out, require, cmd.Wait)
	signal.Stop(sigs)
	if !ok {
		if code := cmd.ProcessState.ExitCode(); code > 0 {
			return code
		}
		return 1
	}
	return 0
}

// event is one line of go test -json (cmd/test2json).
type event struct {
	Action      string
	Package     string
	Test        string
	Output      string
	ImportPath  string // build-output and build-fail
	FailedBuild string
}

type line struct{ test, text string }

// pkg is one package's run so far.
type pkg struct {
	path   string
	lines  []line
	result map[string]string // test: pass, fail or skip
	ran    []string          // tests started, in order
	done   string            // the package's own action: pass, fail or skip
	build  bool              // its test binary did not build
}

func (p *pkg) skipped() []string {
	var s []string
	for _, t := range p.ran {
		if p.result[t] == "skip" {
			s = append(s, t)
		}
	}
	return s
}

// why is a skipped test's reason: its output but the framing lines.
func (p *pkg) why(test string) string {
	var parts []string
	for _, l := range p.lines {
		t := strings.TrimSpace(l.text)
		if l.test != test || t == "" || strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- SKIP") {
			continue
		}
		parts = append(parts, t)
	}
	if len(parts) == 0 {
		return "(no reason given)"
	}
	return strings.Join(parts, " | ")
}

// summarize reads go test -json from in and writes to out what go test
// without -json would, then the skips and failures. goTestErr, called after
// in is read, is go test's exit. It reports whether all went well.
func summarize(in io.Reader, out io.Writer, require []string, goTestErr func() error) bool {
	pkgs := map[string]*pkg{}
	var order []string
	get := func(path string) *pkg {
		p := pkgs[path]
		if p == nil {
			p = &pkg{path: path, result: map[string]string{}}
			pkgs[path] = p
			order = append(order, path)
		}
		return p
	}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || (e.Action == "" && e.ImportPath == "") {
			fmt.Fprintln(out, sc.Text()) // not an event: as it came
			continue
		}
		switch {
		case e.Action == "build-output":
			fmt.Fprint(out, e.Output)
		case e.Action == "build-fail" || e.Package == "":
		case e.Action == "output":
			p := get(e.Package)
			p.lines = append(p.lines, line{e.Test, e.Output})
		case e.Action == "run":
			p := get(e.Package)
			p.ran = append(p.ran, e.Test)
		case e.Test != "" && (e.Action == "pass" || e.Action == "fail" || e.Action == "skip"):
			get(e.Package).result[e.Test] = e.Action
		case e.Action == "pass" || e.Action == "fail" || e.Action == "skip":
			p := get(e.Package)
			p.done, p.build = e.Action, e.FailedBuild != ""
			p.print(out, p.done == "fail")
		}
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintf(out, "testsummary: reading go test's output: %v\n", err)
	}
	// go test stopped (interrupted, killed) before these finished: what
	// they printed may say why.
	for _, path := range order {
		if p := pkgs[path]; p.done == "" {
			fmt.Fprintf(out, "%s did not finish; its output:\n", path)
			p.print(out, true)
		}
	}
	return report(out, pkgs, order, require, goTestErr())
}

// print writes what go test without -json writes for a finished package:
// its ok line, or, when it failed, its output less the passing and skipped
// tests'.
func (p *pkg) print(out io.Writer, failed bool) {
	for _, l := range p.lines {
		if l.test == "" && (strings.HasPrefix(l.text, "ok ") || strings.HasPrefix(l.text, "?   ")) {
			fmt.Fprint(out, l.text)
			continue
		}
		if !failed {
			continue
		}
		if r := p.result[l.test]; l.test != "" && (r == "pass" || r == "skip") {
			continue
		}
		if strings.HasPrefix(l.text, "=== ") {
			continue
		}
		fmt.Fprint(out, l.text)
	}
}

// report lists the skips and failures and applies -require-run.
func report(out io.Writer, pkgs map[string]*pkg, order, require []string, goTestErr error) bool {
	ok := goTestErr == nil
	sort.Strings(order)
	var skips, allSkipped, noTests, failures []string
	nSkips := 0
	for _, path := range order {
		p := pkgs[path]
		s := p.skipped()
		nSkips += len(s)
		for _, t := range s {
			skips = append(skips, fmt.Sprintf("SKIP %s %s: %s", path, t, p.why(t)))
		}
		switch {
		case len(s) > 0 && len(s) == len(p.ran):
			allSkipped = append(allSkipped, fmt.Sprintf("%s (%d of %d)", path, len(s), len(p.ran)))
		case len(p.ran) == 0 && p.done != "fail":
			noTests = append(noTests, path)
		}
		switch {
		case p.done == "fail" && p.build:
			failures = append(failures, fmt.Sprintf("FAIL %s: build failed", path))
		case p.done == "fail":
			var failed, unfinished []string
			for _, t := range p.ran {
				switch p.result[t] {
				case "fail":
					// A parent fails with its subtest: name the subtest.
					if !slices.ContainsFunc(p.ran, func(sub string) bool { return strings.HasPrefix(sub, t+"/") && p.result[sub] == "fail" }) {
						failed = append(failed, t)
					}
				case "":
					unfinished = append(unfinished, t)
				}
			}
			msg := "FAIL " + path + ":"
			if len(failed) > 0 {
				msg += " " + strings.Join(failed, ", ")
			}
			if len(unfinished) > 0 {
				msg += " " + strings.Join(unfinished, ", ") + " (no result: it was running when the package failed)"
			}
			if len(failed)+len(unfinished) == 0 {
				msg += " no test failed (TestMain or the binary: its output above)"
			}
			failures = append(failures, msg)
		case p.done == "":
			failures = append(failures, fmt.Sprintf("FAIL %s: no result (go test stopped before it finished)", path))
		}
	}
	fmt.Fprintf(out, "\n== skipped: %d tests\n", nSkips)
	for _, s := range skips {
		fmt.Fprintln(out, s)
	}
	for _, s := range allSkipped {
		fmt.Fprintln(out, "every test skipped: "+s)
	}
	if len(noTests) > 0 {
		fmt.Fprintf(out, "no tests: %s\n", strings.Join(noTests, " "))
	}
	for _, r := range require {
		var found []*pkg
		for _, path := range order {
			if path == r || strings.HasSuffix(path, "/"+strings.TrimPrefix(r, "./")) {
				found = append(found, pkgs[path])
			}
		}
		switch {
		case len(found) == 0:
			failures = append(failures, fmt.Sprintf("FAIL %s must run every test (-require-run) and did not run", r))
		default:
			for _, p := range found {
				if n := len(p.skipped()); n > 0 {
					failures = append(failures, fmt.Sprintf("FAIL %s must run every test (-require-run) and skipped %d (reasons above)", p.path, n))
				} else if len(p.ran) == 0 {
					failures = append(failures, fmt.Sprintf("FAIL %s must run every test (-require-run) and ran none", p.path))
				}
			}
		}
	}
	if len(failures) > 0 {
		ok = false
		fmt.Fprintf(out, "\n== failed:\n")
		for _, f := range failures {
			fmt.Fprintln(out, f)
		}
	}
	if goTestErr != nil {
		var exit *exec.ExitError
		if !errors.As(goTestErr, &exit) || len(failures) == 0 {
			fmt.Fprintf(out, "go test: %v\n", goTestErr)
		}
	}
	if ok {
		fmt.Fprintf(out, "== %d packages: ok\n", len(order))
	}
	return ok
}
