package datapath

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/podvol/podvol/bench/internal/plot"
)

// The targets of issue 22, on the host layer.
const (
	// MinThroughputRatio: every fio job on a volume at least this share of
	// the same job on the pool's filesystem.
	MinThroughputRatio = 0.9
	// MaxSyncRatio: fdatasync's p99 on a volume at most this multiple of
	// the pool's.
	MaxSyncRatio = 1.1
	// MaxResidency: the image's bytes in the host page cache after a
	// synced buffered write at most this share of what was written.
	MaxResidency = 0.05
)

// Verdict is a volume's figure for a job against the pool's and the target.
type Verdict struct {
	// Ratio is volume/pool (Throughput, Fsync) or resident/written
	// (Residency).
	Ratio float64
	// Measured is false when a figure is missing: the job failed or was not
	// run; Met is then false too.
	Measured bool
	Met      bool
}

// Judge compares a volume's result with the pool's for job j.
func Judge(j Job, pool, vol Result) Verdict {
	v, ok := vol.Value(j.Kind)
	if !ok {
		return Verdict{}
	}
	if j.Kind == Residency {
		return Verdict{Ratio: v, Measured: true, Met: v <= MaxResidency}
	}
	p, ok := pool.Value(j.Kind)
	if !ok || p <= 0 {
		return Verdict{}
	}
	r := v / p
	if j.Kind == Fsync {
		return Verdict{Ratio: r, Measured: true, Met: r <= MaxSyncRatio}
	}
	return Verdict{Ratio: r, Measured: true, Met: r >= MinThroughputRatio}
}

// TargetText is a job's target as the report writes it.
func TargetText(k Kind) string {
	switch k {
	case Throughput:
		return fmt.Sprintf("≥ %.1f×", MinThroughputRatio)
	case Fsync:
		return fmt.Sprintf("≤ %.1f×", MaxSyncRatio)
	}
	return fmt.Sprintf("≤ %.0f%%", MaxResidency*100)
}

// Variant is one way of running the plugin: its arguments and what its loop
// devices turned out to be.
type Variant struct {
	Name string
	Args []string
	// Note says how the arguments were chosen (e.g. the plugin lacks the
	// flag, so "after" runs as "before").
	Note string
	// Loops is the loop device each volume got, by filesystem.
	Loops map[string]Loop
}

// Loop is what sysfs says of a volume's loop device.
type Loop struct {
	Device       string
	DirectIO     bool
	LogicalBlock int
}

// VolKey names a volume's result.
func VolKey(fs, variant, job string) string { return fs + "/" + variant + "/" + job }

// Report is a run of the host layer.
type Report struct {
	Date                 time.Time
	Took                 time.Duration
	Commit, Kernel, CPU  string
	CPUs                 int
	LoadStart, LoadEnd   string
	Fio                  string
	PoolFS, PoolDevice   string // e.g. "xfs", "loop3, direct I/O on, image on ext4"
	PoolSize, VolumeSize int64
	Config               Config
	Variants             []Variant
	Filesystems          []string
	Pool                 map[string]Result // by job key
	Volumes              map[string]Result // by VolKey
	// Samples are every round's figures, by "pool/job" or "fs/variant/job"
	// (the tables show the median round's and the range).
	Samples map[string][]Result `json:",omitempty"`
	// Errors are jobs that failed, by "fs/variant/job" or "pool/job": the
	// run goes on and the report shows them.
	Errors map[string]string
}

// NewReport returns an empty report for these variants and filesystems.
func NewReport(c Config, variants []Variant, filesystems []string) *Report {
	return &Report{Config: c, Variants: variants, Filesystems: filesystems, Pool: map[string]Result{}, Volumes: map[string]Result{}, Samples: map[string][]Result{}, Errors: map[string]string{}}
}

// Verdict is the verdict of variant's volume of filesystem fs on job j.
func (r *Report) Verdict(fs, variant string, j Job) Verdict {
	return Judge(j, r.Pool[j.Key], r.Volumes[VolKey(fs, variant, j.Key)])
}

// Met counts the targets the variant meets, of those measured and in all.
func (r *Report) Met(variant string) (met, measured, all int) {
	for _, fs := range r.Filesystems {
		for _, j := range Jobs {
			v := r.Verdict(fs, variant, j)
			all++
			if v.Measured {
				measured++
			}
			if v.Met {
				met++
			}
		}
	}
	return met, measured, all
}

// Missed lists the variant's measured jobs that miss their target, as
// "fs job ratio".
func (r *Report) Missed(variant string) []string {
	var out []string
	for _, fs := range r.Filesystems {
		for _, j := range Jobs {
			if v := r.Verdict(fs, variant, j); v.Measured && !v.Met {
				out = append(out, fs+" "+j.Key+" "+ratioText(j, v))
			}
		}
	}
	return out
}

// Figure is the cell text for a result of job j.
func Figure(j Job, r Result) string {
	switch j.Kind {
	case Throughput:
		if r.IOPS <= 0 {
			return "—"
		}
		if strings.HasSuffix(j.BS, "M") {
			return fmt.Sprintf("%.0f MiB/s", r.BWBytes/(1<<20))
		}
		return fmt.Sprintf("%.0f IOPS", r.IOPS)
	case Fsync:
		if r.Syncs == 0 {
			return "—"
		}
		return fmt.Sprintf("%s (%d syncs)", usText(r.SyncP99Ns), r.Syncs)
	}
	if r.Written == 0 {
		return "—"
	}
	return fmt.Sprintf("%s of %s", mib(r.Resident), mib(r.Written))
}

// Range is " (lowest–highest)" of a job's rounds, in the figure's own
// unit, when there was more than one.
func Range(j Job, rs []Result) string {
	if len(rs) < 2 || j.Kind == Residency {
		return ""
	}
	lo, hi := rs[0], rs[0]
	for _, x := range rs[1:] {
		v, _ := x.Value(j.Kind)
		if l, _ := lo.Value(j.Kind); v < l {
			lo = x
		}
		if h, _ := hi.Value(j.Kind); v > h {
			hi = x
		}
	}
	short := func(r Result) string {
		switch {
		case j.Kind == Fsync:
			return usText(r.SyncP99Ns)
		case strings.HasSuffix(j.BS, "M"):
			return fmt.Sprintf("%.0f", r.BWBytes/(1<<20))
		}
		return fmt.Sprintf("%.0f", r.IOPS)
	}
	return " (" + short(lo) + "–" + short(hi) + ")"
}

func usText(ns float64) string {
	if ns >= 1e6 {
		return fmt.Sprintf("%.2f ms", ns/1e6)
	}
	return fmt.Sprintf("%.0f µs", ns/1e3)
}

func mib(b int64) string {
	if b >= 1<<20 || b == 0 {
		return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20))
	}
	return fmt.Sprintf("%.0f KiB", float64(b)/(1<<10))
}

func ratioText(j Job, v Verdict) string {
	if j.Kind == Residency {
		return fmt.Sprintf("%.1f%%", v.Ratio*100)
	}
	return fmt.Sprintf("%.2f×", v.Ratio)
}

// VerdictText is the cell text of a verdict for job j.
func VerdictText(j Job, v Verdict) string {
	if !v.Measured {
		return "—"
	}
	val := ratioText(j, v)
	if v.Met {
		return val + " met"
	}
	return "**" + val + " not met**"
}

func (r *Report) variantNames() []string {
	var n []string
	for _, v := range r.Variants {
		n = append(n, v.Name)
	}
	return n
}

// Markdown is the report, as bench/datapath/README.md holds it.
func (r *Report) Markdown() string {
	var w strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&w, format+"\n", a...) }
	c := r.Config
	p("# Data path benchmark: podvol volumes against the pool's own filesystem")
	p("")
	p("`make bench-datapath` (as root; installs fio with apt-get if missing) writes this file and `datapath.png` beside it")
	p("(`bench/datapath/datapath_test.go`; `DATAPATH_FLAGS='-runtime 15s -size 2g'`, see `go test ./bench/datapath -args -h`).")
	p("It answers issue 22: how close to the disk beneath does a podvol volume get, and does the host cache its data twice?")
	p("")
	p("- **The pool**: an XFS filesystem on a %s sparse image attached with `losetup --direct-io=on` (so that the pool's", gib(r.PoolSize))
	p("  own figures are the disk's and not the host page cache's), as a node's pool on its own disk would be.")
	p("- **The volumes**: the real `podvol-plugin` binary (built from this tree, started as its own process, driven over its")
	p("  CSI socket as kubelet would) creates, stages and publishes a %s volume of each kind: %s. One plugin", gib(r.VolumeSize), strings.Join(r.Filesystems, ", "))
	p("  process per variant, each on a pool directory of its own on that same XFS filesystem, all volumes published at once.")
	p("- **The jobs** run on each volume (a file in it; on the raw block volume, the device itself) and on a directory of the")
	p("  pool's filesystem (the physical limit), one target after the other for each job, so that all targets of a job see")
	p("  the same machine load:")
	p("  - first %s is written whole (`--rw=write --bs=1M --direct=1`), so that reads read data, not the holes of a sparse image;", mib(c.Size))
	p("  - 4k random read and write, 1M sequential read and write: `--direct=1 --ioengine=libaio --iodepth=16`, file of %s,", mib(c.Size))
	p("    `--time_based --runtime=%s --ramp_time=%s`;", secs(c.Runtime), secs(c.Ramp))
	if c.Rounds > 1 {
		p("  - every fio job runs %d rounds on every target, each round starting at another target; each figure below is", c.Rounds)
		p("    the median round's (of an even count, the lower middle one), with the lowest and highest rounds in brackets;")
	}
	p("  - etcd's disk check: `--rw=write --ioengine=sync --fdatasync=1 --bs=2300 --size=%s`, capped at `--runtime=%s`; the", c.EtcdSize, secs(c.EtcdRuntime))
	p("    figure is the p99 of fdatasync's latency from fio's JSON (lower is better);")
	p("  - residency: the fio files are removed, then %s is written buffered into the volume (`dd bs=1M conv=fsync`; on the", mib(c.WriteSize))
	p("    block volume into the device), and the image file's pages in the host page cache are counted with mincore(2), as")
	p("    `fincore` does. The volume's own page cache (the filesystem in the volume) is not counted: it is the one copy that")
	p("    belongs there.")
	p("- Before every job, on every target, the host's page cache is written back and dropped (`sync; echo 3 >")
	p("  /proc/sys/vm/drop_caches`): a buffered loop device would otherwise serve reads of the image from the cache that the")
	p("  preparation or the previous job left, which no pod on a busy node can count on.")
	p("")
	p("## Measured here (%s)", r.Date.UTC().Format("2006-01-02 15:04 UTC"))
	p("")
	p("Commit %s; %s, %d CPUs, kernel %s; %s; load average at the start %s, at the end %s (1, 5, 15 min); the run took %s.",
		r.Commit, r.CPU, r.CPUs, r.Kernel, r.Fio, r.LoadStart, r.LoadEnd, r.Took.Round(time.Second))
	p("Pool: %s on %s.", r.PoolFS, r.PoolDevice)
	p("")
	p("| variant | plugin arguments | the volumes' loop devices |")
	p("|---|---|---|")
	for _, v := range r.Variants {
		args := "(none)"
		if len(v.Args) > 0 {
			args = "`" + strings.Join(v.Args, " ") + "`"
		}
		var loops []string
		for _, fs := range r.Filesystems {
			if l, ok := v.Loops[fs]; ok {
				dio := "buffered"
				if l.DirectIO {
					dio = "direct I/O"
				}
				loops = append(loops, fmt.Sprintf("%s: %s, %d-byte sectors", fs, dio, l.LogicalBlock))
			}
		}
		note := ""
		if v.Note != "" {
			note = " (" + v.Note + ")"
		}
		p("| %s | %s%s | %s |", v.Name, args, note, strings.Join(loops, "; "))
	}
	p("")
	for _, v := range r.Variants {
		met, measured, all := r.Met(v.Name)
		line := fmt.Sprintf("- **%s**: %d of %d targets met (%d measured)", v.Name, met, all, measured)
		if missed := r.Missed(v.Name); len(missed) > 0 {
			line += "; not met: " + strings.Join(missed, ", ")
		}
		p("%s.", line)
	}
	p("")
	names := r.variantNames()
	for _, fs := range r.Filesystems {
		title := fs + " volume"
		if fs == "block" {
			title = "raw block volume"
		}
		p("### %s", title)
		p("")
		head := "| job | pool's filesystem |"
		sep := "|---|---|"
		for _, n := range names {
			head += " volume, " + n + " |"
			sep += "---|"
		}
		for _, n := range names {
			head += " " + n + " / pool |"
			sep += "---|"
		}
		p("%s target |", head)
		p("%s---|", sep)
		for _, j := range Jobs {
			poolCell := Figure(j, r.Pool[j.Key]) + Range(j, r.Samples["pool/"+j.Key])
			if j.Kind == Residency {
				poolCell = "n/a"
			}
			row := "| " + j.Name + " | " + poolCell + " |"
			for _, n := range names {
				row += " " + Figure(j, r.Volumes[VolKey(fs, n, j.Key)]) + Range(j, r.Samples[VolKey(fs, n, j.Key)]) + " |"
			}
			for _, n := range names {
				row += " " + VerdictText(j, r.Verdict(fs, n, j)) + " |"
			}
			p("%s %s |", row, TargetText(j.Kind))
		}
		p("")
	}
	failedJobs(p, r.Errors)
	p("![volume / pool, per job and variant](datapath.png)")
	p("")
	p("## How to read it")
	p("")
	p("- The ratio columns are the volume's figure over the pool's filesystem's for the same job: above 1 the volume did")
	p("  more (IOPS, MiB/s), except for fdatasync's p99, where below 1 is better. Residency is the image's cached bytes")
	p("  over the bytes written: the second copy of the data that a buffered loop device leaves in the host's page cache,")
	p("  charged to no pod.")
	p("- Each fio job ran %d time(s) per target. On this shared 2-core machine the 4k jobs move by ±30%% between runs; the", c.Rounds)
	p("  order (each job on every target in turn) keeps the comparison within a job fair, not the absolute figures:")
	p("  `DATAPATH_FLAGS='-rounds 3'` takes the median of three.")
	p("- A buffered loop device (sysfs `dio` 0) does the volume's I/O on its image through the host's page cache,")
	p("  synchronously, one request after the other in its worker: 16 random reads in flight become one at a time (far")
	p("  below the disk), O_DIRECT writes from the pod land in the page cache and return (faster than the disk, until")
	p("  writeback catches up), sequential reads ride the image's readahead, and every block the pod writes is cached")
	p("  twice, the second copy charged to no pod. With direct I/O the loop device submits the volume's requests to the")
	p("  image as asynchronous O_DIRECT I/O: the queue depth reaches the pool's disk and the host caches nothing of the")
	p("  image.")
	return w.String()
}

func gib(b int64) string {
	if b%(1<<30) == 0 {
		return fmt.Sprintf("%d GiB", b>>30)
	}
	return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
}

func sortedKeys(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }

// Plot draws one panel per filesystem: for each job a bar per variant,
// its height the verdict's ratio, the target as a line across the group.
func (r *Report) Plot() *plot.Canvas {
	const W, left, right, panelH, top, gap = 1000, 60, 20, 230, 60, 50
	H := top + len(r.Filesystems)*(panelH+gap) + 30
	cv := plot.NewCanvas(W, H)
	cv.Centered(W/2, 20, "podvol volume / the pool's own filesystem, per job (residency: image cached / written)", plot.Ink)
	cv.Centered(W/2, 38, fmt.Sprintf("%s, %s; line = target (fio jobs >= %.1fx, fdatasync p99 <= %.1fx, residency <= %.0f%%)",
		r.Date.UTC().Format("2006-01-02"), r.Kernel, MinThroughputRatio, MaxSyncRatio, MaxResidency*100), plot.Ink)
	names := r.variantNames()
	for pi, fs := range r.Filesystems {
		y0 := top + pi*(panelH+gap) + 20
		base := y0 + panelH - 40
		// The scale: ratios up to 1.5 at least, or the largest measured.
		hi := 1.5
		for _, j := range Jobs {
			for _, n := range names {
				if v := r.Verdict(fs, n, j); v.Measured {
					hi = math.Max(hi, v.Ratio*1.1)
				}
			}
		}
		hi = math.Min(hi, 5)
		px := func(v float64) int { return int(math.Min(v, hi) / hi * float64(base-y0-14)) }
		cv.Text(left, y0, fs+" volume", plot.Ink)
		for _, g := range []float64{0.5, 1, 1.5, 2, 3, 4, 5} {
			if g > hi {
				break
			}
			y := base - px(g)
			cv.Rect(left, y, W-right, y+1, plot.Grid)
			cv.Right(left-6, y+4, fmt.Sprintf("%.1fx", g), plot.Ink)
		}
		cv.Rect(left, base, W-right, base+1, plot.Ink)
		group := (W - left - right) / len(Jobs)
		bar := min(40, (group-20)/max(1, len(names)))
		for ji, j := range Jobs {
			gx := left + ji*group
			x0 := gx + (group-bar*len(names))/2
			for ni, n := range names {
				v := r.Verdict(fs, n, j)
				x := x0 + ni*bar
				if !v.Measured {
					cv.Centered(x+bar/2, base-4, "-", plot.Ink)
					continue
				}
				h := max(1, px(v.Ratio))
				cv.Rect(x+2, base-h, x+bar-2, base, plot.Series[ni%len(plot.Series)])
				label := fmt.Sprintf("%.2f", v.Ratio)
				if j.Kind == Residency {
					label = fmt.Sprintf("%.0f%%", v.Ratio*100)
				}
				cv.Centered(x+bar/2, base-h-4, label, plot.Ink)
			}
			var target float64
			switch j.Kind {
			case Throughput:
				target = MinThroughputRatio
			case Fsync:
				target = MaxSyncRatio
			default:
				target = MaxResidency
			}
			ty := base - px(target)
			cv.Rect(x0-6, ty, x0+bar*len(names)+6, ty+2, plot.Ink)
			cv.Centered(gx+group/2, base+16, j.Key, plot.Ink)
		}
	}
	lx := left
	for ni, n := range names {
		cv.Rect(lx, H-24, lx+14, H-10, plot.Series[ni%len(plot.Series)])
		cv.Text(lx+20, H-12, n, plot.Ink)
		lx += 40 + len(n)*plot.CharWidth
	}
	return cv
}

// The files a run leaves in the report's directory: the figures of each
// layer as JSON, so that a run of one layer keeps the other's in README.md.
const (
	HostJSON = "host.json"
	PodsJSON = "pods.json"
	PlotPNG  = "datapath.png"
)

// Render is README.md: the host layer's report, then the pod layer's.
func Render(host *Report, pods *PodReport) string {
	var md string
	if host != nil {
		md = host.Markdown()
	} else {
		md = "# Data path benchmark\n\nThe host layer has not been run yet: `make bench-datapath`.\n"
	}
	md += "\n"
	if pods != nil {
		return md + pods.Markdown()
	}
	return md + "## Pod layer\n\nNot run yet: `DATAPATH_FLAGS=-pods make bench-datapath` runs it on the dev cluster (holding its lock).\n"
}

// Write stores the layers' figures that are not nil as JSON in dir and
// writes README.md (and datapath.png) from those now in dir.
func Write(dir string, host *Report, pods *PodReport) error {
	save := func(name string, v any) error {
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, name), append(b, '\n'), 0o644) // #nosec G306 -- committed to the repository
	}
	if host != nil {
		if err := save(HostJSON, host); err != nil {
			return err
		}
	}
	if pods != nil {
		if err := save(PodsJSON, pods); err != nil {
			return err
		}
	}
	host, pods, err := Load(dir)
	if err != nil {
		return err
	}
	if host != nil {
		if err := host.Plot().WritePNG(filepath.Join(dir, PlotPNG)); err != nil {
			return err
		}
	}
	return os.WriteFile(filepath.Join(dir, "README.md"), []byte(Render(host, pods)), 0o644) // #nosec G306 -- committed to the repository
}

// Load reads the layers' figures from dir; a layer never run is nil.
func Load(dir string) (*Report, *PodReport, error) {
	var host *Report
	var pods *PodReport
	for name, v := range map[string]any{HostJSON: &host, PodsJSON: &pods} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		if err := json.Unmarshal(b, v); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	if host != nil && host.Config.Rounds == 0 {
		host.Config.Rounds = 1 // figures stored before -rounds
	}
	return host, pods, nil
}

// failedJobs lists the jobs that failed, whose cells the tables show as —.
func failedJobs(p func(format string, a ...any), errs map[string]string) {
	if len(errs) == 0 {
		return
	}
	p("Jobs that failed (their cells show —):")
	p("")
	for _, k := range sortedKeys(errs) {
		p("- %s: %s", k, errs[k])
	}
	p("")
}
