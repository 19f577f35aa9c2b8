package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/podvol/podvol/internal/names"
	"github.com/podvol/podvol/internal/store"
	"github.com/podvol/podvol/test/plugintest"
)

// scaleCounts are the pool sizes BenchmarkScale compares; the first is the
// baseline of the ratios.
var scaleCounts = []int{10, 1000, 10000}

// scaleCalls is how many calls one benchmark iteration makes: with
// -benchtime 5x a single call per iteration would be five sub-millisecond
// samples, too few to say 2× from noise.
const scaleCalls = 40

// scalePage is the max_entries of the ListVolumes page measured.
const scalePage = 10

// rss holds the plugin's resident memory per pool size, for the report.
var rss = map[int]memory{}

type memory struct{ rss, peak int64 }

// BenchmarkScale measures what one node's volume count costs the calls that
// the CO makes regardless of it: GetCapacity (external-provisioner, for
// CSIStorageCapacity), one ListVolumes page, and CreateVolume (its capacity
// admission), with 10, 1,000 and 10,000 volumes in the pool, through the real
// plugin binary's gRPC server; and the plugin's resident memory at each.
// The volumes are written straight into the metadata store before the plugin
// starts (with their sparse images, as CreateVolume leaves them): creating
// 10,000 through CreateVolume would spend the run on fsyncs.
//
// One plugin per pool size runs throughout, and each round of calls goes to
// all of them in turn: on a machine shared with other work, the pool sizes
// then see the same load, and the ratios compare them rather than moments.
func BenchmarkScale(b *testing.B) {
	plugintest.RequireRoot(b)
	plugins := map[int]*plugintest.Plugin{}
	for _, n := range scaleCounts {
		dir := plugintest.TempDir(b)
		start := time.Now()
		populate(b, filepath.Join(dir, "pool"), n)
		plugins[n] = plugintest.Start(b, plugintest.Options{Dir: dir, Capacity: "100Ti"})
		fmt.Printf("populated %d volumes and started the plugin in %v\n", n, time.Since(start).Round(time.Millisecond))
	}
	must := func(b *testing.B, n int, what string, err error) {
		if err != nil {
			b.Fatalf("%s with %d volumes: %v\n%s", what, n, err, plugins[n].Log())
		}
	}

	capReq := &csi.GetCapacityRequest{
		VolumeCapabilities: []*csi.VolumeCapability{cap1},
		AccessibleTopology: &csi.Topology{Segments: map[string]string{names.TopologyKey: "node-1"}},
	}
	b.Run("GetCapacity", perCall(func(b *testing.B, n int) {
		_, err := plugins[n].Controller().GetCapacity(context.Background(), capReq)
		must(b, n, "GetCapacity", err)
	}))

	// Each call continues where the last stopped, so that the pages
	// measured are spread over the whole id range, as a CO walking the
	// list sees them.
	tokens := map[int]string{}
	b.Run("ListVolumes-page", perCall(func(b *testing.B, n int) {
		r, err := plugins[n].Controller().ListVolumes(context.Background(), &csi.ListVolumesRequest{MaxEntries: scalePage, StartingToken: tokens[n]})
		must(b, n, "ListVolumes", err)
		if len(r.GetEntries()) == 0 {
			b.Fatalf("ListVolumes page at %q of %d volumes is empty", tokens[n], n)
		}
		tokens[n] = r.GetNextToken()
	}))

	seq := 0
	made := map[int][]string{}
	b.Run("CreateVolume", perCall(func(b *testing.B, n int) {
		seq++
		r, err := plugins[n].Controller().CreateVolume(context.Background(), &csi.CreateVolumeRequest{
			Name: fmt.Sprintf("scale-%d", seq), CapacityRange: &csi.CapacityRange{RequiredBytes: GiB},
			VolumeCapabilities: []*csi.VolumeCapability{cap1},
		})
		must(b, n, "CreateVolume", err)
		made[n] = append(made[n], r.GetVolume().GetVolumeId())
	}))
	for n, ids := range made {
		for _, id := range ids {
			_, err := plugins[n].Controller().DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: id})
			must(b, n, "DeleteVolume", err)
		}
	}

	for _, n := range scaleCounts {
		// The whole list once, as a CO resyncing would walk it: every
		// page has been through the plugin's heap when memory is read.
		start := time.Now()
		seen, pages := 0, 0
		for token := ""; ; {
			r, err := plugins[n].Controller().ListVolumes(context.Background(), &csi.ListVolumesRequest{MaxEntries: 100, StartingToken: token})
			must(b, n, "ListVolumes", err)
			seen += len(r.GetEntries())
			pages++
			if token = r.GetNextToken(); token == "" {
				break
			}
		}
		took := time.Since(start)
		if seen != n {
			b.Fatalf("listing all volumes in pages of 100 found %d, want %d", seen, n)
		}
		results[fmt.Sprintf("BenchmarkScale/ListVolumes-all/volumes=%d", n)] = float64(took.Nanoseconds())
		fmt.Printf("listed all %d volumes in %d pages of 100 in %v\n", n, pages, took.Round(time.Microsecond))

		m, err := readMemory(plugins[n].PID())
		must(b, n, "read the plugin's memory", err)
		rss[n] = m
		fmt.Printf("plugin memory with %d volumes: RSS %.1f MiB, peak %.1f MiB\n", n, float64(m.rss)/float64(MiB), float64(m.peak)/float64(MiB))
	}
}

// perCall runs call scaleCalls times per iteration against each pool size in
// turn, after as many unmeasured calls to warm the connections and the
// plugins up, and records each pool size's median call: a garbage collection
// or a scheduling hiccup moves the mean of so few calls by more than the
// effect measured.
func perCall(call func(b *testing.B, n int)) func(b *testing.B) {
	return func(b *testing.B) {
		for _, n := range scaleCounts {
			for range scaleCalls {
				call(b, n)
			}
		}
		took := map[int][]time.Duration{}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			for _, n := range scaleCounts {
				for range scaleCalls {
					start := time.Now()
					call(b, n)
					took[n] = append(took[n], time.Since(start))
				}
			}
		}
		b.StopTimer()
		for _, n := range scaleCounts {
			slices.Sort(took[n])
			median := took[n][len(took[n])/2]
			b.ReportMetric(float64(median.Nanoseconds()), fmt.Sprintf("ns/call@%d", n))
			results[fmt.Sprintf("%s/volumes=%d", b.Name(), n)] = float64(median.Nanoseconds())
		}
	}
}

// populate writes n ready volumes of 1 GiB into the metadata store of the
// pool at dir, with their sparse images, as CreateVolume would have left
// them, before any plugin opens the pool.
func populate(b *testing.B, dir string, n int) {
	for _, d := range []string{"volumes", "snapshots"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			b.Fatal(err)
		}
	}
	s, err := store.Open(filepath.Join(dir, "podvol.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
	}()
	now := time.Now().UTC()
	for i := range n {
		id := make([]byte, 12)
		_, _ = rand.Read(id) // never fails
		v := &store.Volume{
			ID: "pv-" + hex.EncodeToString(id), Name: fmt.Sprintf("pvc-%08d-0000-4000-8000-000000000000", i),
			SizeBytes: GiB, FsType: "ext4", Parameters: map[string]string{names.ParamFsType: "ext4"},
			State: store.Ready, Created: now,
		}
		if err := s.Create(v); err != nil {
			b.Fatal(err)
		}
		f, err := os.OpenFile(filepath.Join(dir, "volumes", v.ID+".img"), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			b.Fatal(err)
		}
		err = f.Truncate(v.SizeBytes)
		f.Close()
		if err != nil {
			b.Fatal(err)
		}
	}
}

// readMemory reads a process's resident set and its peak from /proc.
func readMemory(pid int) (memory, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return memory{}, err
	}
	var m memory
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || f[2] != "kB" {
			continue
		}
		kb, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			return memory{}, fmt.Errorf("/proc/%d/status: %q: %w", pid, line, err)
		}
		switch f[0] {
		case "VmRSS:":
			m.rss = kb << 10
		case "VmHWM:":
			m.peak = kb << 10
		}
	}
	if m.rss == 0 {
		return memory{}, fmt.Errorf("/proc/%d/status has no VmRSS", pid)
	}
	return m, nil
}

// scaleReport prints each call's cost at each pool size against its cost at
// the smallest, and the plugin's memory.
func scaleReport() {
	if len(rss) == 0 {
		return
	}
	base := scaleCounts[0]
	fmt.Printf("\n| scale: call | volumes | time | × its time with %d volumes |\n|---|---|---|---|\n", base)
	for _, call := range []struct{ name, label string }{
		{"GetCapacity", "GetCapacity (median call)"},
		{"ListVolumes-page", fmt.Sprintf("ListVolumes, one page of %d (median call)", scalePage)},
		{"CreateVolume", "CreateVolume 1 GiB (median call)"},
		{"ListVolumes-all", "ListVolumes, every page of 100 (whole walk)"},
	} {
		for _, n := range scaleCounts {
			a, b0 := results[fmt.Sprintf("BenchmarkScale/%s/volumes=%d", call.name, n)], results[fmt.Sprintf("BenchmarkScale/%s/volumes=%d", call.name, base)]
			if a > 0 && b0 > 0 {
				fmt.Printf("| %s | %d | %s | %.2f× |\n", call.label, n, fmtDur(a), a/b0)
			}
		}
	}
	fmt.Println("\n| scale: plugin memory | volumes | RSS | peak RSS |\n|---|---|---|---|")
	for _, n := range scaleCounts {
		if m, ok := rss[n]; ok {
			fmt.Printf("| podvol-plugin | %d | %.1f MiB | %.1f MiB |\n", n, float64(m.rss)/float64(MiB), float64(m.peak)/float64(MiB))
		}
	}
}
