package plugin_test

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestAbsurdSizes (issue 10, item 5): sizes near or beyond 2^63 bytes, given
// as capacity ranges or as an inline volume's size attribute, are refused
// with the documented code before anything is recorded: no volume, no image,
// no change to the capacity ledger or to an existing volume's size.
func TestAbsurdSizes(t *testing.T) {
	const MiB = int64(1) << 20
	e, k := newInlineEnv(t, "2Gi")

	// An existing, staged volume for the expansion requests.
	keep := e.create("keep", 64*MiB, rwo, nil).GetVolumeId()
	e.must("stage keep", e.stage(keep, rwo))
	keepImage := filepath.Join(e.p.PoolDir, "volumes", keep+".img")

	free := func() int64 {
		r, err := e.p.Controller().GetCapacity(ctx(t), &csi.GetCapacityRequest{})
		e.must("GetCapacity", err)
		return r.GetAvailableCapacity()
	}
	imageSize := func() int64 {
		fi, err := os.Stat(keepImage)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	keepSize := func() int64 {
		r, err := e.p.Controller().ControllerGetVolume(ctx(t), &csi.ControllerGetVolumeRequest{VolumeId: keep})
		e.must("ControllerGetVolume", err)
		return r.GetVolume().GetCapacityBytes()
	}
	wantIDs, wantImages, wantFree := e.volumeIDs(), e.images(), free()
	wantKeep, wantImageSize := keepSize(), imageSize()

	// nothingRecorded reports, without stopping, any trace of a refused
	// request.
	nothingRecorded := func(what string) {
		t.Helper()
		if ids := e.volumeIDs(); !slices.Equal(ids, wantIDs) {
			t.Errorf("after %s: volumes %v, want %v", what, ids, wantIDs)
		}
		if imgs := e.images(); !slices.Equal(imgs, wantImages) {
			t.Errorf("after %s: images %v, want %v", what, imgs, wantImages)
		}
		if f := free(); f != wantFree {
			t.Errorf("after %s: GetCapacity %d bytes free, want %d", what, f, wantFree)
		}
		if s := keepSize(); s != wantKeep {
			t.Errorf("after %s: volume keep is %d bytes, want %d", what, s, wantKeep)
		}
		if s := imageSize(); s != wantImageSize {
			t.Errorf("after %s: image of keep is %d bytes, want %d", what, s, wantImageSize)
		}
	}
	expectRefusal := func(what string, err error, code codes.Code) {
		t.Helper()
		if status.Code(err) != code {
			t.Errorf("%s: got %v, want code %s", what, err, code)
		} else if code == codes.OutOfRange && !strings.ContainsAny(status.Convert(err).Message(), "0123456789") {
			t.Errorf("%s: the refusal does not give the numbers: %v", what, err)
		}
		nothingRecorded(what)
	}

	const maxInt = math.MaxInt64
	creates := []struct {
		what     string
		fs       string
		req, lim int64
		code     codes.Code
	}{
		{"required 2^63-1", "ext4", maxInt, 0, codes.OutOfRange},
		{"required 2^63-MiB+1", "ext4", maxInt - MiB + 2, 0, codes.OutOfRange},
		{"required 2^63-MiB+1, xfs", "xfs", maxInt - MiB + 2, 0, codes.OutOfRange},
		{"required 2^63-MiB+1, limit 2^63-1", "ext4", maxInt - MiB + 2, maxInt, codes.OutOfRange},
		{"required and limit 2^63-1", "ext4", maxInt, maxInt, codes.OutOfRange},
		{"required 2^63-4096, limit 2^63-1", "ext4", maxInt - 4095, maxInt, codes.OutOfRange},
		{"required 2^63-2MiB+1 (a whole MiB short of overflowing)", "ext4", maxInt - 2*MiB + 2, 0, codes.ResourceExhausted},
		{"required 1 EiB", "ext4", 1 << 60, 0, codes.ResourceExhausted},
		{"required -1", "ext4", -1, 0, codes.OutOfRange},
		{"limit -1", "ext4", 0, -1, codes.OutOfRange},
	}
	for i, c := range creates {
		_, err := e.p.Controller().CreateVolume(ctx(t), &csi.CreateVolumeRequest{
			Name:               "absurd-" + string(rune('a'+i)),
			CapacityRange:      &csi.CapacityRange{RequiredBytes: c.req, LimitBytes: c.lim},
			VolumeCapabilities: []*csi.VolumeCapability{mountCap(c.fs, csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)},
		})
		expectRefusal("CreateVolume "+c.what, err, c.code)
	}

	// Inline sizes. The context is short: a decimal exponent far below
	// zero once kept the quantity parser busy for good.
	inline := []struct {
		size string
		code codes.Code
	}{
		{"16Ei", codes.OutOfRange},
		{"8Ei", codes.OutOfRange},
		{"20E", codes.OutOfRange},
		{"1e19", codes.OutOfRange},
		{"1e300", codes.OutOfRange},
		{"9223372036854775807", codes.OutOfRange},
		{"9223372036854775808", codes.OutOfRange},
		{"1e2147483648", codes.OutOfRange},
		{"1e4294967296", codes.OutOfRange},
		{strings.Repeat("9", 100), codes.OutOfRange},
		{"1e-999999999", codes.InvalidArgument},
		{"-1Gi", codes.InvalidArgument},
		{"0", codes.InvalidArgument},
		{"0.0", codes.InvalidArgument},
		{"1Gb", codes.InvalidArgument},
		{"", codes.InvalidArgument},
		{"1" + strings.Repeat("0", 1024), codes.InvalidArgument},
	}
	for i, c := range inline {
		uid := "absurd" + string(rune('a'+i))
		target := k.target(uid, "v")
		if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
			t.Fatal(err)
		}
		c15, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		start := time.Now()
		_, err := e.p.Node().NodePublishVolume(c15, &csi.NodePublishVolumeRequest{
			VolumeId: k.handle(uid, "v"), TargetPath: target, VolumeCapability: rwo,
			VolumeContext: map[string]string{
				"csi.storage.k8s.io/ephemeral": "true", "csi.storage.k8s.io/pod.name": "pod-" + uid,
				"csi.storage.k8s.io/pod.namespace": "default", "csi.storage.k8s.io/pod.uid": uid,
				"size": c.size,
			},
		})
		cancel()
		if err == nil {
			// Do not leave a mount behind a failed expectation.
			_ = k.unpublish(uid, "v")
		}
		shown := c.size
		if len(shown) > 40 {
			shown = shown[:32] + "..."
		}
		expectRefusal("inline size="+shown+" (after "+time.Since(start).Round(time.Millisecond).String()+")", err, c.code)
	}

	// Expansion: the controller answers for any node's volume, the node
	// grows its own; neither takes a size that cannot exist.
	expands := []struct {
		what     string
		req, lim int64
	}{
		{"required 2^63-1", maxInt, 0},
		{"required 2^63-MiB+1", maxInt - MiB + 2, 0},
		{"required 2^63-MiB+1, limit 2^63-1", maxInt - MiB + 2, maxInt},
	}
	for _, c := range expands {
		r, err := e.p.Controller().ControllerExpandVolume(ctx(t), &csi.ControllerExpandVolumeRequest{
			VolumeId: keep, CapacityRange: &csi.CapacityRange{RequiredBytes: c.req, LimitBytes: c.lim}, VolumeCapability: rwo,
		})
		if err == nil {
			t.Logf("ControllerExpandVolume %s answered capacity %d", c.what, r.GetCapacityBytes())
		}
		expectRefusal("ControllerExpandVolume "+c.what, err, codes.OutOfRange)
		nr, err := e.p.Node().NodeExpandVolume(ctx(t), &csi.NodeExpandVolumeRequest{
			VolumeId: keep, VolumePath: e.staging(keep), CapacityRange: &csi.CapacityRange{RequiredBytes: c.req, LimitBytes: c.lim}, VolumeCapability: rwo,
		})
		if err == nil {
			t.Logf("NodeExpandVolume %s answered capacity %d", c.what, nr.GetCapacityBytes())
		}
		expectRefusal("NodeExpandVolume "+c.what, err, codes.OutOfRange)
	}
	// Growth to a size that exists but no pool here can hold is refused
	// by the capacity check, with the numbers, and recorded nowhere.
	_, err := e.p.Node().NodeExpandVolume(ctx(t), &csi.NodeExpandVolumeRequest{
		VolumeId: keep, VolumePath: e.staging(keep), CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 60},
	})
	expectRefusal("NodeExpandVolume 1 EiB", err, codes.ResourceExhausted)

	// Sane requests with a huge limit still get today's sizes.
	r, err := e.p.Controller().CreateVolume(ctx(t), &csi.CreateVolumeRequest{
		Name:               "sane-huge-limit",
		CapacityRange:      &csi.CapacityRange{RequiredBytes: 100*MiB + 1, LimitBytes: maxInt},
		VolumeCapabilities: []*csi.VolumeCapability{rwo},
	})
	e.must("CreateVolume 100 MiB + 1 with limit 2^63-1", err)
	if got := r.GetVolume().GetCapacityBytes(); got != 101*MiB {
		t.Errorf("100 MiB + 1 with limit 2^63-1: %d bytes, want %d", got, 101*MiB)
	}
	e.must("delete sane-huge-limit", e.delete(r.GetVolume().GetVolumeId()))
	ce, err := e.p.Controller().ControllerExpandVolume(ctx(t), &csi.ControllerExpandVolumeRequest{
		VolumeId: keep, CapacityRange: &csi.CapacityRange{RequiredBytes: 96*MiB + 1, LimitBytes: maxInt},
	})
	e.must("ControllerExpandVolume 96 MiB + 1 with limit 2^63-1", err)
	if got := ce.GetCapacityBytes(); got != 97*MiB || !ce.GetNodeExpansionRequired() {
		t.Errorf("ControllerExpandVolume 96 MiB + 1: %d bytes (node expansion %v), want %d", got, ce.GetNodeExpansionRequired(), 97*MiB)
	}
	nothingRecorded("the sane requests")

	e.must("unstage keep", e.unstage(keep))
	e.must("delete keep", e.delete(keep))
	e.assertClean()
}
