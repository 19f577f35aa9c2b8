// Package size turns what a user asks for, a CSI capacity range or a
// Kubernetes quantity in an inline volume's attributes, into a volume's size
// in bytes, by the sizing rules in docs/features.md ("Sizes"). Its errors say which
// rule a request broke (see Error); the driver maps them to CSI codes at the
// gRPC edge.
//
// It is a package of its own, with no I/O, because its inputs come straight
// from users and are fuzzed (make fuzz): a fuzz build instruments every
// package the target links again, and this one links only the error kinds
// (internal/errkind) and the quantity parser, where the driver links
// hundreds of packages: minutes on a cold machine.
package size

import (
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/podvol/podvol/internal/errkind"
)

const (
	MiB = int64(1) << 20
	GiB = int64(1) << 30

	// DefaultVolumeSize is used when a request names no size.
	DefaultVolumeSize = 1 * GiB
)

// MinSize is the smallest volume each filesystem can be made on. mkfs.xfs
// refuses anything under 300 MiB since xfsprogs 5.19.
func MinSize(fsType string) int64 {
	if fsType == "xfs" {
		return 300 * MiB
	}
	return 16 * MiB
}

// Error is a refused request: its message says what and why, Kind is the
// rule it broke, errkind.ErrOutOfRange (a request no pool can meet whatever its
// capacity: a negative range, a limit below what is required, a size beyond
// Max or the caller's bound) or errkind.ErrInvalid (a quantity that is not one,
// or is not positive). The driver maps kinds to codes, as it does the pool's.
type Error struct {
	Kind error
	msg  string
}

func (e *Error) Error() string { return e.msg }

// Unwrap returns Kind.
func (e *Error) Unwrap() error { return e.Kind }

func outOfRange(format string, a ...any) error {
	return &Error{Kind: errkind.ErrOutOfRange, msg: fmt.Sprintf(format, a...)}
}

func invalid(format string, a ...any) error {
	return &Error{Kind: errkind.ErrInvalid, msg: fmt.Sprintf(format, a...)}
}

// Max is the largest size a volume can have anywhere: the largest whole MiB
// an int64 holds. A request beyond it can never be met by any pool, whatever
// its capacity, and is out of range. A size up to it that a pool cannot hold
// is left to the pool's capacity check (RESOURCE_EXHAUSTED with the numbers,
// so that the scheduler can try another node), which refuses it before
// anything is recorded.
const Max = math.MaxInt64 &^ (MiB - 1)

// For is UpTo with the only bound every pool shares, Max.
func For(required, limit int64, fsType string) (int64, error) {
	return UpTo(required, limit, fsType, Max)
}

// UpTo turns a capacity range (0 meaning unset, as in CSI) into a size: the
// required bytes (or the default) rounded up to a MiB, at least the
// filesystem's minimum, never above the limit nor above maxSize. When the
// whole MiB would pass the limit, the size is rounded to 4 KiB instead.
// Nothing here can overflow: a size that cannot be rounded within int64 or
// exceeds maxSize is out of range, and a size it returns is positive, a
// multiple of 4096, at least the required bytes and the filesystem's
// minimum, and within the limit and maxSize.
func UpTo(req, lim int64, fsType string, maxSize int64) (int64, error) {
	if req < 0 || lim < 0 {
		return 0, outOfRange("capacity range must not be negative (required %d, limit %d)", req, lim)
	}
	if lim > 0 && req > lim {
		return 0, outOfRange("required bytes %d exceed limit bytes %d", req, lim)
	}
	if req > maxSize {
		return 0, outOfRange("required bytes %d exceed the largest volume size, %d bytes", req, maxSize)
	}
	size := req
	if size == 0 {
		size = DefaultVolumeSize
		if lim > 0 && lim < size {
			size = lim
		}
	}
	size = max(size, MinSize(fsType))
	rounded, ok := roundUp(size, MiB)
	if lim > 0 && (!ok || rounded > lim) {
		// A limit that is not a whole MiB still gets a volume if a 4 KiB
		// multiple fits.
		rounded, ok = roundUp(size, 4096)
	}
	switch {
	case !ok:
		return 0, outOfRange("%d bytes cannot be rounded up to a whole MiB within 64 bits: the largest volume size is %d bytes", size, maxSize)
	case lim > 0 && rounded > lim:
		return 0, outOfRange("a %s volume needs at least %d bytes, the limit is %d", fsType, rounded, lim)
	case rounded > maxSize:
		return 0, outOfRange("%d bytes rounded up to %d exceed the largest volume size, %d bytes", size, rounded, maxSize)
	}
	return rounded, nil
}

// roundUp rounds n >= 0 up to a multiple of m > 0, or reports that the
// result does not fit in an int64.
func roundUp(n, m int64) (int64, bool) {
	if n > math.MaxInt64-(m-1) {
		return 0, false
	}
	return (n + m - 1) / m * m, true
}

// maxQuantityLength bounds a size attribute. The quantity parser's time grows
// with the digits after the point; no honest size needs more than a few.
const maxQuantityLength = 1024

// maxQuantityExponent bounds a decimal exponent (1e6, 5E-3) before the
// quantity parser sees it: the parser truncates exponents to 32 bits, so
// 1e4294967296 would read as 1, and spends unbounded time on a large
// negative one.
const maxQuantityExponent = 2048

// ParseQuantity turns a Kubernetes quantity (an inline volume's size
// attribute) into whole bytes, rounding a fraction up as Quantity.Value does.
// Unparseable, zero and negative quantities are invalid; one that does not
// fit in an int64 is out of range. Quantity.Value cannot be used: it wraps a
// decimal quantity beyond int64 (20E, 1e19 read as 0) and the parser caps a
// binary one (16Ei, 8Ei) at 2^63-1.
func ParseQuantity(s string) (int64, error) {
	shown := strconv.Quote(s)
	if len(s) > 40 {
		shown = fmt.Sprintf("%q… (%d characters)", s[:32], len(s))
	}
	notQuantity := func() error {
		return invalid("volumeAttributes size=%s is not a quantity: write it like 1Gi or 500Mi", shown)
	}
	notPositive := func() error { return invalid("volumeAttributes size=%s must be more than zero", shown) }
	tooLarge := func() error {
		return outOfRange("volumeAttributes size=%s is 2^63-1 bytes or more, larger than any pool (the largest volume podvol can make is %d bytes)", shown, Max)
	}
	if len(s) > maxQuantityLength {
		return 0, invalid("volumeAttributes size=%s is too long, at most %d characters are allowed: write it like 1Gi or 500Mi", shown, maxQuantityLength)
	}
	// The number: sign, digits, point, digits; then the suffix.
	i := 0
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		i++
	}
	digits := func() {
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
	}
	digits()
	if i < len(s) && s[i] == '.' {
		i++
		digits()
	}
	mantissa, suffix := s[:i], s[i:]
	if len(suffix) > 1 && (suffix[0] == 'e' || suffix[0] == 'E') && suffix != "Ei" {
		if exp, err := strconv.ParseInt(suffix[1:], 10, 64); err == nil && (exp > maxQuantityExponent || exp < -maxQuantityExponent) {
			switch {
			case strings.HasPrefix(mantissa, "-") || strings.Trim(mantissa, "+-.0") == "":
				return 0, notPositive()
			case exp > 0:
				// A non-zero mantissa of at most maxQuantityLength
				// characters is at least 10^-maxQuantityLength.
				return 0, tooLarge()
			}
			return 0, invalid("volumeAttributes size=%s has an exponent below -%d: write it like 1Gi or 500Mi", shown, maxQuantityExponent)
		}
	}
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return 0, notQuantity()
	}
	if q.Sign() <= 0 {
		return 0, notPositive()
	}
	// The parser leaves at most 9 digits after the point, so the estimate
	// is finite unless the value is beyond any int64.
	if f := q.AsApproximateFloat64(); !(f < 0x1p63) {
		return 0, tooLarge()
	}
	d := q.AsDec()
	n := new(big.Int).Set(d.UnscaledBig())
	if sc := int64(d.Scale()); sc > 0 {
		// Round a fraction up.
		p := new(big.Int).Exp(big.NewInt(10), big.NewInt(sc), nil)
		var rem big.Int
		n.QuoRem(n, p, &rem)
		if rem.Sign() > 0 {
			n.Add(n, big.NewInt(1))
		}
	} else if sc < 0 {
		// Below 2^63, so at most 19 digits to add.
		n.Mul(n, new(big.Int).Exp(big.NewInt(10), big.NewInt(-sc), nil))
	}
	if !n.IsInt64() || n.Int64() == math.MaxInt64 {
		// 2^63-1 is also what the parser caps binary quantities at.
		return 0, tooLarge()
	}
	return n.Int64(), nil
}
