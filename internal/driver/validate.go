package driver

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/podvol/podvol/internal/device"
	"github.com/podvol/podvol/internal/names"
	"github.com/podvol/podvol/internal/size"
)

const maxPathLength = 4096

// allowedParams are the StorageClass parameters podvol reads.
var allowedParams = []string{names.ParamFsType, names.ParamDirectAssign, names.ParamFsGroupChangePolicy, names.ParamReleaseOnNodeLoss, names.ParamPool, names.ParamMigrateOnDrain}

// allowedValues restricts parameters whose values are a fixed set.
var allowedValues = map[string][]string{
	names.ParamDirectAssign:        {"never", "always", "auto"},
	names.ParamFsGroupChangePolicy: {"Always", "OnRootMismatch"},
	names.ParamReleaseOnNodeLoss:   {"true", "false"},
	names.ParamMigrateOnDrain:      {"true", "false"},
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
	return d.eachPool(func(pl *Pool) error {
		if pd := pl.Pool.Dir(); rp == pd || strings.HasPrefix(rp, pd+"/") {
			return invalid("%s %q is inside the directory of pool %s", what, p, pl.Pool.Name())
		}
		return nil
	})
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

// sizeFor is sizeUpTo with the only bound every pool shares, size.Max.
func sizeFor(r *csi.CapacityRange, fsType string) (int64, error) {
	return sizeUpTo(r, fsType, size.Max)
}

// sizeUpTo is size.UpTo on a CSI capacity range, its refusal a CSI status.
func sizeUpTo(r *csi.CapacityRange, fsType string, maxSize int64) (int64, error) {
	n, err := size.UpTo(r.GetRequiredBytes(), r.GetLimitBytes(), fsType, maxSize)
	return n, toStatus(err)
}

// parseQuantitySize is size.ParseQuantity, its refusal a CSI status.
func parseQuantitySize(s string) (int64, error) {
	n, err := size.ParseQuantity(s)
	return n, toStatus(err)
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
