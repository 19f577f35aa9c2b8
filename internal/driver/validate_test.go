package driver

import (
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/podvol/podvol/internal/names"
	"github.com/podvol/podvol/internal/size"
)

func TestSizeFor(t *testing.T) {
	const MiB = size.MiB
	cases := []struct {
		req, lim int64
		fs       string
		want     int64
		code     codes.Code
	}{
		{0, 0, "ext4", size.DefaultVolumeSize, codes.OK},
		{0, 100 * MiB, "ext4", 100 * MiB, codes.OK},
		{1, 0, "ext4", 16 * MiB, codes.OK},
		{20*MiB + 1, 0, "ext4", 21 * MiB, codes.OK},
		{20*MiB + 1, 20*MiB + 4096, "ext4", 20*MiB + 4096, codes.OK}, // limit not a whole MiB
		{0, 0, "xfs", size.DefaultVolumeSize, codes.OK},
		{10 * MiB, 0, "xfs", 300 * MiB, codes.OK},
		{0, 200 * MiB, "xfs", 0, codes.OutOfRange},
		{5 * MiB, 4 * MiB, "ext4", 0, codes.OutOfRange},
		{-1, 0, "ext4", 0, codes.OutOfRange},
	}
	for _, c := range cases {
		got, err := sizeFor(&csi.CapacityRange{RequiredBytes: c.req, LimitBytes: c.lim}, c.fs)
		if status.Code(err) != c.code || got != c.want {
			t.Errorf("sizeFor(%d, %d, %s) = %d, %v; want %d, %s", c.req, c.lim, c.fs, got, err, c.want, c.code)
		}
		if err == nil && (got < c.req || (c.lim > 0 && got > c.lim)) {
			t.Errorf("sizeFor(%d, %d) = %d is outside the range", c.req, c.lim, got)
		}
	}
}

func TestFsTypeFor(t *testing.T) {
	capFs := func(fs string) []*csi.VolumeCapability {
		return []*csi.VolumeCapability{{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fs}}}}
	}
	cases := []struct {
		caps   []*csi.VolumeCapability
		params map[string]string
		want   string
		ok     bool
	}{
		{capFs(""), nil, "ext4", true},
		{capFs("xfs"), nil, "xfs", true},
		{capFs(""), map[string]string{"fsType": "xfs"}, "xfs", true},
		{capFs("xfs"), map[string]string{"fsType": "xfs"}, "xfs", true},
		{capFs("ext4"), map[string]string{"fsType": "xfs"}, "", false},
		{capFs(""), map[string]string{"fsType": "vfat"}, "", false},
		{append(capFs("ext4"), capFs("xfs")...), nil, "", false},
	}
	for i, c := range cases {
		got, err := fsTypeFor(c.caps, c.params)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("case %d: got %q, %v; want %q ok=%v", i, got, err, c.want, c.ok)
		}
	}
}

func TestVolumeParameters(t *testing.T) {
	got, err := volumeParameters(map[string]string{"fsType": "xfs", "csi.storage.k8s.io/pvc/name": "x"})
	if err != nil || len(got) != 1 || got["fsType"] != "xfs" {
		t.Fatalf("got %v, %v", got, err)
	}
	_, err = volumeParameters(map[string]string{"b": "1", "a": "2"})
	if status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() != "unknown parameters a, b (allowed: fsType, directAssign, fsGroupChangePolicy, releaseOnNodeLoss, pool, migrateOnDrain, and any csi.storage.k8s.io/* key)" {
		t.Fatalf("unknown keys: %v", err)
	}
	_, err = volumeParameters(map[string]string{"directAssign": "sometimes"})
	if status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() != `parameter directAssign="sometimes": allowed values are never, always, auto` {
		t.Fatalf("bad value: %v", err)
	}
}

func TestTopologyAllows(t *testing.T) {
	d := &Driver{cfg: Config{NodeID: "n1"}}
	seg := func(n string) *csi.Topology { return &csi.Topology{Segments: map[string]string{names.TopologyKey: n}} }
	cases := []struct {
		req  *csi.TopologyRequirement
		want bool
	}{
		{nil, true},
		{&csi.TopologyRequirement{Preferred: []*csi.Topology{seg("n2")}}, true},
		{&csi.TopologyRequirement{Requisite: []*csi.Topology{seg("n2"), seg("n1")}}, true},
		{&csi.TopologyRequirement{Requisite: []*csi.Topology{seg("n2")}}, false},
		{&csi.TopologyRequirement{Requisite: []*csi.Topology{{Segments: map[string]string{"zone": "a"}}}}, false},
	}
	for i, c := range cases {
		if got := d.topologyAllows(c.req); got != c.want {
			t.Errorf("case %d: got %v", i, got)
		}
	}
}

func TestCheckCapability(t *testing.T) {
	ok := &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{MountFlags: []string{"noatime"}}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER}}
	if why := checkCapability(ok); why != "" {
		t.Fatal(why)
	}
	smuggled := &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{MountFlags: []string{"ro,exec"}}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	if checkCapability(smuggled) == "" {
		t.Fatal("a flag holding a comma was accepted")
	}
	if checkCapability(&csi.VolumeCapability{AccessMode: ok.AccessMode}) == "" {
		t.Fatal("a capability without access type was accepted")
	}
}
