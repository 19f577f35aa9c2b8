// Command conformance runs Kubernetes' external-storage e2e suite
// (k8s.io/kubernetes/test/e2e/storage/external, built unchanged by
// tools/e2e/build.sh) against podvol on the dev cluster, once per test-driver
// definition in this directory (ext4, xfs, raw block, inline ephemeral), and
// prints what passed, failed and was skipped, and why. `make conformance`
// runs it; see docs/conformance.md.
//
// It brings the dev cluster up, or deploys podvol again on the running one
// (which it then leaves running), builds the test images the suite runs and
// imports them, and keeps each definition's JUnit report and log in -reports.
// The dev cluster is one per machine: `make conformance` runs this under
// `flock -o /tmp/podvol-devcluster.lock`, the lock its users take.
package main

import (
	"bufio"
	"context"
	"encoding/xml"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/podvol/podvol/internal/devcluster"
	"github.com/podvol/podvol/internal/device"
)

// driver is one run of the suite: a test-driver definition and the part of
// the suite it is run for.
type driver struct {
	name string // the run's, and its reports' directory
	def  string // the definition's: its file is <def>.yaml
	// focus and skip select the suite's test patterns this run is for: the
	// other runs take the rest (a partition, not a skip).
	focus, skip string
	// floor and slowFloor are the fewest specs the run must run (passed
	// or failed, not skipped), without and with -slow: fewer means a
	// pattern stopped matching or a capability was dropped from a
	// definition, and the run fails. They are what the run ran when last
	// measured (docs/conformance.md) on a host with both limits below
	// (a host without them runs more). Change them on purpose, with the
	// run that shows the new count; 0: not measured yet.
	floor, slowFloor int
	// exact, when set (-focus), are the only specs the run selects, by
	// their full names.
	exact []string
}

var drivers = []driver{
	// Filesystem volumes of each class; the block and generic-ephemeral
	// block patterns are the block run's. A filesystem's specs are two runs
	// at once, its snapshot specs and the others (each ~7 minutes here, one
	// run ~15): the specs mostly wait on pods and polls, so two processes
	// halve the wall time.
	// Floors: the six runs' 87 specs of 2026-12-01 (commit 64fb913,
	// docs/conformance.md); [Slow]: block's 8 passed, the others not measured yet.
	{name: "ext4-snapshots", def: "ext4", focus: `Snapshot`, skip: `\(block volmode\)`, floor: 8},
	{name: "ext4-rest", def: "ext4", skip: `\(block volmode\)|Snapshot`, floor: 27},
	{name: "xfs-snapshots", def: "xfs", focus: `Snapshot`, skip: `\(block volmode\)`, floor: 8},
	{name: "xfs-rest", def: "xfs", skip: `\(block volmode\)|Snapshot`, floor: 29},
	{name: "block", def: "block", focus: `\(block volmode\)`, floor: 11, slowFloor: 8},
	{name: "inline", def: "inline", floor: 4},
}

// floorFor is the run's floor for the suite's [Slow] specs or the others.
func (d driver) floorFor(slow bool) int {
	if slow {
		return d.slowFloor
	}
	return d.floor
}

// narrow is -focus: the runs select only the specs of their part of the
// suite whose names it matches.
var narrow *regexp.Regexp

// machineSkips are the only specs not run, by exact name, because this
// machine cannot run them (docs/conformance.md). Keyed by definition, then
// by name, the reason.
var machineSkips = map[string]map[string]string{}

// limit is something a host may withhold that some specs need.
type limit string

const (
	// capSysResource: the kernel grows a mounted ext4 only for a process
	// with CAP_SYS_RESOURCE in its effective set.
	capSysResource limit = "CAP_SYS_RESOURCE"
	// hostMountNS: a spec that nsenters PID 1's mount namespace.
	hostMountNS limit = "/proc/1/ns/mnt"
)

// hostSkip is specs that cannot run on a host without lim.
type hostSkip struct {
	lim   limit
	why   string
	defs  []string
	names []string
}

const specPrefix = "External Storage [Driver: podvol.io] "

var hostSkips = []hostSkip{
	{hostMountNS, "the spec nsenters PID 1's mount namespace (/proc/1/ns/mnt) to look at the host's mounts",
		[]string{"ext4", "xfs"}, []string{specPrefix + "[Testpattern: Dynamic PV (filesystem volmode)] volumeMode should not mount / map unused volumes in a pod [LinuxOnly]"}},
	{hostMountNS, "the spec nsenters PID 1's mount namespace (/proc/1/ns/mnt) to look at the host's mounts",
		[]string{"block"}, []string{specPrefix + "[Testpattern: Dynamic PV (block volmode)] volumeMode should not mount / map unused volumes in a pod [LinuxOnly]"}},
	{capSysResource, "online growth of a mounted ext4 needs CAP_SYS_RESOURCE: without it podvol refuses with FAILED_PRECONDITION and grows it at the next stage",
		[]string{"ext4"}, []string{
			specPrefix + "[Testpattern: Dynamic PV (default fs)(allowExpansion)] volume-expand should resize volume when PVC is edited while pod is using it",
			specPrefix + "[Testpattern: Generic Ephemeral-volume (default fs) (immediate-binding)] ephemeral should support expansion of pvcs created for ephemeral pvcs",
			specPrefix + "[Testpattern: Generic Ephemeral-volume (default fs) (late-binding)] ephemeral should support expansion of pvcs created for ephemeral pvcs"}},
	{capSysResource, "kubelet (v1.37) calls NodeExpandVolume after NodePublishVolume, even for a pod not yet running, so podvol grows the published ext4 online, which needs CAP_SYS_RESOURCE (on a node with it, online growth works)",
		[]string{"ext4"}, []string{
			specPrefix + "[Testpattern: Dynamic PV (default fs)(allowExpansion)] volume-expand Verify if offline PVC expansion works",
			specPrefix + "[Testpattern: Dynamic PV (default fs)(allowExpansion)] volume-expand should resize volume when PVC is edited and the pod is re-created on the same node after controller resize is finished"}},
}

// skipsFor is machineSkips for a host on which missing says, for each
// limit, why the host lacks it (nil: it has it). A limit not probed counts
// as missing: a spec that cannot run here must not fail the run.
func skipsFor(missing map[limit]error) map[string]map[string]string {
	skips := map[string]map[string]string{}
	for _, s := range hostSkips {
		err, probed := missing[s.lim]
		if probed && err == nil {
			continue
		}
		if !probed {
			err = errors.New("not probed")
		}
		for _, d := range s.defs {
			if skips[d] == nil {
				skips[d] = map[string]string{}
			}
			for _, n := range s.names {
				skips[d][n] = fmt.Sprintf("%s; this host: %v", s.why, err)
			}
		}
	}
	return skips
}

// probeHost finds which limits this host has, as the csi-sanity ext4 run
// does for CAP_SYS_RESOURCE. The dev cluster's nodes are processes of this
// host, so what the runner (root) may do, the plugin and the suite's
// privileged host-exec pods may too.
func probeHost() map[limit]error {
	found := map[limit]error{capSysResource: nil, hostMountNS: nil}
	if !device.HasCapability(device.CapSysResource) {
		found[capSysResource] = errors.New("CAP_SYS_RESOURCE is not in the effective set (CapEff in /proc/self/status), even for root")
	}
	// The spec runs nsenter --mount=/proc/1/ns/mnt in a hostPID pod: open
	// it, then enter it as nsenter does (a Go process cannot: setns of a
	// mount namespace refuses a multi-threaded caller).
	if f, err := os.Open("/proc/1/ns/mnt"); err != nil {
		found[hostMountNS] = err
	} else {
		_ = f.Close()
		if out, err := exec.Command("nsenter", "--mount=/proc/1/ns/mnt", "--", "true").CombinedOutput(); err != nil {
			found[hostMountNS] = fmt.Errorf("nsenter --mount=/proc/1/ns/mnt: %w: %s", err, strings.TrimSpace(string(out)))
		}
	}
	return found
}

// capabilities the suite (v1.37.2, test/e2e/storage/framework) knows: a key
// that is not one of these is ignored by it.
var knownCaps = strings.Fields("persistence block fsGroup volumeMountGroup exec snapshotDataSource snapshotMetadata groupSnapshot pvcDataSource multipods RWX controllerExpansion nodeExpansion offlineExpansion onlineExpansion volumeLimits singleNodeVolume topology capacity FSResizeFromSourceNotSupported readWriteOncePod multiplePVsSameID capReadOnlyMany seLinuxMount")

func main() {
	here := filepath.Join(devcluster.RepoRoot(), "test", "conformance")
	slow := flag.Bool("slow", false, "run the [Slow] specs instead of the others")
	only := flag.String("drivers", "", "comma-separated runs (ext4-snapshots, ext4-rest, xfs-snapshots, xfs-rest, block, inline) or definitions (ext4: both its runs) to run (default: all)")
	reports := flag.String("reports", "/var/lib/podvol-conformance", "where each driver's JUnit report and log are kept")
	keep := flag.Bool("keep", os.Getenv("PODVOL_E2E_KEEP") != "", "leave the dev cluster up afterwards")
	parallel := flag.Int("parallel", len(drivers), "runs at once (each is one e2e.test process, its specs one after another)")
	redeploy := flag.Bool("redeploy", true, "on a running cluster, deploy podvol again first (podvol-dev up), as the e2e tests do")
	report := flag.Bool("summary", false, "print the summary of the last run from -reports, and exit")
	list := flag.Bool("list", false, "list the specs each definition would run, and exit (no cluster)")
	pool := flag.String("pool-size", resource.NewQuantity(devcluster.ConformancePoolSize, resource.BinarySI).String(), "node 1's pool when this run brings the dev cluster up (node 2's is 2/3 of it, node 3's 1/3)")
	chaosOn := flag.Bool("chaos", false, "while the suite runs, delete podvol's pods and SIGKILL its containers every 20-60 s (log: -reports/chaos.log)")
	chaosSeed := flag.Uint64("chaos-seed", 0, "seed of -chaos's choices (0: from the clock)")
	focus := flag.String("focus", "", "run only the specs whose names match this regular expression (to re-run one failed spec: paste its name from the summary)")
	flag.Parse()
	machineSkips = skipsFor(probeHost())
	if *focus != "" {
		re, err := regexp.Compile(*focus)
		if err != nil {
			// Not a regular expression: a name, as written.
			re = regexp.MustCompile(regexp.QuoteMeta(*focus))
		}
		narrow = re
	}
	size, err := resource.ParseQuantity(*pool)
	if err != nil || size.Sign() <= 0 {
		fail("-pool-size %q: a quantity above zero, like 60Gi", *pool)
	}
	if os.Geteuid() != 0 && !*list {
		fail("the dev cluster runs a kubelet and containerd: run as root")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	start := time.Now()

	selected := drivers
	if *only != "" {
		selected = nil
		for _, n := range strings.Split(*only, ",") {
			found := false
			for _, d := range drivers {
				if (d.name == n || d.def == n) && !slices.ContainsFunc(selected, func(s driver) bool { return s.name == d.name }) {
					selected = append(selected, d)
				}
				found = found || d.name == n || d.def == n
			}
			if !found {
				fail("unknown driver definition %q", n)
			}
		}
	}

	if *report {
		var rs []result
		for _, d := range selected {
			dir := filepath.Join(*reports, d.name)
			if *slow {
				dir += "-slow"
			}
			r := summarize(d, filepath.Join(here, d.def+".yaml"), dir, *slow, 0)
			fmt.Print(r.text)
			rs = append(rs, r)
		}
		fmt.Print(table(rs))
		return
	}

	fmt.Fprintln(os.Stderr, "== building the e2e suite and agnhost (cached by version)")
	out, err := run(ctx, filepath.Join(devcluster.RepoRoot(), "tools", "e2e", "build.sh"))
	if err != nil {
		fail("tools/e2e/build.sh: %v", err)
	}
	bin := strings.TrimSpace(out)
	e2e := filepath.Join(bin, "e2e-storage.test")
	repoList := filepath.Join(here, "repo-list.yaml")
	fmt.Fprintf(os.Stderr, "   built or cached in %s\n", time.Since(start).Round(time.Second))

	if narrow != nil {
		if selected, err = narrowRuns(ctx, e2e, here, repoList, selected, *slow); err != nil {
			fail("%v", err)
		}
	}

	if *list {
		for _, d := range selected {
			names, err := listSpecs(ctx, e2e, here, repoList, d, *slow)
			if err != nil {
				fail("%v", err)
			}
			fmt.Printf("== %s\n", d.name)
			for _, n := range names {
				fmt.Println(n)
			}
		}
		return
	}

	// Six runs at once hold up to ~18 volumes and snapshots of 1 GiB at a
	// time, and each Retain spec leaves its snapshot in a pool for the
	// rest of the run (a retained snapshot is the admin's to delete): the
	// dev cluster's default pools (20, 13, 6 GiB) run out on the smallest
	// node, and a restore or a growth there then waits for room until its
	// spec times out (seen: 2 specs, 15 minutes each). The pool images are
	// sparse: a larger pool costs only what is written.
	cluster := devcluster.New(devcluster.Config{Out: os.Stderr, PoolSize: size.Value()})
	wasUp := cluster.Running()
	// A cluster's pools are made once: a cluster that exists (running or
	// not) keeps the sizes it was made with.
	if smallest, want := smallestPool(cluster), size.Value()/int64(max(len(cluster.Nodes), 1))>>30<<30; smallest > 0 && smallest < want {
		fmt.Fprintf(os.Stderr, "== note: the dev cluster exists with a smallest pool of %d GiB, not %d: specs may time out waiting for room there (make down, then run again to make pools of %s, 2/3 and 1/3 of it)\n",
			smallest>>30, want>>30, size.String())
	}
	code := 0
	var err2 error
	if !wasUp || *redeploy {
		fmt.Fprintf(os.Stderr, "== bringing the dev cluster up (running already: %v)\n", wasUp)
		err2 = cluster.Up(ctx)
	} else {
		fmt.Fprintln(os.Stderr, "== on the running dev cluster as it is (-redeploy=false)")
		err2 = cluster.Attach(ctx)
	}
	if err2 != nil {
		fmt.Fprintf(os.Stderr, "dev cluster: %v\n", err2)
		code = 1
	} else {
		var ch *chaos
		if *chaosOn {
			ch, err = newChaos(cluster, *chaosSeed, *reports)
			if err != nil {
				fail("%v", err)
			}
		}
		code = conformance(ctx, cluster, e2e, bin, repoList, here, *reports, selected, *slow, *parallel, ch)
	}
	if !wasUp && !*keep {
		fmt.Fprintln(os.Stderr, "== taking the dev cluster down")
		if err := cluster.Down(context.Background()); err != nil {
			fmt.Fprintf(os.Stderr, "tearing down the dev cluster: %v\n", err)
			code = 1
		}
	}
	fmt.Fprintf(os.Stderr, "== conformance done in %s\n", time.Since(start).Round(time.Second))
	os.Exit(code)
}

func conformance(ctx context.Context, cluster *devcluster.Cluster, e2e, bin, repoList, here, reports string, selected []driver, slow bool, parallel int, ch *chaos) int {
	t0 := time.Now()
	out, err := run(ctx, e2e, "--list-images", "--kube-test-repo-list="+repoList)
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e.test --list-images: %v\n", err)
		return 1
	}
	// Only the images repo-list.yaml maps to this machine: the others are
	// ones the suite means to be unreachable, or no storage spec's.
	var local []string
	for _, ref := range strings.Fields(out) {
		if strings.HasPrefix(ref, "localhost/") {
			local = append(local, ref)
		}
	}
	built, _, err := cluster.ImportTestImages(ctx, local, filepath.Join(bin, "agnhost"))
	if err != nil {
		fmt.Fprintf(os.Stderr, "test images: %v\n", err)
		return 1
	}
	sort.Strings(built)
	fmt.Fprintf(os.Stderr, "== test images built and imported in %s: %s\n", time.Since(t0).Round(time.Second), strings.Join(built, " "))

	kind := "not [Slow]"
	if slow {
		kind = "[Slow]"
	}
	results := make([]result, len(selected))
	sem := make(chan struct{}, max(parallel, 1))
	var wg sync.WaitGroup
	for i, d := range selected {
		dir := filepath.Join(reports, d.name)
		if slow {
			dir += "-slow"
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		def := filepath.Join(here, d.def+".yaml")
		args := append(suiteArgs(d, def, repoList, slow),
			"--kubeconfig="+cluster.Kubeconfig(), "--kubectl-path="+filepath.Join(bin, "kubectl"),
			"--kubelet-root-dir="+filepath.Join(cluster.Dir, "kubelet"),
			"--ginkgo.junit-report="+filepath.Join(dir, "junit.xml"), "--ginkgo.v", "--ginkgo.no-color",
			"--ginkgo.timeout=6h", "--ginkgo.poll-progress-after=5m")
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			fmt.Fprintf(os.Stderr, "== %s: External.Storage, %s (log: %s/e2e.log)\n", d.name, kind, dir)
			t := time.Now()
			runErr := runLogged(ctx, d.name, filepath.Join(dir, "e2e.log"), e2e, args...)
			r := summarize(d, def, dir, slow, time.Since(t))
			if runErr != nil && !r.failed {
				r.text += fmt.Sprintf("  the suite exited with %v (see %s/e2e.log)\n", runErr, dir)
				r.failed = true
			}
			results[i] = r
			fmt.Fprintf(os.Stderr, "== %s done in %s\n", d.name, time.Since(t).Round(time.Second))
		}()
	}
	chaosCtx, stopChaos := context.WithCancel(ctx)
	chaosDone := make(chan struct{})
	go func() {
		defer close(chaosDone)
		if ch != nil {
			ch.run(chaosCtx)
		}
	}()
	wg.Wait()
	stopChaos()
	<-chaosDone
	code := 0
	// What the suite made is deleted: nothing of it may stay attached or
	// mounted on any node (after chaos too, once podvol's pods are back).
	fmt.Fprintln(os.Stderr, "== checking every node for leftover loop devices, mounts and images")
	for _, obj := range []string{"daemonset/podvol-node", "deployment/podvol-controller"} {
		if _, err := cluster.RunKubectl(ctx, "-n", podvolNS, "rollout", "status", obj, "--timeout=5m"); err != nil {
			fmt.Fprintf(os.Stderr, "podvol is not back after the run: %s: %v\n", obj, err)
			code = 1
		}
	}
	if err := checkLeftovers(ctx, cluster, 5*time.Minute); err != nil {
		fmt.Fprintf(os.Stderr, "%v\n", err)
		code = 1
	}
	fmt.Printf("\n==== conformance summary (%s, %d runs, %d at a time)\n", kind, len(selected), parallel)
	for _, r := range results {
		fmt.Print(r.text)
		if r.failed {
			code = 1
		}
	}
	fmt.Print(table(results))
	return code
}

type skipCount struct {
	n   int
	why string
}

// machineSkipped counts the host's skips in this run's part of the suite
// (and -focus's), by reason.
func (d driver) machineSkipped() []skipCount {
	count := map[string]int{}
	for name, why := range machineSkips[d.def] {
		if regexp.MustCompile(d.focus).MatchString(name) && (d.skip == "" || !regexp.MustCompile(d.skip).MatchString(name)) &&
			(narrow == nil || focused(name)) {
			count[why]++
		}
	}
	var out []skipCount
	for why, n := range count {
		out = append(out, skipCount{n, why})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].why < out[j].why })
	return out
}

// listSpecs lists the specs a run selects (a dry run of the suite), by name
// without the labels Ginkgo appends.
func listSpecs(ctx context.Context, e2e, here, repoList string, d driver, slow bool) ([]string, error) {
	args := suiteArgs(d, filepath.Join(here, d.def+".yaml"), repoList, slow)
	out, err := run(ctx, e2e, append(args, "--ginkgo.dry-run", "--ginkgo.v", "--ginkgo.no-color", "--kubeconfig=/dev/null")...)
	if err != nil {
		return nil, fmt.Errorf("listing the specs of run %s: %w\n%s", d.name, err, out)
	}
	var names []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "External Storage") {
			names = append(names, specName(l))
		}
	}
	return names, nil
}

// specName strips the labels Ginkgo appends to a spec's name in its output
// and reports (" [Driver: podvol.io, Feature:...]").
func specName(s string) string {
	if i := strings.LastIndex(s, " [Driver: podvol.io"); i > len("External Storage [Driver: podvol.io]") {
		return s[:i]
	}
	return s
}

// focused reports whether -focus selects the spec of that name: its regular
// expression matches, or it is part of the name as written (a name pasted
// from the summary is full of brackets and parentheses).
func focused(name string) bool {
	return narrow.MatchString(name) || strings.Contains(strings.Join(strings.Fields(name), " "), strings.Join(strings.Fields(narrow.String()), " "))
}

// narrowRuns keeps, in each run, only the specs of its part of the suite
// whose names -focus matches, by their exact names: a regular expression
// cannot be ANDed with a run's own focus and skip, and this way the runs
// still partition what is selected. A run left with none is dropped.
func narrowRuns(ctx context.Context, e2e, here, repoList string, runs []driver, slow bool) ([]driver, error) {
	var kept []driver
	for _, d := range runs {
		names, err := listSpecs(ctx, e2e, here, repoList, d, slow)
		if err != nil {
			return nil, err
		}
		for _, n := range names {
			if focused(n) {
				d.exact = append(d.exact, n)
			}
		}
		if len(d.exact) > 0 {
			kept = append(kept, d)
		}
	}
	if len(kept) == 0 {
		return nil, fmt.Errorf("-focus %q matches no spec of the selected runs (go run ./test/conformance -list lists them)", narrow)
	}
	return kept, nil
}

// smallestPool is the smallest node pool of the cluster (0 if none is known).
func smallestPool(c *devcluster.Cluster) int64 {
	var least int64
	for _, n := range c.Nodes {
		if n.PoolSize > 0 && (least == 0 || n.PoolSize < least) {
			least = n.PoolSize
		}
	}
	return least
}

func suiteArgs(d driver, def, repoList string, slow bool) []string {
	// The test pattern comes after "External Storage" in a spec's text, and
	// [Slow] after the pattern.
	focus := `External.Storage`
	if d.focus != "" {
		focus += ".*" + d.focus
	}
	skip := []string{`\[Disruptive\]`, `\[Serial\]`}
	if slow {
		focus += `.*\[Slow\]`
	} else {
		skip = append(skip, `\[Slow\]`)
	}
	if d.skip != "" {
		skip = append(skip, d.skip)
	}
	var names []string
	for n := range machineSkips[d.def] {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		// Ginkgo matches "<suite description> <spec text>".
		skip = append(skip, " "+regexp.QuoteMeta(n)+"$")
	}
	if len(d.exact) > 0 {
		// Ginkgo matches "<suite description> <spec name>", the name's
		// texts joined by one space where its output shows an empty
		// container's two.
		quoted := make([]string, len(d.exact))
		for i, n := range d.exact {
			words := strings.Fields(n)
			for j, w := range words {
				words[j] = regexp.QuoteMeta(w)
			}
			quoted[i] = strings.Join(words, `\s+`)
		}
		focus = " (?:" + strings.Join(quoted, "|") + ")$"
	}
	return []string{
		"--storage.testdriver=" + def, "--kube-test-repo-list=" + repoList,
		"--ginkgo.focus=" + focus, "--ginkgo.skip=" + strings.Join(skip, "|"),
		"--provider=skeleton", "--minStartupPods=0", "--disable-log-dump",
	}
}

// junit is the part of Ginkgo's JUnit report read here.
type junit struct {
	Suites []struct {
		Cases []testcase `xml:"testcase"`
	} `xml:"testsuite"`
}

type testcase struct {
	Name    string  `xml:"name,attr"`
	Time    float64 `xml:"time,attr"`
	Skipped *struct {
		Message string `xml:"message,attr"`
	} `xml:"skipped"`
	Failure *struct {
		Message string `xml:"message,attr"`
	} `xml:"failure"`
	Error *struct {
		Message string `xml:"message,attr"`
	} `xml:"error"`
}

// why is a failed case's message.
func (c testcase) why() string {
	if c.Failure != nil {
		return c.Failure.Message
	}
	if c.Error != nil {
		return c.Error.Message
	}
	return ""
}

// result is one run's summary.
type result struct {
	name   string
	text   string // what the run did, and why it failed
	t      tally
	floor  int
	failed bool
}

// tally is what a run's JUnit report says of the specs.
type tally struct {
	passed, failed []string
	skipped        map[string][]string // at run time by the suite, by its reason
	notSelected    int                 // by the run's focus and skip
}

func (t tally) ran() int { return len(t.passed) + len(t.failed) }

func (t tally) nSkipped() int {
	n := 0
	for _, v := range t.skipped {
		n += len(v)
	}
	return n
}

// readJUnit counts a Ginkgo JUnit report's specs.
func readJUnit(raw []byte) (tally, error) {
	var r junit
	if err := xml.Unmarshal(raw, &r); err != nil {
		return tally{}, err
	}
	t := tally{skipped: map[string][]string{}}
	for _, s := range r.Suites {
		for _, c := range s.Cases {
			name := specName(strings.TrimPrefix(c.Name, "[It] "))
			if !strings.HasPrefix(name, "External Storage") {
				if c.Failure != nil || c.Error != nil {
					t.failed = append(t.failed, c.Name+": "+firstLine(c.why()))
				}
				continue
			}
			switch {
			case c.Failure != nil || c.Error != nil:
				t.failed = append(t.failed, fmt.Sprintf("%s (%.0fs)\n      %s", name, c.Time, firstLine(c.why())))
			case c.Skipped != nil:
				m := strings.TrimSpace(strings.TrimPrefix(c.Skipped.Message, "skipped -"))
				if m == "" || m == "skipped" {
					t.notSelected++
					continue
				}
				t.skipped[m] = append(t.skipped[m], name)
			default:
				t.passed = append(t.passed, name)
			}
		}
	}
	return t, nil
}

// shortfall says why a run that failed no spec still fails: it ran fewer
// specs than its floor (an emptied pattern, a dropped capability: Ginkgo
// passes a run of none), the suite skipped every spec it selected, or
// -focus's names did not select what they listed.
func (d driver) shortfall(t tally, slow bool) []string {
	var why []string
	if selected := t.ran() + t.nSkipped(); len(d.exact) > 0 && selected != len(d.exact) {
		// -focus listed these names: a focus that selects another number
		// in the real run must not read as a pass.
		why = append(why, fmt.Sprintf("-focus chose %d specs by name, the suite selected %d: the names did not match as listed", len(d.exact), selected))
	}
	if f := d.floorFor(slow); len(d.exact) == 0 && t.ran() < f {
		why = append(why, fmt.Sprintf("ran %d specs, fewer than this run's floor of %d: a pattern no longer matches or a definition lost a capability (if on purpose, lower the floor beside the run in test/conformance/main.go)", t.ran(), f))
	}
	if t.ran() == 0 && t.nSkipped() > 0 {
		why = append(why, fmt.Sprintf("the suite skipped all %d specs the run selected at run time: it tested nothing", t.nSkipped()))
	}
	return why
}

// summarize reads a run's report and log: counts against the run's floor,
// each failure with its message, the run-time skips grouped by reason, and
// whether the suite read every key of the driver definition.
func summarize(d driver, def, dir string, slow bool, took time.Duration) result {
	var b strings.Builder
	r := result{name: d.name, floor: d.floorFor(slow)}
	fmt.Fprintf(&b, "\n=== %s (%s, %s)\n", d.name, filepath.Base(def), took.Round(time.Second))
	if msg := checkDefinition(def, filepath.Join(dir, "e2e.log")); msg != "" {
		fmt.Fprintf(&b, "DEFINITION NOT READ AS WRITTEN: %s\n", msg)
		r.failed = true
	} else {
		fmt.Fprintf(&b, "definition: the suite's start-up log shows every key of %s\n", filepath.Base(def))
	}
	raw, err := os.ReadFile(filepath.Join(dir, "junit.xml"))
	if err != nil {
		fmt.Fprintf(&b, "no JUnit report: %v (see %s/e2e.log)\n", err, dir)
		r.text, r.failed = b.String(), true
		return r
	}
	t, err := readJUnit(raw)
	if err != nil {
		fmt.Fprintf(&b, "JUnit report: %v\n", err)
		r.text, r.failed = b.String(), true
		return r
	}
	r.t = t
	floor := "no floor recorded (not measured yet)"
	if len(d.exact) > 0 {
		floor = "no floor: -focus"
	} else if r.floor > 0 {
		floor = fmt.Sprintf("floor %d", r.floor)
	}
	fmt.Fprintf(&b, "ran %d (%s): passed %d, failed %d; skipped at run time %d (by the suite, reasons below); not selected %d\n",
		t.ran(), floor, len(t.passed), len(t.failed), t.nSkipped(), t.notSelected)
	for _, why := range d.shortfall(t, slow) {
		fmt.Fprintf(&b, "  RUN FAILED: %s\n", why)
		r.failed = true
	}
	for _, f := range t.failed {
		fmt.Fprintf(&b, "  FAILED %s\n", f)
		r.failed = true
	}
	var reasons []string
	for m := range t.skipped {
		reasons = append(reasons, m)
	}
	sort.Strings(reasons)
	for _, m := range reasons {
		fmt.Fprintf(&b, "  skipped %d: %s\n", len(t.skipped[m]), firstLine(m))
	}
	if !slow {
		for _, m := range d.machineSkipped() {
			fmt.Fprintf(&b, "  not run on this host (by exact name; docs/conformance.md) %d: %s\n", m.n, m.why)
		}
	}
	fmt.Fprintf(&b, "  report: %s/junit.xml, log: %s/e2e.log\n", dir, dir)
	r.text = b.String()
	return r
}

// table is the runs' counts, one line each, after their summaries.
func table(rs []result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n%-16s %5s %6s %6s %7s %5s  %s\n", "run", "ran", "passed", "failed", "skipped", "floor", "result")
	total, skipped := tally{}, 0
	for _, r := range rs {
		verdict := "ok"
		if r.failed {
			verdict = "FAILED"
		}
		fmt.Fprintf(&b, "%-16s %5d %6d %6d %7d %5d  %s\n", r.name, r.t.ran(), len(r.t.passed), len(r.t.failed), r.t.nSkipped(), r.floor, verdict)
		total.passed = append(total.passed, r.t.passed...)
		total.failed = append(total.failed, r.t.failed...)
		skipped += r.t.nSkipped()
	}
	fmt.Fprintf(&b, "%-16s %5d %6d %6d %7d\n", "all", total.ran(), len(total.passed), len(total.failed), skipped)
	return b.String()
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i] + " …"
	}
	if len(s) > 300 {
		s = s[:300] + " …"
	}
	return s
}

// checkDefinition checks that the suite read every key of the definition:
// its YAML decoding is case-sensitive and ignores unknown keys, and an
// unknown capability name is ignored by the specs. The suite logs the
// definition it loaded ("Driver loaded from path [...]: {...}").
func checkDefinition(def, logPath string) string {
	raw, err := os.ReadFile(def)
	if err != nil {
		return err.Error()
	}
	var y struct {
		DriverInfo struct {
			Name                 string
			Capabilities         map[string]bool
			TopologyKeys         []string
			SupportedFsType      map[string]any
			SupportedMountOption map[string]any
			SupportedSizeRange   struct{ Min, Max string }
		}
		InlineVolumes []struct{ Attributes map[string]string }
	}
	if err := yaml.Unmarshal(raw, &y); err != nil {
		return fmt.Sprintf("%s: %v", def, err)
	}
	f, err := os.Open(logPath)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var loaded string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if strings.Contains(sc.Text(), "Driver loaded from path ["+def+"]") {
			loaded = sc.Text()
			break
		}
	}
	if loaded == "" {
		return "the suite's log has no \"Driver loaded from path\" line for " + def
	}
	var problems []string
	known := map[string]bool{}
	for _, k := range knownCaps {
		known[k] = true
	}
	for k, v := range y.DriverInfo.Capabilities {
		if !known[k] {
			problems = append(problems, "capability "+k+" is not one the suite knows")
		}
		if !strings.Contains(loaded, fmt.Sprintf("%s:%v", k, v)) {
			problems = append(problems, "capability "+k+" not in the loaded definition")
		}
	}
	if len(y.DriverInfo.Capabilities) == 0 {
		problems = append(problems, "no capabilities")
	}
	if !strings.Contains(loaded, "Name:"+y.DriverInfo.Name+" ") {
		problems = append(problems, "DriverInfo.Name not loaded")
	}
	if len(y.DriverInfo.TopologyKeys) > 0 && !strings.Contains(loaded, "TopologyKeys:["+strings.Join(y.DriverInfo.TopologyKeys, " ")+"]") {
		problems = append(problems, "TopologyKeys not loaded")
	}
	for name, set := range map[string]map[string]any{"SupportedFsType": y.DriverInfo.SupportedFsType, "SupportedMountOption": y.DriverInfo.SupportedMountOption} {
		for k := range set {
			if !strings.Contains(loaded, k+":{}") {
				problems = append(problems, name+" "+k+" not loaded")
			}
		}
	}
	if r := y.DriverInfo.SupportedSizeRange; !strings.Contains(loaded, fmt.Sprintf("SupportedSizeRange:{Max:%s Min:%s ", r.Max, r.Min)) {
		problems = append(problems, "SupportedSizeRange not loaded")
	}
	for _, iv := range y.InlineVolumes {
		for k, v := range iv.Attributes {
			if !strings.Contains(loaded, k+":"+v) {
				problems = append(problems, "inline attribute "+k+" not loaded")
			}
		}
	}
	sort.Strings(problems)
	return strings.Join(problems, "; ")
}

func run(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	return string(out), err
}

// Ginkgo's verbose output starts a spec with its name and ends it with a
// line saying how it went: that line is shown with the name while the suite
// runs, and the final counts.
var (
	specStart = regexp.MustCompile(`^External Storage `)
	specEnd   = regexp.MustCompile(`^(• |S \[SKIPPED\]|P \[PENDING\])`)
	counts    = regexp.MustCompile(`^(Ran \d+ of \d+|FAIL!|SUCCESS!)`)
)

// runLogged runs the suite with its output in logPath, showing its progress.
func runLogged(ctx context.Context, tag, logPath, name string, args ...string) error {
	log, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer log.Close()
	fmt.Fprintf(log, "# %s %s\n", name, strings.Join(args, " "))
	pr, pw := io.Pipe()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = pw, pw
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGINT) }
	cmd.WaitDelay = time.Minute
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 1<<20), 4<<20)
		name := ""
		for sc.Scan() {
			l := sc.Text()
			fmt.Fprintln(log, l)
			switch {
			case specStart.MatchString(l):
				name = strings.TrimPrefix(l, "External Storage [Driver: podvol.io] ")
			case specEnd.MatchString(l):
				if name != "" {
					fmt.Fprintf(os.Stderr, "   [%s] %s %s\n", tag, l, name)
				}
				name = ""
			case counts.MatchString(l):
				fmt.Fprintf(os.Stderr, "   [%s] %s\n", tag, l)
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	err = cmd.Wait()
	// Closing the pipe's write end only ends the reader above; it cannot
	// fail in a way that matters for the suite's result.
	_ = pw.Close()
	<-done
	return err
}

func fail(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "conformance: "+format+"\n", a...)
	os.Exit(1)
}
