package driver

import (
	"fmt"
	"math"
	"math/big"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/podvol/podvol/internal/device"
	"github.com/podvol/podvol/internal/names"
	"github.com/podvol/podvol/internal/pool"
)

const maxPathLength = 4096

// allowedParams are the StorageClass parameters podvol reads.
var allowedParams = []string{names.ParamFsType, names.ParamDirectAssign, names.ParamFsGroupChangePolicy, names.ParamReleaseOnNodeLoss}

// allowedValues restricts parameters whose values are a fixed set.
var allowedValues = map[string][]string{
	names.ParamDirectAssign:        {"never", "always", "auto"},
	names.ParamFsGroupChangePolicy: {"Always", "OnRootMismatch"},
	names.ParamReleaseOnNodeLoss:   {"true", "false"},
}

const sidecarPrefix = "csi.storage.k8s.io/"

func invalid(format string, a ...any) error {
	return status.Errorf(codes.InvalidArgument, format, a...)
}

// checkVolumeID rejects what no valid id can contain. A well-formed id that is
// not ours is left to the lookup (NOT_FOUND).
func checkVolumeID(id string) error {
	if id == "" {
		return invalid("volume id is required")
	}
	if len(id) > 128 || strings.ContainsRune(id, 0) || !utf8.ValidString(id) {
		return invalid("volume id %q is malformed", id)
	}
	return nil
}

// checkPath accepts the absolute, clean paths a CO hands out, and never one
// inside the pool, whatever it claims to be.
func (d *Driver) checkPath(what, p string) error {
	switch {
	case p == "":
		return invalid("%s is required", what)
	case len(p) > maxPathLength || strings.ContainsRune(p, 0):
		return invalid("%s is malformed", what)
	case !filepath.IsAbs(p) || filepath.Clean(p) != p:
		return invalid("%s %q must be an absolute path without . or .. elements", what, p)
	}
	rp := p
	if r, err := filepath.EvalSymlinks(filepath.Dir(p)); err == nil {
		rp = filepath.Join(r, filepath.Base(p))
	}
	if pd := d.cfg.Pool.Dir(); rp == pd || strings.HasPrefix(rp, pd+"/") {
		return invalid("%s %q is inside the pool directory", what, p)
	}
	return nil
}

// accessModes podvol serves: all of them on one node.
var accessModes = []csi.VolumeCapability_AccessMode_Mode{
	csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
	csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY,
	csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
	csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER,
}

// checkCapability returns why podvol cannot serve c, or "".
func checkCapability(c *csi.VolumeCapability) string {
	if c == nil {
		return "volume capability is empty"
	}
	if c.GetAccessMode() == nil || !slices.Contains(accessModes, c.GetAccessMode().GetMode()) {
		return fmt.Sprintf("access mode %s is not supported: podvol volumes are node-local (supported: SINGLE_NODE_WRITER, SINGLE_NODE_READER_ONLY, SINGLE_NODE_SINGLE_WRITER, SINGLE_NODE_MULTI_WRITER)", c.GetAccessMode().GetMode())
	}
	switch t := c.GetAccessType().(type) {
	case *csi.VolumeCapability_Block:
	case *csi.VolumeCapability_Mount:
		if fs := t.Mount.GetFsType(); fs != "" && !device.Filesystems[fs] {
			return fmt.Sprintf("filesystem %q is not supported (supported: ext4, xfs)", fs)
		}
		for _, f := range t.Mount.GetMountFlags() {
			if strings.ContainsAny(f, ",\x00") || f == "" {
				return fmt.Sprintf("mount flag %q is malformed: give one option per flag", f)
			}
		}
	default:
		return "access type must be mount or block"
	}
	return ""
}

func checkCapabilities(cs []*csi.VolumeCapability) error {
	if len(cs) == 0 {
		return invalid("volume capabilities are required")
	}
	for _, c := range cs {
		if why := checkCapability(c); why != "" {
			return invalid("%s", why)
		}
	}
	return nil
}

// fsTypeFor decides the filesystem of a new volume: the capability's, else
// the fsType parameter, else ext4.
func fsTypeFor(caps []*csi.VolumeCapability, params map[string]string) (string, error) {
	fs := ""
	for _, c := range caps {
		if m := c.GetMount(); m != nil && m.GetFsType() != "" {
			if fs != "" && fs != m.GetFsType() {
				return "", invalid("capabilities ask for two filesystems, %s and %s", fs, m.GetFsType())
			}
			fs = m.GetFsType()
		}
	}
	if p := params[names.ParamFsType]; p != "" {
		if !device.Filesystems[p] {
			return "", invalid("parameter fsType=%q is not supported (supported: ext4, xfs)", p)
		}
		if fs != "" && fs != p {
			return "", invalid("parameter fsType=%s contradicts the capability's filesystem %s", p, fs)
		}
		fs = p
	}
	if fs == "" {
		fs = "ext4"
	}
	return fs, nil
}

// volumeParameters keeps the parameters that define a volume and rejects the
// ones podvol does not know.
func volumeParameters(params map[string]string) (map[string]string, error) {
	out := map[string]string{}
	var unknown []string
	for k, v := range params {
		switch {
		case strings.HasPrefix(k, sidecarPrefix):
		case slices.Contains(allowedParams, k):
			if vals, ok := allowedValues[k]; ok && !slices.Contains(vals, v) {
				return nil, invalid("parameter %s=%q: allowed values are %s", k, v, strings.Join(vals, ", "))
			}
			out[k] = v
		default:
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		return nil, invalid("unknown parameters %s (allowed: %s, and any %s* key)", strings.Join(unknown, ", "), strings.Join(allowedParams, ", "), sidecarPrefix)
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// maxVolumeSize is the largest size a volume can have anywhere: the largest
// whole MiB an int64 holds. A request beyond it can never be met by any pool,
// whatever its capacity, and is OUT_OF_RANGE. A size up to it that this pool
// cannot hold is left to the pool's capacity check (RESOURCE_EXHAUSTED with
// the numbers, so that the scheduler can try another node), which refuses it
// before anything is recorded.
const maxVolumeSize = math.MaxInt64 &^ (pool.MiB - 1)

// sizeFor is sizeUpTo with the only bound every pool shares, maxVolumeSize.
func sizeFor(r *csi.CapacityRange, fsType string) (int64, error) {
	return sizeUpTo(r, fsType, maxVolumeSize)
}

// sizeUpTo turns a capacity range into a size: the required bytes (or the
// default) rounded up to a MiB, at least the filesystem's minimum, never
// above the limit nor above maxSize. When the whole MiB would pass the limit,
// the size is rounded to 4 KiB instead. Nothing here can overflow: a size
// that cannot be rounded within int64 or exceeds maxSize is OUT_OF_RANGE, and
// a size it returns is positive, a multiple of 4096, at least the required
// bytes and the filesystem's minimum, and within the limit and maxSize.
func sizeUpTo(r *csi.CapacityRange, fsType string, maxSize int64) (int64, error) {
	req, lim := r.GetRequiredBytes(), r.GetLimitBytes()
	if req < 0 || lim < 0 {
		return 0, status.Errorf(codes.OutOfRange, "capacity range must not be negative (required %d, limit %d)", req, lim)
	}
	if lim > 0 && req > lim {
		return 0, status.Errorf(codes.OutOfRange, "required bytes %d exceed limit bytes %d", req, lim)
	}
	if req > maxSize {
		return 0, status.Errorf(codes.OutOfRange, "required bytes %d exceed the largest volume size, %d bytes", req, maxSize)
	}
	size := req
	if size == 0 {
		size = pool.DefaultVolumeSize
		if lim > 0 && lim < size {
			size = lim
		}
	}
	size = max(size, pool.MinSize(fsType))
	rounded, ok := roundUp(size, pool.MiB)
	if lim > 0 && (!ok || rounded > lim) {
		// A limit that is not a whole MiB still gets a volume if a 4 KiB
		// multiple fits.
		rounded, ok = roundUp(size, 4096)
	}
	switch {
	case !ok:
		return 0, status.Errorf(codes.OutOfRange, "%d bytes cannot be rounded up to a whole MiB within 64 bits: the largest volume size is %d bytes", size, maxSize)
	case lim > 0 && rounded > lim:
		return 0, status.Errorf(codes.OutOfRange, "a %s volume needs at least %d bytes, the limit is %d", fsType, rounded, lim)
	case rounded > maxSize:
		return 0, status.Errorf(codes.OutOfRange, "%d bytes rounded up to %d exceed the largest volume size, %d bytes", size, rounded, maxSize)
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

// parseQuantitySize turns a Kubernetes quantity (an inline volume's size
// attribute) into whole bytes, rounding a fraction up as Quantity.Value does.
// Unparseable, zero and negative quantities are INVALID_ARGUMENT; one that
// does not fit in an int64 is OUT_OF_RANGE. Quantity.Value cannot be used:
// it wraps a decimal quantity beyond int64 (20E, 1e19 read as 0) and the
// parser caps a binary one (16Ei, 8Ei) at 2^63-1.
func parseQuantitySize(s string) (int64, error) {
	shown := strconv.Quote(s)
	if len(s) > 40 {
		shown = fmt.Sprintf("%q… (%d characters)", s[:32], len(s))
	}
	notQuantity := func() error {
		return invalid("volumeAttributes size=%s is not a quantity: write it like 1Gi or 500Mi", shown)
	}
	notPositive := func() error { return invalid("volumeAttributes size=%s must be more than zero", shown) }
	tooLarge := func() error {
		return status.Errorf(codes.OutOfRange, "volumeAttributes size=%s is 2^63-1 bytes or more, larger than any pool (the largest volume podvol can make is %d bytes)", shown, maxVolumeSize)
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

// topologyAllows reports whether a request's accessibility requirements admit
// this node. No requisite topology admits every node.
func (d *Driver) topologyAllows(req *csi.TopologyRequirement) bool {
	if len(req.GetRequisite()) == 0 {
		return true
	}
	for _, t := range req.GetRequisite() {
		if t.GetSegments()[names.TopologyKey] == d.cfg.NodeID {
			return true
		}
	}
	return false
}
