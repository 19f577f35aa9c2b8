// Package datapath is `make bench-datapath`: fio on volumes that the real
// podvol-plugin publishes against the same jobs on the pool's own
// filesystem (the physical limit for that pool), and the host page cache
// that a volume's image holds after a buffered write, with the plugin's
// loop devices as they were (buffered) and with direct I/O, in one run.
// The benchmark itself is datapath_test.go (it needs the test harness of
// test/plugintest); this package holds what it and the pod layer share:
// the jobs, fio's JSON, the targets and the report.
package datapath

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"
)

// Kind says what a job measures and so how it is compared with the pool.
type Kind int

const (
	// Throughput jobs compare IOPS (bytes a second, at a fixed block size).
	Throughput Kind = iota
	// Fsync is etcd's disk check: the p99 of fdatasync's latency.
	Fsync
	// Residency is the host page cache an image holds after a buffered,
	// synced write into its volume, as a share of what was written.
	Residency
)

// Job is one measurement. Every target runs the same jobs.
type Job struct {
	Key     string // short, for logs, files and the plot
	Name    string // for the report
	Kind    Kind
	RW      string // fio's --rw
	BS      string // fio's --bs
	IODepth int
}

// Jobs are the measurements in the order they run: the reads first, while
// the data the preparation wrote is all there is on the target.
var Jobs = []Job{
	{Key: "randread", Name: "4k random read, QD16", Kind: Throughput, RW: "randread", BS: "4k", IODepth: 16},
	{Key: "read", Name: "1M sequential read, QD16", Kind: Throughput, RW: "read", BS: "1M", IODepth: 16},
	{Key: "randwrite", Name: "4k random write, QD16", Kind: Throughput, RW: "randwrite", BS: "4k", IODepth: 16},
	{Key: "write", Name: "1M sequential write, QD16", Kind: Throughput, RW: "write", BS: "1M", IODepth: 16},
	{Key: "fdatasync", Name: "etcd disk check: fdatasync p99", Kind: Fsync, RW: "write", BS: "2300", IODepth: 1},
	{Key: "residency", Name: "image in the host page cache after a buffered write", Kind: Residency},
}

// JobByKey returns the job with that key.
func JobByKey(key string) (Job, bool) {
	for _, j := range Jobs {
		if j.Key == key {
			return j, true
		}
	}
	return Job{}, false
}

// Config sizes the jobs.
type Config struct {
	// Size is the file (or, on a block device, the region) the throughput
	// jobs run on; it is written whole before the first job, so that reads
	// read data and not the holes of a sparse image.
	Size int64
	// Runtime and Ramp are each throughput job's measured time and the
	// unmeasured time before it.
	Runtime, Ramp time.Duration
	// EtcdSize is what etcd's check writes (etcd's documentation: 22m);
	// EtcdRuntime caps it, on a slow disk 10,000 fdatasyncs take minutes.
	EtcdSize    string
	EtcdRuntime time.Duration
	// WriteSize is the buffered write whose residency in the host page
	// cache is measured.
	WriteSize int64
	// Rounds is how many times each fio job runs on each target; a
	// report's figure is the median round's.
	Rounds int
}

// DefaultConfig is a full run in about ten minutes on 2 cores.
var DefaultConfig = Config{Size: 1 << 30, Runtime: 10 * time.Second, Ramp: 2 * time.Second, EtcdSize: "22m", EtcdRuntime: 20 * time.Second, WriteSize: 1 << 30, Rounds: 1}

// Validate refuses sizes and times that cannot make a measurement.
func (c Config) Validate() error {
	var errs []error
	if c.Size < 1<<20 || c.Size%(1<<20) != 0 {
		errs = append(errs, fmt.Errorf("the job size %d must be a whole number of MiB, at least 1", c.Size))
	}
	if c.WriteSize < 1<<20 || c.WriteSize%(1<<20) != 0 {
		errs = append(errs, fmt.Errorf("the write size %d must be a whole number of MiB, at least 1", c.WriteSize))
	}
	if c.Runtime < time.Second || c.EtcdRuntime < time.Second {
		errs = append(errs, fmt.Errorf("runtimes (%v, etcd %v) must be at least 1s", c.Runtime, c.EtcdRuntime))
	}
	if c.Ramp < 0 {
		errs = append(errs, fmt.Errorf("the ramp %v must not be negative", c.Ramp))
	}
	if c.Rounds < 1 {
		errs = append(errs, fmt.Errorf("rounds %d: at least 1", c.Rounds))
	}
	if c.EtcdSize == "" {
		errs = append(errs, errors.New("the etcd check needs a size (22m)"))
	}
	return errors.Join(errs...)
}

func secs(d time.Duration) string { return strconv.Itoa(int(d.Round(time.Second)/time.Second)) + "s" }

// PrepArgs writes the whole region the throughput jobs use, once: direct,
// so that it reaches the image (and the pool's disk) and leaves no cache.
// On a file that does not exist yet, a write job with fio's default
// overwrite=0 writes it once, without laying it out first.
func PrepArgs(c Config, filename, output string) []string {
	return []string{"--name=prep", "--filename=" + filename, "--size=" + strconv.FormatInt(c.Size, 10),
		"--rw=write", "--bs=1M", "--direct=1", "--ioengine=libaio", "--iodepth=16",
		"--output-format=json", "--output=" + output}
}

// Args is fio's command line for job j on filename (a file, or a block
// device), with its JSON written to output. The throughput jobs are direct
// I/O through libaio; etcd's check is its documented command (buffered
// writes of 2300 bytes, each followed by fdatasync), capped in time.
func Args(c Config, j Job, filename, output string) ([]string, error) {
	switch j.Kind {
	case Throughput:
		return []string{"--name=" + j.Key, "--filename=" + filename, "--size=" + strconv.FormatInt(c.Size, 10),
			"--rw=" + j.RW, "--bs=" + j.BS, "--iodepth=" + strconv.Itoa(j.IODepth), "--direct=1", "--ioengine=libaio",
			"--time_based", "--runtime=" + secs(c.Runtime), "--ramp_time=" + secs(c.Ramp),
			"--output-format=json", "--output=" + output}, nil
	case Fsync:
		return []string{"--name=" + j.Key, "--filename=" + filename, "--size=" + c.EtcdSize,
			"--rw=" + j.RW, "--bs=" + j.BS, "--ioengine=sync", "--fdatasync=1", "--runtime=" + secs(c.EtcdRuntime),
			"--output-format=json", "--output=" + output}, nil
	}
	return nil, fmt.Errorf("job %s is not an fio job", j.Key)
}

// Order is the order of n targets in round: each round starts one target
// further on.
func Order(n, round int) []int {
	o := make([]int, n)
	for i := range o {
		o[i] = (round + i) % n
	}
	return o
}

// Median is the median round of rs by the figure a job of kind k is
// judged by; of an even count, the lower of the two middle ones.
func Median(k Kind, rs []Result) Result {
	s := slices.Clone(rs)
	slices.SortStableFunc(s, func(a, b Result) int {
		va, _ := a.Value(k)
		vb, _ := b.Value(k)
		return cmp.Compare(va, vb)
	})
	return s[(len(s)-1)/2]
}

// Result is what one job measured on one target.
type Result struct {
	IOPS      float64
	BWBytes   float64 // bytes a second
	MeanLatNs float64 // completion latency, mean
	// SyncP99Ns and Syncs are fdatasync's p99 latency and count (Fsync).
	SyncP99Ns float64
	Syncs     int
	// Resident is the image's bytes in the host page cache after Written
	// bytes were written into the volume (Residency).
	Resident, Written int64
}

// Value is the figure a job is judged by, and false when there is none.
func (r Result) Value(k Kind) (float64, bool) {
	switch k {
	case Throughput:
		return r.IOPS, r.IOPS > 0
	case Fsync:
		return r.SyncP99Ns, r.Syncs > 0
	case Residency:
		if r.Written <= 0 {
			return 0, false
		}
		return float64(r.Resident) / float64(r.Written), true
	}
	return 0, false
}

type fioSide struct {
	IOPS    float64 `json:"iops"`
	BWBytes float64 `json:"bw_bytes"`
	TotalIO int64   `json:"total_ios"`
	Clat    struct {
		Mean float64 `json:"mean"`
	} `json:"clat_ns"`
}

type fioDoc struct {
	Version string `json:"fio version"`
	Jobs    []struct {
		Name  string  `json:"jobname"`
		Error int     `json:"error"`
		Read  fioSide `json:"read"`
		Write fioSide `json:"write"`
		Sync  struct {
			Lat struct {
				N          int                `json:"N"`
				Percentile map[string]float64 `json:"percentile"`
			} `json:"lat_ns"`
		} `json:"sync"`
	} `json:"jobs"`
}

// Parse reads fio's JSON for job j. fio may print notes before the JSON
// (on stdout, when --output is not used): they are skipped.
func Parse(j Job, out []byte) (Result, error) {
	i := 0
	for i < len(out) && out[i] != '{' {
		i++
	}
	if i == len(out) {
		return Result{}, errors.New("no JSON in fio's output")
	}
	var doc fioDoc
	if err := json.Unmarshal(out[i:], &doc); err != nil {
		return Result{}, fmt.Errorf("fio's JSON: %w", err)
	}
	if len(doc.Jobs) != 1 {
		return Result{}, fmt.Errorf("fio reported %d jobs, want 1", len(doc.Jobs))
	}
	fj := doc.Jobs[0]
	if fj.Error != 0 {
		return Result{}, fmt.Errorf("fio job %s ended with error %d", fj.Name, fj.Error)
	}
	side := fj.Read
	if j.RW == "write" || j.RW == "randwrite" {
		side = fj.Write
	}
	r := Result{IOPS: side.IOPS, BWBytes: side.BWBytes, MeanLatNs: side.Clat.Mean}
	switch j.Kind {
	case Throughput:
		if side.TotalIO == 0 || side.IOPS == 0 {
			return Result{}, fmt.Errorf("fio job %s did no I/O", fj.Name)
		}
	case Fsync:
		p99, ok := fj.Sync.Lat.Percentile["99.000000"]
		if !ok || fj.Sync.Lat.N == 0 {
			return Result{}, fmt.Errorf("fio job %s reports no fdatasync latencies (was it run with --fdatasync=1?)", fj.Name)
		}
		r.SyncP99Ns, r.Syncs = p99, fj.Sync.Lat.N
	default:
		return Result{}, fmt.Errorf("job %s is not an fio job", j.Key)
	}
	return r, nil
}

// Version is the fio version a JSON document names.
func Version(out []byte) string {
	var doc fioDoc
	for i := range out {
		if out[i] == '{' {
			_ = json.Unmarshal(out[i:], &doc)
			break
		}
	}
	return doc.Version
}
