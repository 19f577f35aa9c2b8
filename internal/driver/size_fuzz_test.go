package driver

import (
	"math"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/podvol/podvol/internal/pool"
)

var fuzzFsTypes = []string{"", "ext4", "xfs"}

// referenceSize is the README's sizing rule ("Sizes") in arbitrary
// precision, where nothing can overflow: required bytes (or the default, at
// most the limit), at least the filesystem's minimum, rounded up to a whole
// MiB, or to 4 KiB when the MiB would pass the limit; within the limit and
// maxSize, else no size.
func referenceSize(req, lim, maxSize int64, fsType string) (int64, bool) {
	if req < 0 || lim < 0 || (lim > 0 && req > lim) {
		return 0, false
	}
	size := req
	if size == 0 {
		size = pool.DefaultVolumeSize
		if lim > 0 && lim < size {
			size = lim
		}
	}
	size = max(size, pool.MinSize(fsType))
	roundUp := func(m int64) *big.Int {
		n := new(big.Int).Add(big.NewInt(size), big.NewInt(m-1))
		n.Quo(n, big.NewInt(m))
		return n.Mul(n, big.NewInt(m))
	}
	r := roundUp(pool.MiB)
	if lim > 0 && r.Cmp(big.NewInt(lim)) > 0 {
		r = roundUp(4096)
	}
	if (lim > 0 && r.Cmp(big.NewInt(lim)) > 0) || r.Cmp(big.NewInt(maxSize)) > 0 {
		return 0, false
	}
	return r.Int64(), true
}

func FuzzSizeFor(f *testing.F) {
	const (
		MiB = pool.MiB
		top = int64(math.MaxInt64)
	)
	interesting := []int64{0, 1, 4095, 4096, MiB - 1, MiB, MiB + 1, 16 * MiB, 20*MiB + 4096, 300 * MiB, pool.GiB,
		maxVolumeSize - 1, maxVolumeSize, maxVolumeSize + 1, top - 4095, top - 1, top, -1, math.MinInt64}
	maxes := []int64{maxVolumeSize, top, pool.GiB, 200 * pool.GiB, 20*MiB + 4096, 0, -1}
	n := 0
	for _, req := range interesting {
		for _, lim := range []int64{0, req - 1, req + 4095, top} {
			n++
			f.Add(req, lim, maxes[n%len(maxes)], uint8(n%len(fuzzFsTypes)))
		}
	}
	f.Fuzz(func(t *testing.T, req, lim, maxSize int64, fsSel uint8) {
		fs := fuzzFsTypes[int(fsSel)%len(fuzzFsTypes)]
		r := &csi.CapacityRange{RequiredBytes: req, LimitBytes: lim}
		got, err := sizeUpTo(r, fs, maxSize)
		if err != nil {
			if c := status.Code(err); c != codes.InvalidArgument && c != codes.OutOfRange {
				t.Fatalf("sizeUpTo(%d, %d, %q, max %d): code %s (%v)", req, lim, fs, maxSize, c, err)
			}
		} else {
			switch {
			case got <= 0, got%4096 != 0, got < req, lim > 0 && got > lim, got > maxSize, got < pool.MinSize(fs):
				t.Fatalf("sizeUpTo(%d, %d, %q, max %d) = %d: not a positive 4 KiB multiple within [max(required, %d), limit, max]", req, lim, fs, maxSize, got, pool.MinSize(fs))
			}
		}
		// Today's rounding rules, for every input they can be met on.
		want, ok := referenceSize(req, lim, maxSize, fs)
		if ok != (err == nil) || got != want {
			t.Fatalf("sizeUpTo(%d, %d, %q, max %d) = %d, %v; the sizing rules give %d (ok %v)", req, lim, fs, maxSize, got, err, want, ok)
		}
		// sizeFor is sizeUpTo with the largest size there is.
		g2, err2 := sizeFor(r, fs)
		w2, ok2 := referenceSize(req, lim, maxVolumeSize, fs)
		if g2 != w2 || (err2 == nil) != ok2 {
			t.Fatalf("sizeFor(%d, %d, %q) = %d, %v; want %d (ok %v)", req, lim, fs, g2, err2, w2, ok2)
		}
	})
}

func FuzzParseQuantitySize(f *testing.F) {
	for _, s := range []string{
		"1Gi", "500Mi", "64Mi", "1", "1k", "1K", "1Ki", "+1Gi", "1.5Ki", "0.5", "1.", ".5", "1m", "1n", "0.000000001",
		"0", "0.0", "-0", "-1", "-1Gi", "", " ", "1Gb", "1e", "e5", "1E", "1Ei", "1ei", "1e+3", "1E-3", "1.2.3e5",
		"7Ei", "8Ei", "16Ei", "20E", "1e18", "1e19", "1e300", "1e2000", "1e2048", "1e2049", "1e-2048", "1e-2049",
		"9223372036854775807", "9223372036854775808", "9223372036853727232", "9223372036854775806.5",
		"8589934591Gi", "8589934592Gi", "1e2147483647", "1e2147483648", "1e4294967296", "1e-4294967296",
		"1e-999999999", "1E-999999999", "0e5000", "-0e5000", "-1e5000", "1e99999999999999999999",
		strings.Repeat("9", 100), strings.Repeat("9", 1024), strings.Repeat("9", 1025),
		"0." + strings.Repeat("0", 1000) + "1", "1" + strings.Repeat("0", 18) + "e-1", "12345678901234567890.5e-1",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		start := time.Now()
		got, err := parseQuantitySize(s)
		if d := time.Since(start); d > time.Second {
			t.Fatalf("parseQuantitySize(%q) took %s", s, d)
		}
		if err != nil {
			if c := status.Code(err); c != codes.InvalidArgument && c != codes.OutOfRange {
				t.Fatalf("parseQuantitySize(%q): code %s (%v)", s, c, err)
			}
			return
		}
		if got <= 0 || got == math.MaxInt64 {
			t.Fatalf("parseQuantitySize(%q) = %d", s, got)
		}
		// Accepted, so the parser is safe to call here: the value is the
		// quantity rounded up to a whole byte, as Quantity.Value gives
		// within its range.
		q, err := resource.ParseQuantity(s)
		if err != nil || q.Sign() <= 0 {
			t.Fatalf("parseQuantitySize(%q) = %d, but ParseQuantity gives %v, %v", s, got, q.String(), err)
		}
		if v := q.Value(); v != got {
			t.Fatalf("parseQuantitySize(%q) = %d, Quantity.Value %d", s, got, v)
		}
		// And every size it yields goes through sizeFor without harm.
		if size, err := sizeFor(&csi.CapacityRange{RequiredBytes: got}, "ext4"); err == nil && size < got {
			t.Fatalf("size %q: %d bytes became %d", s, got, size)
		}
	})
}

// TestSizeLimits pins the answers the plugin gives for the sizes of issue 10.
func TestSizeLimits(t *testing.T) {
	const MiB = pool.MiB
	cases := []struct {
		req, lim int64
		want     int64
		code     codes.Code
	}{
		{math.MaxInt64, 0, 0, codes.OutOfRange},
		{math.MaxInt64 - MiB + 2, 0, 0, codes.OutOfRange},             // 2^63-MiB+1
		{math.MaxInt64 - MiB + 2, math.MaxInt64, 0, codes.OutOfRange}, // a 4 KiB size would fit the limit, not the maximum
		{maxVolumeSize - MiB + 1, 0, maxVolumeSize, codes.OK},
		{maxVolumeSize, math.MaxInt64, maxVolumeSize, codes.OK},
		{0, math.MaxInt64, pool.DefaultVolumeSize, codes.OK},
		{100*MiB + 1, math.MaxInt64, 101 * MiB, codes.OK},
	}
	for _, c := range cases {
		got, err := sizeFor(&csi.CapacityRange{RequiredBytes: c.req, LimitBytes: c.lim}, "ext4")
		if status.Code(err) != c.code || got != c.want {
			t.Errorf("sizeFor(%d, %d) = %d, %v; want %d, %s", c.req, c.lim, got, err, c.want, c.code)
		}
	}
	got, err := sizeUpTo(&csi.CapacityRange{RequiredBytes: 2 * pool.GiB}, "ext4", pool.GiB)
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
