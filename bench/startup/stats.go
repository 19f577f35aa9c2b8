package main

import (
	"math"
	"slices"
	"time"
)

// Event is one moment of a pod's start-up, as the API watches saw it.
type Event int

const (
	PodCreated Event = iota
	ClaimCreated
	NodeSelected // the claim's volume.kubernetes.io/selected-node appeared
	PVCreated
	ClaimBound
	PodScheduled // spec.nodeName set (or the PodScheduled condition True)
	Ready
	numEvents
)

var eventNames = [numEvents]string{"pod created", "claim created", "node selected", "PV created", "claim bound", "pod scheduled", "Ready"}
var eventKeys = [numEvents]string{"pod_created", "claim_created", "node_selected", "pv_created", "claim_bound", "pod_scheduled", "ready"}

func (e Event) String() string { return eventNames[e] }

// Kind is what a cell's volume goes through before its pod can start.
type Kind int

const (
	// NoClaim: emptyDir and CSI inline volumes, nothing but the pod.
	NoClaim Kind = iota
	// Ephemeral: a generic ephemeral volume, a claim made for the pod and
	// provisioned on the node the scheduler picks.
	Ephemeral
	// Persistent: a claim created and bound before the pod.
	Persistent
)

// Cell is one kind of pod the benchmark starts.
type Cell struct {
	Name  string
	Kind  Kind
	Class string // StorageClass of Ephemeral and Persistent cells
	// Inline marks the CSI inline volume (NoClaim).
	Inline bool
	// Scheduler is the kube-scheduler the cell runs with: "" is
	// Kubernetes' own, PrebindWatch the patched one.
	Scheduler string
	What      string // one line for the report
}

// PrebindWatch is kube-scheduler built with tools/k8s/kube-scheduler-prebind-watch.patch:
// volume binding's PreBind woken by claim and PV updates rather than a 1 s poll.
const PrebindWatch = "kube-scheduler-prebind-watch"

var cells = []Cell{
	{Name: "emptyDir", Kind: NoClaim, What: "`emptyDir: {}`"},
	{Name: "inline", Kind: NoClaim, Inline: true, What: "podvol CSI inline volume, `volumeAttributes: {size: 64Mi}` (ext4)"},
	{Name: "ephemeral", Kind: Ephemeral, Class: "podvol", What: "generic ephemeral volume, class `podvol` (ext4), 64Mi"},
	{Name: "ephemeral-watch", Kind: Ephemeral, Class: "podvol", Scheduler: PrebindWatch, What: "as *ephemeral*, with kube-scheduler's PreBind woken by claim updates instead of its 1 s poll (`tools/k8s/kube-scheduler-prebind-watch.patch`, built from the same module; every other cell runs Kubernetes' own kube-scheduler)"},
	{Name: "ephemeral-xfs", Kind: Ephemeral, Class: "podvol-xfs", What: "generic ephemeral volume, class `podvol-xfs`, 64Mi asked (podvol makes 300Mi, xfs's least)"},
	{Name: "persistent", Kind: Persistent, Class: "podvol", What: "PVC of class `podvol` (ext4), 64Mi, created and bound (selected-node set by the benchmark) before the pod"},
}

// Phase is the time from one event to another.
type Phase struct {
	Name     string
	From, To Event
}

// Total is what the thread asks about: the pod's start-up as its user sees it.
var Total = Phase{"pod created → Ready", PodCreated, Ready}

// ClaimToBound is the claim's way to a volume: podvol's provisioning, and the
// scheduler's choice of node before it.
var ClaimToBound = Phase{"claim created → bound", ClaimCreated, ClaimBound}

// PhasesOf are the consecutive phases of a cell's pods, in order. A
// persistent claim's phases happen before its pod is created: they are
// listed first and are not part of the pod's start-up.
func PhasesOf(k Kind) []Phase {
	claim := []Phase{
		{"claim created → node selected", ClaimCreated, NodeSelected},
		{"node selected → PV created", NodeSelected, PVCreated},
		{"PV created → claim bound", PVCreated, ClaimBound},
	}
	switch k {
	case Ephemeral:
		return append(append([]Phase{{"pod created → claim created", PodCreated, ClaimCreated}}, claim...),
			ClaimBoundToScheduled,
			Phase{"pod scheduled → Ready", PodScheduled, Ready})
	case Persistent:
		return append(claim,
			Phase{"pod created → pod scheduled", PodCreated, PodScheduled},
			Phase{"pod scheduled → Ready", PodScheduled, Ready})
	default:
		return []Phase{{"pod created → pod scheduled", PodCreated, PodScheduled}, {"pod scheduled → Ready", PodScheduled, Ready}}
	}
}

// InPodStartup says whether a phase of kind k lies between the pod's
// creation and Ready (the stacked bars show only those).
func InPodStartup(k Kind, p Phase) bool {
	return k != Persistent || p.From == PodCreated || p.From == PodScheduled
}

// Mode is how many pods start at once.
type Mode struct {
	Name  string
	Batch int
}

// Sample is one pod's start-up.
type Sample struct {
	Cell, Mode string
	Round      int
	Pod, Node  string
	At         [numEvents]time.Time
}

// Duration of p for this pod, and whether both ends were seen.
func (s *Sample) Duration(p Phase) (time.Duration, bool) {
	a, b := s.At[p.From], s.At[p.To]
	if a.IsZero() || b.IsZero() {
		return 0, false
	}
	return b.Sub(a), true
}

// Stats summarises durations.
type Stats struct {
	N             int
	P50, P90, Max time.Duration
}

// Percentile is the nearest-rank percentile (0 < p ≤ 1) of sorted, or 0 if
// it is empty: the smallest value with at least p of the values at or below it.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// Summarize sorts a copy of ds and returns its statistics.
func Summarize(ds []time.Duration) Stats {
	s := slices.Clone(ds)
	slices.Sort(s)
	st := Stats{N: len(s), P50: Percentile(s, .5), P90: Percentile(s, .9)}
	if len(s) > 0 {
		st.Max = s[len(s)-1]
	}
	return st
}

// Key names one cell in one mode.
type Key struct{ Cell, Mode string }

// OpTotals are the plugin's CSI call totals (seconds, calls) by method,
// summed over every node: deltas of podvol_csi_operation_duration_seconds.
type OpTotals map[string][2]float64

// Add adds o's totals to t.
func (t OpTotals) Add(o OpTotals) {
	for m, v := range o {
		c := t[m]
		t[m] = [2]float64{c[0] + v[0], c[1] + v[1]}
	}
}

// Sub is t - o, per method (a delta between two scrapes).
func (t OpTotals) Sub(o OpTotals) OpTotals {
	d := OpTotals{}
	for m, v := range t {
		d[m] = [2]float64{v[0] - o[m][0], v[1] - o[m][1]}
	}
	return d
}

// Mean is the mean duration of method's calls and their number.
func (t OpTotals) Mean(method string) (time.Duration, int) {
	v := t[method]
	if v[1] <= 0 {
		return 0, 0
	}
	return time.Duration(v[0] / v[1] * float64(time.Second)), int(math.Round(v[1]))
}

// Result is a whole run.
type Result struct {
	Cells   []Cell
	Modes   []Mode
	Samples []Sample
	Ops     map[Key]OpTotals
}

// PhaseRow is one row of the breakdown.
type PhaseRow struct {
	Phase Phase
	Stats Stats
}

// Durations of p for the samples of k.
func (r *Result) Durations(k Key, p Phase) []time.Duration {
	var ds []time.Duration
	for i := range r.Samples {
		s := &r.Samples[i]
		if s.Cell != k.Cell || s.Mode != k.Mode {
			continue
		}
		if d, ok := s.Duration(p); ok {
			ds = append(ds, d)
		}
	}
	return ds
}

// Breakdown is the phases of cell c in mode m, then the total.
func (r *Result) Breakdown(c Cell, m string) []PhaseRow {
	k := Key{c.Name, m}
	var rows []PhaseRow
	for _, p := range PhasesOf(c.Kind) {
		rows = append(rows, PhaseRow{p, Summarize(r.Durations(k, p))})
	}
	return append(rows, PhaseRow{Total, Summarize(r.Durations(k, Total))})
}

// TotalStats is pod created → Ready of cell in mode m.
func (r *Result) TotalStats(cell, m string) Stats {
	return Summarize(r.Durations(Key{cell, m}, Total))
}

// Ratio is a/b, or 0 when b is 0.
func Ratio(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// RatioRow compares one cell's total with a reference cell's, in one mode.
type RatioRow struct {
	Cell, Mode string
	Total      Stats
	// VsEmptyDir and VsInline are {p50 ratio, p90 ratio}.
	VsEmptyDir, VsInline [2]float64
}

// Ratios compares every cell's pod created → Ready with emptyDir's and
// inline's in the same mode.
func (r *Result) Ratios() []RatioRow {
	var rows []RatioRow
	for _, m := range r.Modes {
		ed, in := r.TotalStats("emptyDir", m.Name), r.TotalStats("inline", m.Name)
		for _, c := range r.Cells {
			t := r.TotalStats(c.Name, m.Name)
			rows = append(rows, RatioRow{
				Cell: c.Name, Mode: m.Name, Total: t,
				VsEmptyDir: [2]float64{Ratio(t.P50, ed.P50), Ratio(t.P90, ed.P90)},
				VsInline:   [2]float64{Ratio(t.P50, in.P50), Ratio(t.P90, in.P90)},
			})
		}
	}
	return rows
}

// ShareRow is podvol's own part of a generic ephemeral volume's start-up.
type ShareRow struct {
	Cell, Mode     string
	ClaimToBound   Stats         // claim created → bound
	Stage, Publish time.Duration // mean NodeStageVolume, NodePublishVolume
	Create         time.Duration // mean CreateVolume (inside claim created → bound)
	Podvol, Total  time.Duration // p50 claim→bound + stage + publish; p50 pod created → Ready
	Share          float64       // Podvol / Total
}

// Shares is ShareRow for every Ephemeral cell and mode.
func (r *Result) Shares() []ShareRow {
	var rows []ShareRow
	for _, m := range r.Modes {
		for _, c := range r.Cells {
			if c.Kind != Ephemeral {
				continue
			}
			k := Key{c.Name, m.Name}
			row := ShareRow{Cell: c.Name, Mode: m.Name, ClaimToBound: Summarize(r.Durations(k, ClaimToBound))}
			row.Stage, _ = r.Ops[k].Mean("NodeStageVolume")
			row.Publish, _ = r.Ops[k].Mean("NodePublishVolume")
			row.Create, _ = r.Ops[k].Mean("CreateVolume")
			row.Podvol = row.ClaimToBound.P50 + row.Stage + row.Publish
			row.Total = r.TotalStats(c.Name, m.Name).P50
			row.Share = Ratio(row.Podvol, row.Total)
			rows = append(rows, row)
		}
	}
	return rows
}

// ClaimBoundToScheduled is the wait in kube-scheduler's volume binding
// PreBind after the claim is bound: the scheduler's floor.
var ClaimBoundToScheduled = Phase{"claim bound → pod scheduled", ClaimBound, PodScheduled}

// SchedulerRow compares the generic ephemeral volume under Kubernetes'
// kube-scheduler (cell ephemeral) with the same under the patched one (cell
// ephemeral-watch), in one mode.
type SchedulerRow struct {
	Mode string
	// Wait is claim bound → pod scheduled, Total pod created → Ready, each
	// {Kubernetes' scheduler, patched}.
	Wait, Total [2]Stats
	// TotalVsInline is each total's {p50, p90} over the inline volume's.
	TotalVsInline [2][2]float64
}

// SchedulerRows is SchedulerRow for each mode, if both cells ran.
func (r *Result) SchedulerRows() []SchedulerRow {
	var stock, watch *Cell
	for i, c := range r.Cells {
		if c.Kind != Ephemeral || c.Class != "podvol" {
			continue
		}
		switch c.Scheduler {
		case "":
			stock = &r.Cells[i]
		case PrebindWatch:
			watch = &r.Cells[i]
		}
	}
	if stock == nil || watch == nil {
		return nil
	}
	var rows []SchedulerRow
	for _, m := range r.Modes {
		in := r.TotalStats("inline", m.Name)
		row := SchedulerRow{Mode: m.Name}
		for i, c := range []*Cell{stock, watch} {
			row.Wait[i] = Summarize(r.Durations(Key{c.Name, m.Name}, ClaimBoundToScheduled))
			row.Total[i] = r.TotalStats(c.Name, m.Name)
			row.TotalVsInline[i] = [2]float64{Ratio(row.Total[i].P50, in.P50), Ratio(row.Total[i].P90, in.P90)}
		}
		rows = append(rows, row)
	}
	return rows
}
