// Package bench measures what podvol promises about speed: snapshots and
// clones on a reflink pool cost the same whatever the volume's size and data,
// and creating, staging and publishing a volume costs the same whatever its
// size; and the calls a CO makes whatever the number of volumes (capacity,
// a page of the volume list, a creation) cost the same with 10,000 volumes
// on the node as with 10 (scale_test.go). It runs the real plugin binary over
// its socket, with real loop devices and mounts. `make bench` runs it and
// prints the ratios.
package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/podvol/podvol/test/plugintest"
)

const (
	MiB = int64(1) << 20
	GiB = int64(1) << 30
)

var cap1 = &csi.VolumeCapability{
	AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}

type rig struct {
	b   *testing.B
	dir string
	p   *plugintest.Plugin
	seq int
}

func newRig(b *testing.B, pool string) *rig {
	plugintest.RequireRoot(b)
	dir := plugintest.TempDir(b)
	o := plugintest.Options{Dir: dir, Capacity: "400Gi"}
	if pool == "xfs" {
		o.PoolDir = plugintest.XFSPool(b, dir, 64*GiB)
	}
	r := &rig{b: b, dir: dir, p: plugintest.Start(b, o)}
	for _, d := range []string{"staging", "pods"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o750); err != nil {
			b.Fatal(err)
		}
	}
	return r
}

func (r *rig) must(what string, err error) {
	if err != nil {
		r.b.Fatalf("%s: %v\n%s", what, err, r.p.Log())
	}
}

func (r *rig) name(prefix string) string {
	r.seq++
	return fmt.Sprintf("%s-%d", prefix, r.seq)
}

func (r *rig) create(size int64, src *csi.VolumeContentSource) string {
	v, err := r.p.Controller().CreateVolume(context.Background(), &csi.CreateVolumeRequest{
		Name: r.name("vol"), CapacityRange: &csi.CapacityRange{RequiredBytes: size},
		VolumeCapabilities: []*csi.VolumeCapability{cap1}, VolumeContentSource: src,
	})
	r.must("CreateVolume", err)
	return v.GetVolume().GetVolumeId()
}

func (r *rig) up(id string) string {
	staging, target := filepath.Join(r.dir, "staging", id), filepath.Join(r.dir, "pods", id)
	_, err := r.p.Node().NodeStageVolume(context.Background(), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: cap1})
	r.must("NodeStageVolume", err)
	_, err = r.p.Node().NodePublishVolume(context.Background(), &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: cap1})
	r.must("NodePublishVolume", err)
	return target
}

func (r *rig) down(id string) {
	staging, target := filepath.Join(r.dir, "staging", id), filepath.Join(r.dir, "pods", id)
	if _, err := os.Stat(target); err == nil {
		_, err := r.p.Node().NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
		r.must("NodeUnpublishVolume", err)
		_, err = r.p.Node().NodeUnstageVolume(context.Background(), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
		r.must("NodeUnstageVolume", err)
	}
	_, err := r.p.Controller().DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: id})
	r.must("DeleteVolume", err)
}

// source makes a published volume of size bytes whose filesystem is fill
// (0..1) full of written data.
func (r *rig) source(size int64, fill float64) string {
	id := r.create(size, nil)
	target := r.up(id)
	if fill > 0 {
		f, err := os.Create(filepath.Join(target, "data"))
		r.must("create data", err)
		buf := make([]byte, 4*MiB)
		for i := range buf {
			buf[i] = byte(i*7 + i>>12)
		}
		for n := int64(0); n < int64(float64(size)*fill); n += int64(len(buf)) {
			copy(buf, fmt.Sprintf("%016d", n)) // no two blocks alike
			_, err := f.Write(buf)
			r.must("write data", err)
		}
		r.must("sync", f.Sync())
		f.Close()
	}
	return id
}

// results keeps the last ns/op of each case for the ratio report.
var results = map[string]float64{}

func record(b *testing.B, name string) {
	results[name] = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
}

func snapshotCase(r *rig, id string) func(b *testing.B) {
	return func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			s, err := r.p.Controller().CreateSnapshot(context.Background(), &csi.CreateSnapshotRequest{Name: r.name("snap"), SourceVolumeId: id})
			r.must("CreateSnapshot", err)
			b.StopTimer()
			_, err = r.p.Controller().DeleteSnapshot(context.Background(), &csi.DeleteSnapshotRequest{SnapshotId: s.GetSnapshot().GetSnapshotId()})
			r.must("DeleteSnapshot", err)
			b.StartTimer()
		}
		record(b, b.Name())
	}
}

func cloneCase(r *rig, id string, size int64) func(b *testing.B) {
	return func(b *testing.B) {
		src := &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: id}}}
		for i := 0; i < b.N; i++ {
			c := r.create(size, src)
			b.StopTimer()
			r.down(c)
			b.StartTimer()
		}
		record(b, b.Name())
	}
}

// BenchmarkReflinkPool: snapshot and clone of 1 and 10 GiB volumes, empty and
// 80% full, on an XFS pool; and create+stage+publish of 1 vs 100 GiB.
func BenchmarkReflinkPool(b *testing.B) {
	r := newRig(b, "xfs")
	for _, size := range []int64{1 * GiB, 10 * GiB} {
		for _, fill := range []float64{0, 0.8} {
			label := fmt.Sprintf("%dGiB/%s", size/GiB, map[bool]string{true: "empty", false: "80pct"}[fill == 0])
			start := time.Now()
			id := r.source(size, fill)
			fmt.Printf("prepared %s source in %v\n", label, time.Since(start).Round(time.Millisecond))
			b.Run("snapshot/"+label, snapshotCase(r, id))
			b.Run("clone/"+label, cloneCase(r, id, size))
			r.down(id)
		}
	}
	for _, size := range []int64{1 * GiB, 100 * GiB} {
		b.Run(fmt.Sprintf("create-stage-publish/%dGiB", size/GiB), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				id := r.create(size, nil)
				r.up(id)
				b.StopTimer()
				r.down(id)
				b.StartTimer()
			}
			record(b, b.Name())
		})
	}
}

// BenchmarkCopyPool is the contrast: the same snapshot on a pool without
// reflink (the ext4 root here) copies the data.
func BenchmarkCopyPool(b *testing.B) {
	r := newRig(b, "")
	for _, fill := range []float64{0, 0.8} {
		id := r.source(1*GiB, fill)
		b.Run(fmt.Sprintf("snapshot/1GiB/%s", map[bool]string{true: "empty", false: "80pct"}[fill == 0]), snapshotCase(r, id))
		r.down(id)
	}
}

func TestMain(m *testing.M) {
	code := m.Run()
	if len(results) > 0 {
		report()
	}
	os.Exit(code)
}

func report() {
	get := func(name string) float64 { return results[name] }
	ratio := func(what, a, b string) {
		if get(a) > 0 && get(b) > 0 {
			fmt.Printf("| %s | %s | %s | %.2f× |\n", what, fmtDur(get(a)), fmtDur(get(b)), get(a)/get(b))
		}
	}
	fmt.Println("\n## podvol benchmark report")
	fmt.Println("\n| case | time/op |\n|---|---|")
	names := make([]string, 0, len(results))
	for n := range results {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Printf("| %s | %s |\n", n, fmtDur(results[n]))
	}
	fmt.Println("\n| ratio | a | b | a/b (≈1 means constant time) |\n|---|---|---|---|")
	p := "BenchmarkReflinkPool/"
	for _, op := range []string{"snapshot", "clone"} {
		ratio(op+": 10 GiB / 1 GiB, empty", p+op+"/10GiB/empty", p+op+"/1GiB/empty")
		ratio(op+": 10 GiB / 1 GiB, 80% full", p+op+"/10GiB/80pct", p+op+"/1GiB/80pct")
		ratio(op+": 80% full / empty, 10 GiB", p+op+"/10GiB/80pct", p+op+"/10GiB/empty")
	}
	ratio("create+stage+publish: 100 GiB / 1 GiB", p+"create-stage-publish/100GiB", p+"create-stage-publish/1GiB")
	ratio("snapshot 1 GiB 80% full: copy pool / reflink pool", "BenchmarkCopyPool/snapshot/1GiB/80pct", p+"snapshot/1GiB/80pct")
	ratio("copy pool: 80% full / empty, 1 GiB", "BenchmarkCopyPool/snapshot/1GiB/80pct", "BenchmarkCopyPool/snapshot/1GiB/empty")
	scaleReport()
	fmt.Println(strings.Repeat("-", 40))
}

func fmtDur(ns float64) string { return time.Duration(ns).Round(10 * time.Microsecond).String() }
