package main

import (
	"math"
	"strings"
	"testing"
	"time"
)

// The rates are of the data extents, the ratio the median of the rounds'
// (not the ratio of the medians), and the report states the verdict it
// computes.
func TestReport(t *testing.T) {
	res := &Result{Size: "4Gi", DataBytes: 1 << 30, Source: "node-1", Target: "node-2", Rounds: []Round{
		{DataBytes: 1 << 30, Copy: 4 * time.Second, Transfer: 5 * time.Second},  // 256 / 204.8: 0.8
		{DataBytes: 1 << 30, Copy: 2 * time.Second, Transfer: 4 * time.Second},  // 512 / 256: 0.5
		{DataBytes: 1 << 30, Copy: 8 * time.Second, Transfer: 10 * time.Second}, // 128 / 102.4: 0.8
	}}
	if got := res.Rounds[1].Ratio(); math.Abs(got-0.5) > 1e-9 {
		t.Fatalf("ratio %v, want 0.5", got)
	}
	cp, tr, ratio := res.Medians()
	if cp != 256 || tr != 204.8 || math.Abs(ratio-0.8) > 1e-9 {
		t.Fatalf("medians %v MiB/s, %v MiB/s, %v×; want 256, 204.8, 0.8", cp, tr, ratio)
	}
	md := Markdown(res)
	for _, want := range []string{"at 0.80× the speed", "which meets the target", "| 2 | 1024 MiB | 2s | 512 | 4s | 256 | 0.50× |"} {
		if !strings.Contains(md, want) {
			t.Errorf("the report does not say %q:\n%s", want, md)
		}
	}
	res.Rounds[0].Transfer = 8 * time.Second
	if md := Markdown(res); !strings.Contains(md, "does not meet the target") {
		t.Errorf("a median ratio of 0.5 is reported as meeting the target:\n%s", md)
	}
	if (Round{DataBytes: 1}).Ratio() != 0 {
		t.Error("a round without times has a ratio")
	}
	if b := Plot(res).Img.Bounds(); b.Dx() == 0 {
		t.Error("empty plot")
	}
}

// A migration's row gives its copies, its downtime and the ratio to the
// emptyDir replica's.
func TestReportMigration(t *testing.T) {
	res := &Result{Source: "node-1", Migrations: []Migration{{Size: "10Gi", DataBytes: 2 << 30, ChangedBytes: 256 << 20, FirstCopyBytes: 2 << 30,
		FirstCopy: 6 * time.Second, FinalCopyBytes: 257 << 20, Migrate: 40 * time.Second, Downtime: 12 * time.Second, EmptyDirRestart: 4 * time.Second, Intact: true}}}
	if r := res.Migrations[0].DowntimeRatio(); math.Abs(r-3) > 1e-9 {
		t.Fatalf("downtime ratio %v, want 3", r)
	}
	if md := Markdown(res); !strings.Contains(md, "| 1 | 10Gi | 2048 MiB | 2048 MiB in 6s | 256 MiB | 257 MiB | 40s | 12s | 4s | 3.0× | true |") {
		t.Errorf("the report's migration row:\n%s", md)
	}
}
