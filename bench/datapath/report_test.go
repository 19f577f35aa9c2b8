package datapath

import (
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestJudgeAgainstTheTargets(t *testing.T) {
	tp, fs, res := Job{Kind: Throughput}, Job{Kind: Fsync}, Job{Kind: Residency}
	for _, c := range []struct {
		name      string
		j         Job
		pool, vol Result
		ratio     float64
		measured  bool
		met       bool
	}{
		{"throughput above", tp, Result{IOPS: 1000}, Result{IOPS: 950}, 0.95, true, true},
		{"throughput at the target", tp, Result{IOPS: 1000}, Result{IOPS: 900}, 0.9, true, true},
		{"throughput below", tp, Result{IOPS: 1000}, Result{IOPS: 270}, 0.27, true, false},
		{"throughput faster than the disk", tp, Result{IOPS: 1000}, Result{IOPS: 3250}, 3.25, true, true},
		{"fdatasync within", fs, Result{SyncP99Ns: 2e6, Syncs: 10}, Result{SyncP99Ns: 2.1e6, Syncs: 10}, 1.05, true, true},
		{"fdatasync slower", fs, Result{SyncP99Ns: 2e6, Syncs: 10}, Result{SyncP99Ns: 3e6, Syncs: 10}, 1.5, true, false},
		{"fdatasync faster", fs, Result{SyncP99Ns: 2e6, Syncs: 10}, Result{SyncP99Ns: 1e6, Syncs: 10}, 0.5, true, true},
		{"residency none", res, Result{}, Result{Resident: 0, Written: 1 << 30}, 0, true, true},
		{"residency double cached", res, Result{}, Result{Resident: 1022 << 20, Written: 1 << 30}, 1022.0 / 1024, true, false},
		{"residency at 5%", res, Result{}, Result{Resident: 1 << 30 / 20, Written: 1 << 30}, 0.05, true, true},
		{"no pool figure", tp, Result{}, Result{IOPS: 900}, 0, false, false},
		{"no volume figure", tp, Result{IOPS: 1000}, Result{}, 0, false, false},
		{"no fdatasync on the pool", fs, Result{}, Result{SyncP99Ns: 1e6, Syncs: 10}, 0, false, false},
		{"nothing written", res, Result{}, Result{}, 0, false, false},
	} {
		v := Judge(c.j, c.pool, c.vol)
		if v.Measured != c.measured || v.Met != c.met || (c.measured && abs(v.Ratio-c.ratio) > 1e-9) {
			t.Errorf("%s: %+v, want ratio %.3f measured %v met %v", c.name, v, c.ratio, c.measured, c.met)
		}
	}
}

func abs(f float64) float64 {
	if f < 0 {
		return -f
	}
	return f
}

// sampleReport is a run where "after" meets every target on xfs and
// "before" shows issue 22's figures.
func sampleReport() *Report {
	r := NewReport(DefaultConfig, []Variant{
		{Name: "before", Args: []string{"--direct-io=false"}, Loops: map[string]Loop{"xfs": {Device: "/dev/loop3", LogicalBlock: 512}}},
		{Name: "after", Args: []string{"--direct-io=true"}, Loops: map[string]Loop{"xfs": {Device: "/dev/loop4", DirectIO: true, LogicalBlock: 4096}}},
	}, []string{"xfs"})
	r.Date, r.Commit, r.Kernel, r.CPU, r.CPUs, r.LoadStart, r.LoadEnd = time.Date(2026, 12, 2, 6, 0, 0, 0, time.UTC), "abc123", "6.18", "EPYC", 2, "1.0, 1.0, 1.0", "2.0, 2.0, 2.0"
	r.PoolFS, r.PoolDevice, r.PoolSize, r.VolumeSize = "xfs", "/dev/loop2", 8<<30, VolumeSize(DefaultConfig)
	r.Pool = map[string]Result{
		"randread": {IOPS: 10000}, "read": {IOPS: 500, BWBytes: 500 << 20}, "randwrite": {IOPS: 8000}, "write": {IOPS: 400, BWBytes: 400 << 20},
		"fdatasync": {SyncP99Ns: 2e6, Syncs: 9000},
	}
	before := map[string]Result{
		"randread": {IOPS: 4700}, "read": {IOPS: 450, BWBytes: 450 << 20}, "randwrite": {IOPS: 26000}, "write": {IOPS: 108, BWBytes: 108 << 20},
		"fdatasync": {SyncP99Ns: 2.5e6, Syncs: 9000}, "residency": {Resident: 1022 << 20, Written: 1 << 30},
	}
	for k, v := range before {
		r.Volumes[VolKey("xfs", "before", k)] = v
	}
	after := map[string]Result{
		"randread": {IOPS: 9500}, "read": {IOPS: 490, BWBytes: 490 << 20}, "randwrite": {IOPS: 7900}, "write": {IOPS: 390, BWBytes: 390 << 20},
		"fdatasync": {SyncP99Ns: 2.1e6, Syncs: 9000}, "residency": {Resident: 0, Written: 1 << 30},
	}
	for k, v := range after {
		r.Volumes[VolKey("xfs", "after", k)] = v
	}
	return r
}

func TestReportCountsAndMarksTheTargets(t *testing.T) {
	r := sampleReport()
	if met, measured, all := r.Met("after"); met != 6 || measured != 6 || all != 6 {
		t.Errorf("after: %d met, %d measured of %d; want 6, 6, 6", met, measured, all)
	}
	// before: random read 0.47×, sequential write 0.27×, fdatasync 1.25×
	// and residency miss; sequential read 0.9× and random write 3.25× meet.
	if met, _, _ := r.Met("before"); met != 2 {
		t.Errorf("before: %d met, want 2", met)
	}
	md := r.Markdown()
	for _, want := range []string{
		"| 4k random read, QD16 | 10000 IOPS | 4700 IOPS | 9500 IOPS | **0.47× not met** | 0.95× met | ≥ 0.9× |",
		"| 1M sequential write, QD16 | 400 MiB/s | 108 MiB/s | 390 MiB/s | **0.27× not met** | 0.97× met | ≥ 0.9× |",
		"| etcd disk check: fdatasync p99 | 2.00 ms (9000 syncs) | 2.50 ms (9000 syncs) | 2.10 ms (9000 syncs) | **1.25× not met** | 1.05× met | ≤ 1.1× |",
		"| image in the host page cache after a buffered write | n/a | 1022 MiB of 1024 MiB | 0 MiB of 1024 MiB | **99.8% not met** | 0.0% met | ≤ 5% |",
		"| after | `--direct-io=true` | xfs: direct I/O, 4096-byte sectors |",
		"| before | `--direct-io=false` | xfs: buffered, 512-byte sectors |",
		"- **after**: 6 of 6 targets met (6 measured).",
		"- **before**: 2 of 6 targets met (6 measured); not met: xfs randread 0.47×, xfs write 0.27×, xfs fdatasync 1.25×, xfs residency 99.8%.",
		"Commit abc123",
		"load average at the start 1.0, 1.0, 1.0",
		"drop_caches",
		"2026-12-02 06:00 UTC",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("the report lacks %q:\n%s", want, md)
		}
	}
	// Rounds show their range beside the median.
	r.Samples[VolKey("xfs", "after", "randread")] = []Result{{IOPS: 9500}, {IOPS: 12000}, {IOPS: 8000}}
	r.Samples[VolKey("xfs", "after", "read")] = []Result{{IOPS: 490, BWBytes: 490 << 20}, {IOPS: 300, BWBytes: 300 << 20}}
	r.Samples["pool/fdatasync"] = []Result{{SyncP99Ns: 2e6, Syncs: 1}, {SyncP99Ns: 900e3, Syncs: 1}, {SyncP99Ns: 3e6, Syncs: 1}}
	md = r.Markdown()
	for _, want := range []string{"| 9500 IOPS (8000–12000) |", "| 490 MiB/s (300–490) |", "| 2.00 ms (9000 syncs) (900 µs–3.00 ms) |"} {
		if !strings.Contains(md, want) {
			t.Errorf("the report lacks %q:\n%s", want, md)
		}
	}
	// A failed job shows as a dash and is listed.
	delete(r.Volumes, VolKey("xfs", "after", "randwrite"))
	r.Errors["xfs/after/randwrite"] = "fio: exit status 1: io_u error"
	md = r.Markdown()
	if met, measured, _ := r.Met("after"); met != 5 || measured != 5 {
		t.Errorf("after with a failed job: %d met, %d measured; want 5, 5", met, measured)
	}
	for _, want := range []string{"| 4k random write, QD16 | 8000 IOPS | 26000 IOPS | — | 3.25× met | — | ≥ 0.9× |", "- xfs/after/randwrite: fio: exit status 1: io_u error"} {
		if !strings.Contains(md, want) {
			t.Errorf("the report lacks %q:\n%s", want, md)
		}
	}
}

func TestWriteKeepsTheOtherLayer(t *testing.T) {
	dir := t.TempDir()
	host := sampleReport()
	if err := Write(dir, host, nil); err != nil {
		t.Fatal(err)
	}
	md, _ := os.ReadFile(filepath.Join(dir, "README.md"))
	if !strings.Contains(string(md), "0.95× met") || !strings.Contains(string(md), "## Pod layer\n\nNot run yet") {
		t.Fatalf("README after the host layer:\n%s", md)
	}
	pods := &PodReport{Node: "node-1", FS: "xfs", Config: DefaultConfig, Results: map[string]Result{
		PodKey("emptyDir", "randread"): {IOPS: 1000}, PodKey("pvc", "randread"): {IOPS: 800},
		PodKey("hostPath", "randread"): {IOPS: 2000}, PodKey("inline", "residency"): {Resident: 0, Written: 1 << 30},
	}}
	// The pod layer alone: the host layer's figures stay in README.md.
	if err := Write(dir, nil, pods); err != nil {
		t.Fatal(err)
	}
	md, _ = os.ReadFile(filepath.Join(dir, "README.md"))
	for _, want := range []string{"0.95× met", "## Pod layer: fio in pods", "| 4k random read, QD16 | **0.80× not met** | — | — | ≥ 0.9× |",
		"| 4k random read, QD16 | **0.40× not met** | — | — | ≥ 0.9× |", "| pvc / emptyDir | ephemeral / emptyDir | inline / emptyDir |"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("README lacks %q:\n%s", want, md)
		}
	}
	h, p, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if h.Volumes[VolKey("xfs", "after", "randread")].IOPS != 9500 || p.Results[PodKey("pvc", "randread")].IOPS != 800 || !h.Variants[1].Loops["xfs"].DirectIO {
		t.Errorf("figures lost on the way through JSON: %+v %+v", h, p)
	}
	f, err := os.Open(filepath.Join(dir, PlotPNG))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != 1000 || b.Dy() < 300 {
		t.Errorf("plot of %v", b)
	}
}
