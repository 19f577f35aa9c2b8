package driver

import (
	"cmp"
	"context"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/podvol/podvol/internal/inline"
	"github.com/podvol/podvol/internal/names"
	"github.com/podvol/podvol/internal/pool"
	"github.com/podvol/podvol/internal/store"
)

// Volume context keys kubelet sets with podInfoOnMount.
const (
	ctxEphemeral    = "csi.storage.k8s.io/ephemeral"
	ctxPodName      = "csi.storage.k8s.io/pod.name"
	ctxPodNamespace = "csi.storage.k8s.io/pod.namespace"
	ctxPodUID       = "csi.storage.k8s.io/pod.uid"
)

// Attributes a pod may give an inline volume (volumes[].csi.volumeAttributes).
const (
	AttrSize   = "size"
	AttrFsType = "fsType"
	AttrPool   = names.ParamPool
)

var inlineAttrs = []string{AttrSize, AttrFsType, AttrPool}

func isInline(req *csi.NodePublishVolumeRequest) bool {
	return req.GetVolumeContext()[ctxEphemeral] == "true"
}

// inlineID resolves the handle kubelet gave an inline volume to its pool
// and the pool's id. Kubelet's handle names no pool: each pool's inline
// manager is asked (a lookup in its store's index).
func (d *Driver) inlineID(handle string) (*Pool, string, bool) {
	for _, n := range d.names {
		pl := d.pools[n]
		if pl.Inline == nil {
			continue
		}
		if id, ok := pl.Inline.VolumeID(handle); ok {
			return pl, id, true
		}
	}
	return nil, "", false
}

func (d *Driver) publishInline(ctx context.Context, req *csi.NodePublishVolumeRequest) error {
	attrs := req.GetVolumeContext()
	allowed := d.cfg.InlinePools
	if allowed == nil {
		allowed = []string{pool.DefaultName}
	}
	if name := cmp.Or(attrs[AttrPool], pool.DefaultName); !slices.Contains(allowed, name) {
		return invalid("inline volumes may not use pool %q on node %s (they may use %s: the plugin's --inline-pools)", name, d.cfg.NodeID, strings.Join(allowed, ", "))
	}
	pl, ok := d.poolNamed(attrs[AttrPool])
	if !ok {
		return d.missingPool(codes.InvalidArgument, attrs[AttrPool])
	}
	if pl.Inline == nil {
		return invalid("this plugin serves no inline ephemeral volumes")
	}
	if other, id, ok := d.inlineID(req.GetVolumeId()); ok && other != pl {
		return status.Errorf(codes.AlreadyExists, "inline volume %s is %s in pool %q, not in pool %q", req.GetVolumeId(), id, other.Pool.Name(), pl.Pool.Name())
	}
	c := req.GetVolumeCapability()
	if c.GetBlock() != nil {
		return invalid("inline ephemeral volumes are filesystems: block access is not supported")
	}
	var unknown []string
	for k := range attrs {
		if !slices.Contains(inlineAttrs, k) && !strings.HasPrefix(k, sidecarPrefix) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		return invalid("unknown volumeAttributes %s: an inline podvol volume takes %s", strings.Join(unknown, ", "), strings.Join(inlineAttrs, ", "))
	}
	size := d.cfg.InlineDefaultSize
	sizeAttr, sized := attrs[AttrSize]
	if sized {
		var err error
		if size, err = parseQuantitySize(sizeAttr); err != nil {
			return err
		}
	}
	fsType, err := fsTypeFor([]*csi.VolumeCapability{c}, map[string]string{names.ParamFsType: attrs[AttrFsType]})
	if err != nil {
		return err
	}
	size, err = sizeFor(&csi.CapacityRange{RequiredBytes: size}, fsType)
	if err != nil {
		if sized {
			return status.Errorf(status.Code(err), "volumeAttributes size=%q: %s", sizeAttr, status.Convert(err).Message())
		}
		return err
	}
	flags := slices.Clone(c.GetMount().GetMountFlags())
	if req.GetReadonly() {
		flags = append(flags, "ro")
	}
	return toStatus(pl.Inline.Publish(ctx, inline.PublishRequest{
		Handle:     req.GetVolumeId(),
		TargetPath: req.GetTargetPath(),
		SizeBytes:  size,
		FsType:     fsType,
		MountFlags: flags,
		ReadOnly:   req.GetReadonly(),
		FsGroup:    c.GetMount().GetVolumeMountGroup(),
		Pod:        store.Inline{PodUID: attrs[ctxPodUID], PodName: attrs[ctxPodName], PodNamespace: attrs[ctxPodNamespace]},
	}))
}
