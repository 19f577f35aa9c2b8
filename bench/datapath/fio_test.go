package datapath

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// testdata holds fio 3.33's own JSON for one job of each kind.
func sample(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/fio-3.33-" + name + ".json")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func job(t *testing.T, key string) Job {
	t.Helper()
	j, ok := JobByKey(key)
	if !ok {
		t.Fatalf("no job %s", key)
	}
	return j
}

func TestParseTakesEachJobsOwnSide(t *testing.T) {
	r, err := Parse(job(t, "randread"), sample(t, "randread"))
	if err != nil {
		t.Fatal(err)
	}
	if r.IOPS != 14631.368631 || r.BWBytes != 59930085 || r.MeanLatNs <= 0 {
		t.Errorf("randread: %+v, want the read side's 14631.368631 IOPS and 59930085 B/s", r)
	}
	r, err = Parse(job(t, "write"), sample(t, "write"))
	if err != nil {
		t.Fatal(err)
	}
	if r.IOPS != 893.909627 {
		t.Errorf("write: %+v, want the write side's 893.909627 IOPS", r)
	}
	// fio prints notes before its JSON when it writes to stdout.
	withNote := append([]byte("note: both iodepth >= 1 and synchronous I/O engine are selected\n"), sample(t, "fdatasync")...)
	r, err = Parse(job(t, "fdatasync"), withNote)
	if err != nil {
		t.Fatal(err)
	}
	if r.SyncP99Ns != 17694720 || r.Syncs != 455 {
		t.Errorf("fdatasync: %+v, want p99 17694720 ns over 455 syncs", r)
	}
	if v := Version(sample(t, "write")); v != "fio-3.33" {
		t.Errorf("version %q", v)
	}
}

func TestParseRefusesWhatIsNotAMeasurement(t *testing.T) {
	rr := string(sample(t, "randread"))
	for name, c := range map[string]struct {
		job, out, want string
	}{
		"no JSON":         {"randread", "fio: pid=1, err=5/file:io_u.c", "no JSON"},
		"broken JSON":     {"randread", rr[:len(rr)/2], "fio's JSON"},
		"a failed job":    {"randread", strings.Replace(rr, `"error" : 0`, `"error" : 5`, 1), "error 5"},
		"two jobs":        {"randread", strings.Replace(rr, `"jobs" : [`, `"jobs" : [{"jobname": "x"},`, 1), "2 jobs"},
		"no reads":        {"randread", string(sample(t, "fdatasync")), "did no I/O"},
		"no fdatasync":    {"fdatasync", rr, "no fdatasync latencies"},
		"not an fio job":  {"residency", rr, "not an fio job"},
		"writes as reads": {"read", string(sample(t, "write")), "did no I/O"},
	} {
		_, err := Parse(job(t, c.job), []byte(c.out))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err %v, want one saying %q", name, err, c.want)
		}
	}
}

func TestArgsAreTheIssuesJobs(t *testing.T) {
	c := Config{Size: 1 << 30, Runtime: 15 * time.Second, Ramp: 2 * time.Second, EtcdSize: "22m", EtcdRuntime: 20 * time.Second, WriteSize: 1 << 30}
	for _, j := range Jobs {
		args, err := Args(c, j, "/v/f", "/o.json")
		if j.Kind == Residency {
			if err == nil {
				t.Errorf("residency got fio arguments %q", args)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		var want, never []string
		switch j.Kind {
		case Throughput:
			want = []string{"--direct=1", "--ioengine=libaio", "--iodepth=16", "--time_based", "--runtime=15s", "--ramp_time=2s", "--size=1073741824", "--rw=" + j.RW, "--bs=" + j.BS}
			never = []string{"--fdatasync=1"}
		case Fsync:
			want = []string{"--rw=write", "--bs=2300", "--fdatasync=1", "--size=22m", "--runtime=20s", "--ioengine=sync"}
			never = []string{"--direct=1", "--time_based"}
		}
		want = append(want, "--filename=/v/f", "--output-format=json", "--output=/o.json")
		for _, w := range want {
			if !slices.Contains(args, w) {
				t.Errorf("%s: no %s in %q", j.Key, w, args)
			}
		}
		for _, n := range never {
			if slices.Contains(args, n) {
				t.Errorf("%s: %s in %q", j.Key, n, args)
			}
		}
	}
	prep := PrepArgs(c, "/v/f", "/o.json")
	for _, w := range []string{"--rw=write", "--direct=1", "--size=1073741824"} {
		if !slices.Contains(prep, w) {
			t.Errorf("prep: no %s in %q", w, prep)
		}
	}
	if slices.Contains(prep, "--time_based") {
		t.Errorf("prep must write the file whole, once: %q", prep)
	}
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig.Validate(); err != nil {
		t.Fatalf("the default: %v", err)
	}
	for name, mod := range map[string]func(*Config){
		"size not in MiB":  func(c *Config) { c.Size = 1<<20 + 1 },
		"no write":         func(c *Config) { c.WriteSize = 0 },
		"runtime under 1s": func(c *Config) { c.Runtime = time.Millisecond },
		"negative ramp":    func(c *Config) { c.Ramp = -time.Second },
		"no etcd size":     func(c *Config) { c.EtcdSize = "" },
		"no rounds":        func(c *Config) { c.Rounds = 0 },
	} {
		c := DefaultConfig
		mod(&c)
		if c.Validate() == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestRoundsRotateAndTakeTheMedian(t *testing.T) {
	if got := Order(3, 0); !slices.Equal(got, []int{0, 1, 2}) {
		t.Errorf("round 1: %v", got)
	}
	if got := Order(3, 4); !slices.Equal(got, []int{1, 2, 0}) {
		t.Errorf("round 5: %v", got)
	}
	rs := []Result{{IOPS: 300}, {IOPS: 100}, {IOPS: 200}}
	if got := Median(Throughput, rs); got.IOPS != 200 {
		t.Errorf("median of 300, 100, 200: %v", got.IOPS)
	}
	if rs[0].IOPS != 300 {
		t.Error("Median reordered its argument")
	}
	if got := Median(Throughput, rs[:2]); got.IOPS != 100 {
		t.Errorf("median of two: %v, want the lower", got.IOPS)
	}
	// fdatasync goes by its p99, not by IOPS.
	fs := []Result{{SyncP99Ns: 9, Syncs: 1, IOPS: 1}, {SyncP99Ns: 1, Syncs: 1, IOPS: 3}, {SyncP99Ns: 5, Syncs: 1, IOPS: 2}}
	if got := Median(Fsync, fs); got.SyncP99Ns != 5 {
		t.Errorf("fdatasync median: %+v", got)
	}
}
