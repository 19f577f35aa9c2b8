package main

import (
	"os"
	"strings"
	"testing"
	"time"
)

func durs(ms ...int) []time.Duration {
	var d []time.Duration
	for _, m := range ms {
		d = append(d, time.Duration(m)*time.Millisecond)
	}
	return d
}

func TestPercentileIsNearestRank(t *testing.T) {
	s := durs(1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
	for _, c := range []struct {
		p    float64
		want int
	}{{.5, 5}, {.9, 9}, {1, 10}, {.01, 1}, {.91, 10}} {
		if got := Percentile(s, c.p); got != time.Duration(c.want)*time.Millisecond {
			t.Errorf("p%v = %v, want %dms", c.p*100, got, c.want)
		}
	}
	if Percentile(nil, .5) != 0 {
		t.Error("empty: want 0")
	}
	st := Summarize(durs(30, 10, 20))
	if st.N != 3 || st.P50 != 20*time.Millisecond || st.P90 != 30*time.Millisecond || st.Max != 30*time.Millisecond {
		t.Errorf("Summarize = %+v", st)
	}
}

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// sample makes a pod whose events come at the given ms after t0 (-1: not
// seen).
func sample(cell, mode string, ms ...int) Sample {
	s := Sample{Cell: cell, Mode: mode, Pod: cell}
	for e, m := range ms {
		if m >= 0 {
			s.At[e] = t0.Add(time.Duration(m) * time.Millisecond)
		}
	}
	return s
}

// testResult: emptyDir 1 s, inline 1.5 s, ephemeral 3 s (claim at 0.1 s,
// node selected 0.3 s, PV 0.5 s, bound 0.6 s, scheduled 1.6 s), and a
// persistent claim bound 2 s before its pod, which is Ready in 1.4 s.
func testResult() *Result {
	const one, burst = "one at a time", "2 at once"
	r := &Result{Cells: cells, Modes: []Mode{{one, 1}, {burst, 2}}, Ops: map[Key]OpTotals{}}
	for _, m := range []string{one, burst} {
		r.Samples = append(r.Samples,
			sample("emptyDir", m, 0, -1, -1, -1, -1, 200, 1000),
			sample("inline", m, 0, -1, -1, -1, -1, 200, 1500),
			sample("ephemeral", m, 0, 100, 300, 500, 600, 1600, 3000),
			sample("ephemeral-watch", m, 0, 100, 300, 500, 600, 650, 2000),
			sample("ephemeral-xfs", m, 0, 100, 300, 700, 800, 1800, 4000),
			sample("persistent", m, 2000, 0, 100, 300, 400, 2200, 3400),
		)
		r.Ops[Key{"ephemeral", m}] = OpTotals{"CreateVolume": {0.2, 1}, "NodeStageVolume": {0.6, 2}, "NodePublishVolume": {0.1, 1}}
	}
	return r
}

func TestBreakdownFollowsEachKindsPhases(t *testing.T) {
	r := testResult()
	got := map[string]time.Duration{}
	for _, row := range r.Breakdown(cell(t, "ephemeral"), "one at a time") {
		got[row.Phase.Name] = row.Stats.P50
	}
	want := map[string]time.Duration{
		"pod created → claim created": 100 * time.Millisecond, "claim created → node selected": 200 * time.Millisecond,
		"node selected → PV created": 200 * time.Millisecond, "PV created → claim bound": 100 * time.Millisecond,
		"claim bound → pod scheduled": time.Second, "pod scheduled → Ready": 1400 * time.Millisecond,
		"pod created → Ready": 3 * time.Second,
	}
	if len(got) != len(want) {
		t.Errorf("phases %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	rows := r.Breakdown(cell(t, "persistent"), "one at a time")
	if rows[0].Phase.Name != "claim created → node selected" || InPodStartup(Persistent, rows[0].Phase) {
		t.Errorf("persistent's first phase %+v should be its claim's, before the pod", rows[0])
	}
	if p := rows[3].Phase; p.Name != "pod created → pod scheduled" || !InPodStartup(Persistent, p) || rows[3].Stats.P50 != 200*time.Millisecond {
		t.Errorf("persistent's pod phase %+v", rows[3])
	}
	if len(r.Breakdown(cell(t, "emptyDir"), "one at a time")) != 3 {
		t.Error("emptyDir: want scheduled, Ready and the total")
	}
}

func TestRatiosAgainstEmptyDirAndInline(t *testing.T) {
	for _, row := range testResult().Ratios() {
		if row.Cell == "ephemeral" {
			if row.VsEmptyDir != [2]float64{3, 3} || row.VsInline != [2]float64{2, 2} {
				t.Errorf("ephemeral ratios %+v", row)
			}
		}
		if row.Cell == "emptyDir" && row.VsEmptyDir[0] != 1 {
			t.Errorf("emptyDir / emptyDir = %v", row.VsEmptyDir[0])
		}
	}
	if Ratio(time.Second, 0) != 0 {
		t.Error("ratio to nothing should be 0")
	}
}

func TestShareIsClaimToBoundPlusStageAndPublish(t *testing.T) {
	shares := testResult().Shares()
	if len(shares) != 6 { // three ephemeral cells, two modes
		t.Fatalf("%d share rows, want 6", len(shares))
	}
	s := shares[0]
	if s.Cell != "ephemeral" || s.ClaimToBound.P50 != 500*time.Millisecond || s.Stage != 300*time.Millisecond ||
		s.Publish != 100*time.Millisecond || s.Create != 200*time.Millisecond || s.Podvol != 900*time.Millisecond || s.Share != .3 {
		t.Errorf("share %+v", s)
	}
}

func cell(t *testing.T, name string) Cell {
	t.Helper()
	for _, c := range cells {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no cell %q", name)
	return Cell{}
}

// The side-by-side rows pair the ext4 generic ephemeral cell under each
// scheduler, and exist only when both ran.
func TestSchedulerRowsPairTheTwoSchedulers(t *testing.T) {
	r := testResult()
	rows := r.SchedulerRows()
	if len(rows) != 2 {
		t.Fatalf("%d rows, want one a mode", len(rows))
	}
	row := rows[0]
	if row.Wait[0].P50 != time.Second || row.Wait[1].P50 != 50*time.Millisecond ||
		row.Total[0].P50 != 3*time.Second || row.Total[1].P50 != 2*time.Second ||
		row.TotalVsInline[0] != [2]float64{2, 2} || row.TotalVsInline[1][0] != 2.0/1.5 {
		t.Errorf("row %+v", row)
	}
	r.Cells = []Cell{cell(t, "inline"), cell(t, "ephemeral")}
	if got := r.SchedulerRows(); got != nil {
		t.Errorf("without ephemeral-watch: %+v", got)
	}
	md := Markdown(testResult(), Meta{Date: t0, Pods: 1})
	if !strings.Contains(md, "| one at a time | 1.00s / 1.00s | 0.05s / 0.05s | 3.00s / 3.00s | 2.00s / 2.00s | 0.67× | 2.00× | 1.33× | 2.00× | 1.33× |") {
		t.Errorf("markdown lacks the side-by-side row:\n%s", md)
	}
}

func TestOpTotalsDeltaAndMean(t *testing.T) {
	before := OpTotals{"NodeStageVolume": {1, 10}}
	after := OpTotals{"NodeStageVolume": {1.5, 12}, "NodePublishVolume": {0.02, 2}}
	d := after.Sub(before)
	if m, n := d.Mean("NodeStageVolume"); m != 250*time.Millisecond || n != 2 {
		t.Errorf("stage mean %v over %d", m, n)
	}
	if m, n := d.Mean("NodePublishVolume"); m != 10*time.Millisecond || n != 2 {
		t.Errorf("publish mean %v over %d", m, n)
	}
	if _, n := d.Mean("CreateVolume"); n != 0 {
		t.Error("no calls: want 0")
	}
	sum := OpTotals{}
	sum.Add(d)
	sum.Add(d)
	if sum["NodeStageVolume"] != [2]float64{1, 4} {
		t.Errorf("Add: %v", sum)
	}
}

func TestParseMetrics(t *testing.T) {
	text := `# HELP podvol_csi_operation_duration_seconds Duration of CSI calls.
# TYPE podvol_csi_operation_duration_seconds histogram
podvol_csi_operation_duration_seconds_bucket{code="OK",method="NodeStageVolume",le="0.001"} 0
podvol_csi_operation_duration_seconds_sum{code="OK",method="NodeStageVolume"} 1.25
podvol_csi_operation_duration_seconds_count{code="OK",method="NodeStageVolume"} 5
podvol_csi_operation_duration_seconds_sum{code="Internal",method="NodeStageVolume"} 0.25
podvol_csi_operation_duration_seconds_count{code="Internal",method="NodeStageVolume"} 1
podvol_csi_operation_duration_seconds_sum{code="OK",method="NodePublishVolume"} 0.5
podvol_csi_operation_duration_seconds_count{code="OK",method="NodePublishVolume"} 5
podvol_volumes{kind="inline"} 2
podvol_volumes{kind="persistent"} 3
podvol_pool_free_bytes 1.2e+10
`
	s := ParseMetrics(text)
	if s.Volumes != 5 {
		t.Errorf("volumes %d, want 5", s.Volumes)
	}
	if s.Ops["NodeStageVolume"] != [2]float64{1.5, 6} || s.Ops["NodePublishVolume"] != [2]float64{0.5, 5} {
		t.Errorf("ops %v", s.Ops)
	}
	if _, _, _, ok := splitSample("garbage{"); ok {
		t.Error("garbage parsed")
	}
}

func TestRenderings(t *testing.T) {
	r := testResult()
	m := Meta{Date: t0, Took: time.Minute, Machine: "test machine", Kubernetes: "v1.37.2", Nodes: []string{"a", "b"},
		Pods: 40, PodsOne: 40, Burst: 2, Rounds: 2, Orders: [][]string{{"inline", "emptyDir"}, {"emptyDir", "inline"}}}
	md := Markdown(r, m)
	for _, want := range []string{
		"| one at a time | ephemeral | 1 | 3.00s | 3.00s | 3.00s | 3.00× | 3.00× | 2.00× | 2.00× |",
		"| one at a time | ephemeral | 0.50s | 0.20s | 0.30s | 0.10s | 0.90s | 3.00s | 30% |",
		"| persistent | claim created → node selected (before the pod) | 0.10s |",
		"| ephemeral | NodeStageVolume (plugin, mean of calls) | 0.30s | (2 calls) |",
		"| emptyDir | **pod created → Ready** | 1.00s | 1.00s | 1.00s | 1.00s | 1.00s | 1.00s |",
		"2026-01-02", "binder.go", "round 1: inline, emptyDir", "the 5th slowest",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	pods, err := PodsCSV(r)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(pods)), "\n")
	if len(lines) != 13 || lines[0] != "cell,mode,round,pod,node,pod_created_ms,claim_created_ms,node_selected_ms,pv_created_ms,claim_bound_ms,pod_scheduled_ms,ready_ms" {
		t.Errorf("pods CSV:\n%s", pods)
	}
	if !strings.Contains(string(pods), "persistent,one at a time,0,persistent,,0,-2000,-1900,-1700,-1600,200,1400") {
		t.Errorf("persistent row: claim events should be negative:\n%s", pods)
	}
	sum, err := SummaryCSV(r)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ephemeral,one at a time,pod created → Ready,1,3000,3000,3000,", "ephemeral,2 at once,NodeStageVolume (plugin),2,,,,300.0"} {
		if !strings.Contains(string(sum), want) {
			t.Errorf("summary CSV lacks %q:\n%s", want, sum)
		}
	}
	if b := Plot(r, m).Img.Bounds(); b.Dx() != 1000 || b.Dy() < 200 {
		t.Errorf("plot of %v", b)
	}
}

func TestWriteWritesEveryFile(t *testing.T) {
	dir := t.TempDir()
	if err := write(dir, testResult(), Meta{Date: t0, Pods: 1}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{readmeName, pngName, podsCSV, summaryCSV} {
		if !fileNonEmpty(dir + "/" + f) {
			t.Errorf("%s not written", f)
		}
	}
}

func fileNonEmpty(p string) bool {
	b, err := os.ReadFile(p)
	return err == nil && len(b) > 0
}
