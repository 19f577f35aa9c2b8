package main

import (
	"encoding/csv"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/podvol/podvol/bench/internal/plot"
)

// Meta is what the report says about the run.
type Meta struct {
	Date                time.Time
	Took                time.Duration
	Machine, Kubernetes string
	Nodes               []string
	Pods, Burst, Rounds int
	PodsOne             int    // pods per cell one at a time
	LoadStart           string // load average when the run began
	Seed                uint64
	Probe               bool
	Orders              [][]string // cell order of each round
}

func machine() string {
	return fmt.Sprintf("%s, %d CPUs, kernel %s, load average %s (1, 5, 15 min) at the end", plot.CPUModel(), plot.NumCPU(), plot.Uname(), plot.LoadAvg())
}

const (
	pngName     = "startup.png"
	podsCSV     = "startup-pods.csv"
	summaryCSV  = "startup-summary.csv"
	readmeName  = "README.md"
	pluginShare = "podvol's share"
)

// write writes the report's four files into dir and the markdown to stdout.
func write(dir string, r *Result, m Meta) error {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	files := []struct {
		name string
		data func() ([]byte, error)
	}{
		{podsCSV, func() ([]byte, error) { return PodsCSV(r) }},
		{summaryCSV, func() ([]byte, error) { return SummaryCSV(r) }},
		{readmeName, func() ([]byte, error) { return []byte(Markdown(r, m)), nil }},
	}
	for _, f := range files {
		b, err := f.data()
		if err != nil {
			return err
		}
		if err := writeFile(filepath.Join(dir, f.name), b); err != nil {
			return err
		}
	}
	if err := Plot(r, m).WritePNG(filepath.Join(dir, pngName)); err != nil {
		return err
	}
	fmt.Print(Markdown(r, m))
	return nil
}

func writeFile(path string, b []byte) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func msec(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

// PodsCSV is one row a pod: each event in milliseconds after the pod was
// created (a persistent claim's are negative), empty when not seen.
func PodsCSV(r *Result) ([]byte, error) {
	var b strings.Builder
	w := csv.NewWriter(&b)
	head := []string{"cell", "mode", "round", "pod", "node"}
	for e := range numEvents {
		head = append(head, eventKeys[e]+"_ms")
	}
	if err := w.Write(head); err != nil {
		return nil, err
	}
	for _, s := range r.Samples {
		row := []string{s.Cell, s.Mode, strconv.Itoa(s.Round), s.Pod, s.Node}
		for e := range numEvents {
			v := ""
			if !s.At[e].IsZero() && !s.At[PodCreated].IsZero() {
				v = msec(s.At[e].Sub(s.At[PodCreated]))
			}
			row = append(row, v)
		}
		if err := w.Write(row); err != nil {
			return nil, err
		}
	}
	w.Flush()
	return []byte(b.String()), w.Error()
}

// SummaryCSV is one row a cell, mode and phase (the total and the plugin's
// mean call durations included).
func SummaryCSV(r *Result) ([]byte, error) {
	var b strings.Builder
	w := csv.NewWriter(&b)
	rows := [][]string{{"cell", "mode", "phase", "n", "p50_ms", "p90_ms", "max_ms", "mean_ms"}}
	for _, m := range r.Modes {
		for _, c := range r.Cells {
			for _, row := range r.Breakdown(c, m.Name) {
				st := row.Stats
				rows = append(rows, []string{c.Name, m.Name, row.Phase.Name, strconv.Itoa(st.N), msec(st.P50), msec(st.P90), msec(st.Max), ""})
			}
			for _, method := range methods {
				if mean, n := r.Ops[Key{c.Name, m.Name}].Mean(method); n > 0 {
					rows = append(rows, []string{c.Name, m.Name, method + " (plugin)", strconv.Itoa(n), "", "", "", fmt.Sprintf("%.1f", float64(mean.Microseconds())/1000)})
				}
			}
		}
	}
	if err := w.WriteAll(rows); err != nil {
		return nil, err
	}
	return []byte(b.String()), nil
}

// methods are the plugin's calls on a pod's way to start.
var methods = []string{"CreateVolume", "NodeStageVolume", "NodePublishVolume"}

func x(f float64) string {
	if f == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", f)
}

// PhaseTable is the per-phase breakdown as a markdown table, one column
// group per mode.
func PhaseTable(r *Result) string {
	var w strings.Builder
	head, sep := "| cell | phase |", "|---|---|"
	for _, m := range r.Modes {
		head += fmt.Sprintf(" %s: p50 | p90 | max |", m.Name)
		sep += "---:|---:|---:|"
	}
	w.WriteString(head + "\n" + sep + "\n")
	for _, c := range r.Cells {
		byMode := make([][]PhaseRow, len(r.Modes))
		for i, m := range r.Modes {
			byMode[i] = r.Breakdown(c, m.Name)
		}
		for j, row := range byMode[0] {
			name := row.Phase.Name
			if !InPodStartup(c.Kind, row.Phase) {
				name += " (before the pod)"
			}
			if row.Phase == Total {
				name = "**" + name + "**"
			}
			line := fmt.Sprintf("| %s | %s |", c.Name, name)
			for i := range r.Modes {
				st := byMode[i][j].Stats
				if st.N == 0 {
					line += " – | – | – |"
					continue
				}
				line += fmt.Sprintf(" %s | %s | %s |", ms(st.P50), ms(st.P90), ms(st.Max))
			}
			w.WriteString(line + "\n")
		}
		for _, method := range methods {
			line := fmt.Sprintf("| %s | %s (plugin, mean of calls) |", c.Name, method)
			seen := false
			for _, m := range r.Modes {
				mean, n := r.Ops[Key{c.Name, m.Name}].Mean(method)
				if n == 0 {
					line += " – | | |"
					continue
				}
				seen = true
				line += fmt.Sprintf(" %s | (%d calls) | |", ms(mean), n)
			}
			if seen {
				w.WriteString(line + "\n")
			}
		}
	}
	return w.String()
}

// RatioTable is pod created → Ready per cell and mode with its ratios to
// emptyDir and to inline.
func RatioTable(r *Result) string {
	var w strings.Builder
	w.WriteString("| mode | cell | n | p50 | p90 | max | p50 / emptyDir | p90 / emptyDir | p50 / inline | p90 / inline |\n")
	w.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, row := range r.Ratios() {
		fmt.Fprintf(&w, "| %s | %s | %d | %s | %s | %s | %s | %s | %s | %s |\n", row.Mode, row.Cell, row.Total.N,
			ms(row.Total.P50), ms(row.Total.P90), ms(row.Total.Max),
			x(row.VsEmptyDir[0]), x(row.VsEmptyDir[1]), x(row.VsInline[0]), x(row.VsInline[1]))
	}
	return w.String()
}

// SchedulerTable is the generic ephemeral volume under Kubernetes'
// kube-scheduler and under the patched one, side by side.
func SchedulerTable(r *Result) string {
	var w strings.Builder
	w.WriteString("| mode | claim bound → pod scheduled, p50 / p90: Kubernetes' | patched | pod created → Ready, p50 / p90: Kubernetes' | patched | patched / Kubernetes' (p50) | p50 / inline: Kubernetes' | patched | p90 / inline: Kubernetes' | patched |\n")
	w.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, row := range r.SchedulerRows() {
		fmt.Fprintf(&w, "| %s | %s / %s | %s / %s | %s / %s | %s / %s | %s | %s | %s | %s | %s |\n", row.Mode,
			ms(row.Wait[0].P50), ms(row.Wait[0].P90), ms(row.Wait[1].P50), ms(row.Wait[1].P90),
			ms(row.Total[0].P50), ms(row.Total[0].P90), ms(row.Total[1].P50), ms(row.Total[1].P90),
			x(Ratio(row.Total[1].P50, row.Total[0].P50)),
			x(row.TotalVsInline[0][0]), x(row.TotalVsInline[1][0]), x(row.TotalVsInline[0][1]), x(row.TotalVsInline[1][1]))
	}
	return w.String()
}

// ShareTable is podvol's own part of a generic ephemeral volume's start-up.
func ShareTable(r *Result) string {
	var w strings.Builder
	w.WriteString("| mode | cell | claim created → bound (p50) | of which CreateVolume (mean) | NodeStageVolume (mean) | NodePublishVolume (mean) | podvol's part | pod created → Ready (p50) | share |\n")
	w.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range r.Shares() {
		fmt.Fprintf(&w, "| %s | %s | %s | %s | %s | %s | %s | %s | %.0f%% |\n", s.Mode, s.Cell, ms(s.ClaimToBound.P50),
			ms(s.Create), ms(s.Stage), ms(s.Publish), ms(s.Podvol), ms(s.Total), 100*s.Share)
	}
	return w.String()
}

// Markdown is bench/startup/README.md.
func Markdown(r *Result, m Meta) string {
	var w strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&w, format+"\n", a...) }
	p("# Pod start-up: generic ephemeral volume vs CSI inline volume vs emptyDir")
	p("")
	p("`make bench-startup` (as root; it takes the dev cluster's lock, and brings the cluster up if it is not running)")
	p("writes this file, `%s`, `%s` (one row a pod, each event in ms after the pod's creation) and", pngName, podsCSV)
	p("`%s` beside it. It answers the SIG Storage thread's question: what does a generic ephemeral volume (a PVC", summaryCSV)
	p("made for each pod) cost a pod's start-up, next to a CSI inline volume and an `emptyDir`? On the dev cluster")
	p("(docs/dev-cluster.md: Kubernetes %s, real kubelets, containerd, kube-scheduler and the CSI sidecars),", m.Kubernetes)
	p("it starts pods of the dev cluster's busybox image (`devcluster.Image`) that write one file into their volume and sleep:")
	p("")
	for _, c := range r.Cells {
		p("- **%s**: %s;", c.Name, c.What)
	}
	p("")
	p("each %s: %d pods per cell one at a time and %d in batches of %d, over %d rounds, each round running every cell in an order", modeNames(r), m.PodsOne, m.Pods, m.Burst, m.Rounds)
	p("of its own (%s). Between batches the benchmark deletes its pods and claims and waits until", orders(m.Orders))
	p("none of its pods, claims or PVs is left and every node's `podvol_volumes` is back where it was: every batch starts")
	p("on a quiet cluster. The benchmark's namespace `%s` is deleted at the end, also on failure or interrupt.", namespace)
	p("Options: `make bench-startup STARTUP_FLAGS='-pods 40 -pods-one 40 -burst 20 -rounds 2'` (the defaults; `go run ./bench/startup -h`).")
	p("")
	p("Every timestamp is when the benchmark's API watches (client-go informers, the admin kubeconfig) first saw the")
	p("change: the pod created; its claim created; the claim's `%s` annotation (the scheduler's choice); the", selectedNode)
	p("PV created (by the node's external-provisioner, after podvol's CreateVolume); the claim Bound; the pod scheduled")
	p("(`spec.nodeName`); the pod Ready. The plugin's own CSI call durations are the deltas of")
	p("`podvol_csi_operation_duration_seconds` (sum / count per method) over each batch, summed over every node.")
	if m.Probe {
		p("The pods have the e2e tests' readiness probe (`test -e` the file every second), which adds up to a second to Ready.")
	} else {
		p("The pods have no readiness probe: Ready is when the container runs, right before it writes the file (a failed")
		p("write ends the container, and the benchmark fails a batch whose containers restarted or stopped). A probe every")
		p("second, as the e2e tests' pods have (`-readiness-probe`), would add 0 to 1 s of noise to every cell alike.")
	}
	p("")
	p("## Measured here (%s)", m.Date.Format("2006-01-02"))
	p("")
	p("Machine: %s; load average %s at the start; %d nodes (%s) on it; the run took %s.", m.Machine, m.LoadStart, len(m.Nodes), strings.Join(m.Nodes, ", "), m.Took.Round(time.Second))
	p("Everything runs on this machine's CPUs: other work on it (a load average above its CPU count) slows every cell")
	p("and widens the p90s, so compare cells of one run, not runs.")
	p("")
	p("### Pod created → Ready, and ratios")
	p("")
	w.WriteString(RatioTable(r))
	p("")
	p("### podvol's share of a generic ephemeral volume's start-up")
	p("")
	w.WriteString(ShareTable(r))
	p("")
	p("*podvol's part* is claim created → bound (p50) + NodeStageVolume + NodePublishVolume (means); *share* is that over")
	p("pod created → Ready (p50). Claim created → bound holds the scheduler's choice of a node (claim created → node")
	p("selected), the external-provisioner's queue and its PV, as well as podvol's CreateVolume; the breakdown below splits it.")
	p("")
	if len(r.SchedulerRows()) > 0 {
		p("### The scheduler's floor, side by side")
		p("")
		p("*ephemeral* under Kubernetes' kube-scheduler and *ephemeral-watch* under the same kube-scheduler with volume")
		p("binding's PreBind woken by claim and PV updates instead of polling every second")
		p("(`tools/k8s/kube-scheduler-prebind-watch.patch`; the proposal: `docs/proposals/scheduler-prebind-watch.md`):")
		p("")
		w.WriteString(SchedulerTable(r))
		p("")
	}
	p("### Phase by phase")
	p("")
	w.WriteString(PhaseTable(r))
	p("")
	p("![start-up phases per cell, p50](%s)", pngName)
	p("")
	p("## How to read it")
	p("")
	p("- The ratio columns divide a cell's pod created → Ready by emptyDir's (nothing to provision or mount) and by")
	p("  the inline volume's (the same podvol volume, with no claim) in the same mode: the inline ratio to emptyDir is")
	p("  podvol's cost of making, formatting and mounting a volume; the ephemeral one's to inline is what the claim adds.")
	p("- **The scheduler's floor.** A generic ephemeral (or any WaitForFirstConsumer) claim waits in kube-scheduler's")
	p("  volume binding PreBind: after setting `selected-node` it polls the claim every second until it is bound")
	p("  (`wait.PollUntilContextTimeout(ctx, time.Second, ...)` in")
	p("  `pkg/scheduler/framework/plugins/volumebinding/binder.go`, %s). Only after that is the pod bound to its", m.Kubernetes)
	p("  node, so the *claim bound → pod scheduled* phase is up to ~1 s however fast the volume was made, and pod")
	p("  created → Ready of a generic ephemeral volume is up to a second above the inline volume's when one pod starts")
	p("  alone. That second is the scheduler's, not podvol's; the *podvol's share* table separates the two. With many")
	p("  pods at once the poll overlaps the queueing of the others and weighs less.")
	p("- A persistent claim is provisioned and bound before its pod is created (its claim phases are marked *before the")
	p("  pod*), so its pod's start-up is close to the inline volume's: what is left is staging and publishing.")
	p("- In the N-at-once mode the pods' phases overlap: the sidecars, the ephemeral-volume controller and the kubelets")
	p("  queue them, and all %d nodes run on this one machine's CPUs, so the figures grow with N.", len(m.Nodes))
	few := min(m.Pods, m.PodsOne)
	p("- p50 and p90 are nearest-rank percentiles; with %d pods per cell the p90 is the %s slowest, so read it", few, ordinal(few-int(math.Ceil(0.9*float64(few)))+1))
	p("  as rough. The plugin's call durations are means over every call in the cell (the histogram's buckets are too")
	p("  coarse for percentiles). Timestamps are the watch's, so each includes the API server's and the watch's delay")
	p("  (milliseconds here), alike for every event.")
	p("- The stacked bars in `%s` are the p50 of each phase of the pod's start-up; the p50s of the phases need not add", pngName)
	p("  up to the p50 of the total, which is marked on each bar.")
	return w.String()
}

func ordinal(n int) string {
	switch {
	case n%100 >= 11 && n%100 <= 13:
		return fmt.Sprintf("%dth", n)
	case n%10 == 1:
		return fmt.Sprintf("%dst", n)
	case n%10 == 2:
		return fmt.Sprintf("%dnd", n)
	case n%10 == 3:
		return fmt.Sprintf("%drd", n)
	}
	return fmt.Sprintf("%dth", n)
}

func modeNames(r *Result) string {
	var s []string
	for _, m := range r.Modes {
		s = append(s, "*"+m.Name+"*")
	}
	return strings.Join(s, " and ")
}

func orders(o [][]string) string {
	var s []string
	for i, names := range o {
		s = append(s, fmt.Sprintf("round %d: %s", i+1, strings.Join(names, ", ")))
	}
	return strings.Join(s, "; ")
}
