package plugin_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/podvol/podvol/test/plugintest"
)

// TestHostileRequests sends ids and paths meant to reach outside the pool and
// the given paths. Each must be refused with the documented code, and the
// machine must show no trace of an action.
func TestHostileRequests(t *testing.T) {
	e := newEnv(t, defaultOpts)
	id := e.create("pvc-real", 64<<20, rwo, nil).GetVolumeId()
	outside := filepath.Join(e.dir, "outside")
	if err := os.WriteFile(outside, []byte("precious"), 0o644); err != nil {
		t.Fatal(err)
	}

	badIDs := map[string]codes.Code{
		"../../../../" + outside:              codes.NotFound,
		outside:                               codes.NotFound,
		"pv-../../outside":                    codes.NotFound,
		"pv-0000\x00":                         codes.InvalidArgument,
		strings.Repeat("a", 300):              codes.InvalidArgument,
		"volumes/" + id:                       codes.NotFound,
		id + "/../" + id:                      codes.NotFound,
		"PV-" + strings.TrimPrefix(id, "pv-"): codes.NotFound,
	}
	for bad, code := range badIDs {
		wantCode(t, "NodeStageVolume id "+bad, e.stage(bad, rwo), code)
		_, err := e.p.Controller().ControllerGetVolume(ctx(t), &csi.ControllerGetVolumeRequest{VolumeId: bad})
		wantCode(t, "ControllerGetVolume id "+bad, err, code)
		// Deleting what does not exist succeeds, and deletes nothing.
		err = e.delete(bad)
		if code == codes.NotFound && err != nil {
			t.Fatalf("DeleteVolume %q: %v", bad, err)
		}
	}

	badPaths := map[string]string{
		"relative":        "relative/path",
		"dot-dot":         e.staging(id) + "/../../outside",
		"trailing slash":  e.staging(id) + "/",
		"NUL":             e.staging(id) + "\x00x",
		"inside the pool": filepath.Join(e.p.PoolDir, "volumes"),
		"the pool itself": e.p.PoolDir,
		"too long":        "/" + strings.Repeat("x/", 3000),
	}
	for what, p := range badPaths {
		_, err := e.p.Node().NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: p, VolumeCapability: rwo})
		wantCode(t, "NodeStageVolume at "+what, err, codes.InvalidArgument)
	}
	// A symlink to the pool cannot smuggle a path in either.
	link := filepath.Join(e.dir, "staging", "link")
	if err := os.Symlink(e.p.PoolDir, link); err != nil {
		t.Fatal(err)
	}
	_, err := e.p.Node().NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: link + "/volumes", VolumeCapability: rwo})
	wantCode(t, "NodeStageVolume through a symlink into the pool", err, codes.InvalidArgument)

	if got := readFile(t, outside); got != "precious" {
		t.Fatalf("file outside the pool changed: %q", got)
	}
	e.assertClean()
	e.must("delete", e.delete(id))
}

// TestSymlinkedImage: an image replaced by a symlink (someone with write
// access to the pool) is never followed.
func TestSymlinkedImage(t *testing.T) {
	e := newEnv(t, defaultOpts)
	id := e.create("pvc-1", 64<<20, rwo, nil).GetVolumeId()
	img := filepath.Join(e.p.PoolDir, "volumes", id+".img")
	victim := filepath.Join(e.dir, "victim")
	if err := os.WriteFile(victim, make([]byte, 64<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(img); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, img); err != nil {
		t.Fatal(err)
	}
	if err := e.stage(id, rwo); err == nil {
		t.Fatal("NodeStageVolume followed a symlinked image")
	}
	b, _ := os.ReadFile(victim)
	for _, c := range b {
		if c != 0 {
			t.Fatal("the symlink's target was written to")
		}
	}
	e.assertClean()
}

func TestPoolDirectoryIsASymlink(t *testing.T) {
	plugintest.RequireRoot(t)
	dir := plugintest.TempDir(t)
	if err := os.MkdirAll(filepath.Join(dir, "pool"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc", filepath.Join(dir, "pool", "volumes")); err != nil {
		t.Fatal(err)
	}
	out, err := plugintest.RunOnce(t, "--endpoint", "unix://"+filepath.Join(dir, "csi.sock"), "--node-id", "n", "--pool-dir", filepath.Join(dir, "pool"))
	if err == nil || !strings.Contains(out, "must be a directory") {
		t.Fatalf("plugin with a symlinked image directory: err=%v, output:\n%s", err, out)
	}
}

func TestCreateVolumeRefusals(t *testing.T) {
	e := newEnv(t, plugintest.Options{Capacity: "1Gi"})
	cases := []struct {
		what string
		req  *csi.CreateVolumeRequest
		code codes.Code
	}{
		{"no name", &csi.CreateVolumeRequest{VolumeCapabilities: []*csi.VolumeCapability{rwo}}, codes.InvalidArgument},
		{"long name", &csi.CreateVolumeRequest{Name: strings.Repeat("n", 600), VolumeCapabilities: []*csi.VolumeCapability{rwo}}, codes.InvalidArgument},
		{"no capability", &csi.CreateVolumeRequest{Name: "a"}, codes.InvalidArgument},
		{"multi-node", &csi.CreateVolumeRequest{Name: "a", VolumeCapabilities: []*csi.VolumeCapability{mountCap("", csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)}}, codes.InvalidArgument},
		{"btrfs", &csi.CreateVolumeRequest{Name: "a", VolumeCapabilities: []*csi.VolumeCapability{mountCap("btrfs", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)}}, codes.InvalidArgument},
		{"unknown parameter", &csi.CreateVolumeRequest{Name: "a", VolumeCapabilities: []*csi.VolumeCapability{rwo}, Parameters: map[string]string{"color": "blue"}}, codes.InvalidArgument},
		{"fsType contradiction", &csi.CreateVolumeRequest{Name: "a", VolumeCapabilities: []*csi.VolumeCapability{mountCap("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)}, Parameters: map[string]string{"fsType": "xfs"}}, codes.InvalidArgument},
		{"limit below xfs minimum", &csi.CreateVolumeRequest{Name: "a", VolumeCapabilities: []*csi.VolumeCapability{rwo}, Parameters: map[string]string{"fsType": "xfs"}, CapacityRange: &csi.CapacityRange{LimitBytes: 100 << 20}}, codes.OutOfRange},
		{"required above limit", &csi.CreateVolumeRequest{Name: "a", VolumeCapabilities: []*csi.VolumeCapability{rwo}, CapacityRange: &csi.CapacityRange{RequiredBytes: 2 << 20, LimitBytes: 1 << 20}}, codes.OutOfRange},
		{"more than the pool", &csi.CreateVolumeRequest{Name: "a", VolumeCapabilities: []*csi.VolumeCapability{rwo}, CapacityRange: &csi.CapacityRange{RequiredBytes: 2 << 30}}, codes.ResourceExhausted},
		{"other node's topology", &csi.CreateVolumeRequest{Name: "a", VolumeCapabilities: []*csi.VolumeCapability{rwo}, AccessibilityRequirements: &csi.TopologyRequirement{
			Requisite: []*csi.Topology{{Segments: map[string]string{"topology.podvol.io/node": "node-2"}}}}}, codes.ResourceExhausted},
		{"missing source volume", &csi.CreateVolumeRequest{Name: "a", VolumeCapabilities: []*csi.VolumeCapability{rwo}, VolumeContentSource: &csi.VolumeContentSource{
			Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: "pv-x"}}}}, codes.NotFound},
		{"empty content source", &csi.CreateVolumeRequest{Name: "a", VolumeCapabilities: []*csi.VolumeCapability{rwo}, VolumeContentSource: &csi.VolumeContentSource{}}, codes.InvalidArgument},
	}
	for _, c := range cases {
		_, err := e.p.Controller().CreateVolume(ctx(t), c.req)
		wantCode(t, c.what, err, c.code)
	}
	if imgs := e.images(); len(imgs) > 0 {
		t.Fatalf("refused requests left images: %v", imgs)
	}
	// Sidecar metadata parameters are accepted and do not define the volume.
	_, err := e.p.Controller().CreateVolume(ctx(t), &csi.CreateVolumeRequest{Name: "meta", VolumeCapabilities: []*csi.VolumeCapability{rwo},
		Parameters: map[string]string{"csi.storage.k8s.io/pvc/name": "data", "fsType": "ext4"}})
	e.must("create with sidecar metadata", err)
}

// TestCapacity: the pool is never oversubscribed, GetCapacity counts every
// volume, and a deletion makes room again.
func TestCapacity(t *testing.T) {
	e := newEnv(t, plugintest.Options{Capacity: "1Gi"})
	free := func() int64 {
		r, err := e.p.Controller().GetCapacity(ctx(t), &csi.GetCapacityRequest{AccessibleTopology: &csi.Topology{Segments: map[string]string{"topology.podvol.io/node": node}}})
		e.must("GetCapacity", err)
		return r.GetAvailableCapacity()
	}
	if f := free(); f != 1<<30 {
		t.Fatalf("empty pool: %d free", f)
	}
	r, err := e.p.Controller().GetCapacity(ctx(t), &csi.GetCapacityRequest{AccessibleTopology: &csi.Topology{Segments: map[string]string{"topology.podvol.io/node": "node-2"}}})
	e.must("GetCapacity other node", err)
	if r.GetAvailableCapacity() != 0 {
		t.Fatalf("another node's segment has %d here", r.GetAvailableCapacity())
	}
	a := e.create("a", 600<<20, rwo, nil)
	if f := free(); f != 1<<30-600<<20 {
		t.Fatalf("after 600 MiB: %d free", f)
	}
	_, err = e.p.Controller().CreateVolume(ctx(t), &csi.CreateVolumeRequest{Name: "b", CapacityRange: &csi.CapacityRange{RequiredBytes: 500 << 20}, VolumeCapabilities: []*csi.VolumeCapability{rwo}})
	wantCode(t, "500 MiB into 424 MiB", err, codes.ResourceExhausted)
	if !strings.Contains(err.Error(), "free") {
		t.Fatalf("the refusal should give the numbers: %v", err)
	}
	// Idempotent: the same request again is the same volume, and costs
	// nothing more; the same name with another size is a conflict.
	if again := e.create("a", 600<<20, rwo, nil); again.GetVolumeId() != a.GetVolumeId() {
		t.Fatalf("repeated CreateVolume made %s, want %s", again.GetVolumeId(), a.GetVolumeId())
	}
	_, err = e.p.Controller().CreateVolume(ctx(t), &csi.CreateVolumeRequest{Name: "a", CapacityRange: &csi.CapacityRange{RequiredBytes: 700 << 20}, VolumeCapabilities: []*csi.VolumeCapability{rwo}})
	wantCode(t, "same name, other size", err, codes.AlreadyExists)
	e.must("delete", e.delete(a.GetVolumeId()))
	e.create("b", 500<<20, rwo, nil)
	if f := free(); f != 1<<30-500<<20 {
		t.Fatalf("after delete and 500 MiB: %d free", f)
	}
}

func TestSingleWriterRefusesSecondTarget(t *testing.T) {
	e := newEnv(t, defaultOpts)
	c := mountCap("", csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER)
	id := e.create("rwop", 64<<20, c, nil).GetVolumeId()
	e.up(id, c)
	_, err := e.p.Node().NodePublishVolume(ctx(t), &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: e.staging(id), TargetPath: filepath.Join(e.dir, "pods", "second"), VolumeCapability: c})
	wantCode(t, "second RWOP publish", err, codes.FailedPrecondition)
	if _, err := os.Stat(filepath.Join(e.dir, "pods", "second")); !os.IsNotExist(err) {
		t.Fatalf("the refused publish created its target: %v", err)
	}
	e.down(id)
	e.assertClean()
}

func TestDeleteInUseVolume(t *testing.T) {
	e := newEnv(t, defaultOpts)
	id := e.create("busy", 64<<20, rwo, nil).GetVolumeId()
	e.up(id, rwo)
	wantCode(t, "delete staged volume", e.delete(id), codes.FailedPrecondition)
	wantCode(t, "unstage published volume", e.unstage(id), codes.FailedPrecondition)
	e.down(id)
	e.assertClean()
}
