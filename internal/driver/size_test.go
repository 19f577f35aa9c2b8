package driver

import (
	"math"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/podvol/podvol/internal/size"
)

// TestSizeLimits pins the answers the plugin gives for the sizes of issue 10.
func TestSizeLimits(t *testing.T) {
	const MiB = size.MiB
	cases := []struct {
		req, lim int64
		want     int64
		code     codes.Code
	}{
		{math.MaxInt64, 0, 0, codes.OutOfRange},
		{math.MaxInt64 - MiB + 2, 0, 0, codes.OutOfRange},             // 2^63-MiB+1
		{math.MaxInt64 - MiB + 2, math.MaxInt64, 0, codes.OutOfRange}, // a 4 KiB size would fit the limit, not the maximum
		{size.Max - MiB + 1, 0, size.Max, codes.OK},
		{size.Max, math.MaxInt64, size.Max, codes.OK},
		{0, math.MaxInt64, size.DefaultVolumeSize, codes.OK},
		{100*MiB + 1, math.MaxInt64, 101 * MiB, codes.OK},
	}
	for _, c := range cases {
		got, err := sizeFor(&csi.CapacityRange{RequiredBytes: c.req, LimitBytes: c.lim}, "ext4")
		if status.Code(err) != c.code || got != c.want {
			t.Errorf("sizeFor(%d, %d) = %d, %v; want %d, %s", c.req, c.lim, got, err, c.want, c.code)
		}
	}
	got, err := sizeUpTo(&csi.CapacityRange{RequiredBytes: 2 * size.GiB}, "ext4", size.GiB)
	if status.Code(err) != codes.OutOfRange || !strings.Contains(err.Error(), "1073741824") {
		t.Errorf("2 GiB up to 1 GiB = %d, %v; want OUT_OF_RANGE naming the maximum", got, err)
	}
	for s, want := range map[string]codes.Code{
		"16Ei": codes.OutOfRange, "8Ei": codes.OutOfRange, "20E": codes.OutOfRange, "1e19": codes.OutOfRange,
		"1e4294967296": codes.OutOfRange, "1e-999999999": codes.InvalidArgument, "0": codes.InvalidArgument,
		"-1Gi": codes.InvalidArgument, "lots": codes.InvalidArgument, "1Gi": codes.OK, "0.5": codes.OK,
	} {
		if _, err := parseQuantitySize(s); status.Code(err) != want {
			t.Errorf("parseQuantitySize(%q): %v, want %s", s, err, want)
		}
	}
	if got, err := parseQuantitySize("1.5Ki"); got != 1536 || err != nil {
		t.Errorf("1.5Ki = %d, %v", got, err)
	}
	if got, err := parseQuantitySize("0.5"); got != 1 || err != nil {
		t.Errorf("0.5 = %d, %v; a fraction rounds up to a byte", got, err)
	}
}
