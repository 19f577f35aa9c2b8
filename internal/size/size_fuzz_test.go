package size

import (
	"errors"
	"math"
	"math/big"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/podvol/podvol/internal/errkind"
)

var fuzzFsTypes = []string{"", "ext4", "xfs"}

// referenceSize is the sizing rule of docs/features.md ("Sizes") in arbitrary
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
		size = DefaultVolumeSize
		if lim > 0 && lim < size {
			size = lim
		}
	}
	size = max(size, MinSize(fsType))
	roundUp := func(m int64) *big.Int {
		n := new(big.Int).Add(big.NewInt(size), big.NewInt(m-1))
		n.Quo(n, big.NewInt(m))
		return n.Mul(n, big.NewInt(m))
	}
	r := roundUp(MiB)
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
		top = int64(math.MaxInt64)
	)
	interesting := []int64{0, 1, 4095, 4096, MiB - 1, MiB, MiB + 1, 16 * MiB, 20*MiB + 4096, 300 * MiB, GiB,
		Max - 1, Max, Max + 1, top - 4095, top - 1, top, -1, math.MinInt64}
	maxes := []int64{Max, top, GiB, 200 * GiB, 20*MiB + 4096, 0, -1}
	n := 0
	for _, req := range interesting {
		for _, lim := range []int64{0, req - 1, req + 4095, top} {
			n++
			f.Add(req, lim, maxes[n%len(maxes)], uint8(n%len(fuzzFsTypes)))
		}
	}
	f.Fuzz(func(t *testing.T, req, lim, maxSize int64, fsSel uint8) {
		fs := fuzzFsTypes[int(fsSel)%len(fuzzFsTypes)]
		got, err := UpTo(req, lim, fs, maxSize)
		if err != nil {
			if !errors.Is(err, errkind.ErrOutOfRange) {
				t.Fatalf("UpTo(%d, %d, %q, max %d): %v, not out of range", req, lim, fs, maxSize, err)
			}
		} else {
			switch {
			case got <= 0, got%4096 != 0, got < req, lim > 0 && got > lim, got > maxSize, got < MinSize(fs):
				t.Fatalf("UpTo(%d, %d, %q, max %d) = %d: not a positive 4 KiB multiple within [max(required, %d), limit, max]", req, lim, fs, maxSize, got, MinSize(fs))
			}
		}
		// Today's rounding rules, for every input they can be met on.
		want, ok := referenceSize(req, lim, maxSize, fs)
		if ok != (err == nil) || got != want {
			t.Fatalf("UpTo(%d, %d, %q, max %d) = %d, %v; the sizing rules give %d (ok %v)", req, lim, fs, maxSize, got, err, want, ok)
		}
		// For is UpTo with the largest size there is.
		g2, err2 := For(req, lim, fs)
		w2, ok2 := referenceSize(req, lim, Max, fs)
		if g2 != w2 || (err2 == nil) != ok2 {
			t.Fatalf("For(%d, %d, %q) = %d, %v; want %d (ok %v)", req, lim, fs, g2, err2, w2, ok2)
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
		got, err := ParseQuantity(s)
		if d := time.Since(start); d > time.Second {
			t.Fatalf("ParseQuantity(%q) took %s", s, d)
		}
		if err != nil {
			if !errors.Is(err, errkind.ErrInvalid) && !errors.Is(err, errkind.ErrOutOfRange) {
				t.Fatalf("ParseQuantity(%q): %v, neither invalid nor out of range", s, err)
			}
			return
		}
		if got <= 0 || got == math.MaxInt64 {
			t.Fatalf("ParseQuantity(%q) = %d", s, got)
		}
		// Accepted, so the parser is safe to call here: the value is the
		// quantity rounded up to a whole byte, as Quantity.Value gives
		// within its range.
		q, err := resource.ParseQuantity(s)
		if err != nil || q.Sign() <= 0 {
			t.Fatalf("ParseQuantity(%q) = %d, but ParseQuantity gives %v, %v", s, got, q.String(), err)
		}
		if v := q.Value(); v != got {
			t.Fatalf("ParseQuantity(%q) = %d, Quantity.Value %d", s, got, v)
		}
		// And every size it yields goes through For without harm.
		if size, err := For(got, 0, "ext4"); err == nil && size < got {
			t.Fatalf("size %q: %d bytes became %d", s, got, size)
		}
	})
}
