package node

import (
	"context"
	"fmt"

	"k8s.io/klog/v2"

	"github.com/podvol/podvol/internal/device"
	"github.com/podvol/podvol/internal/directvolume"
	"github.com/podvol/podvol/internal/errkind"
	"github.com/podvol/podvol/internal/store"
)

// A handover is how a staged volume reaches its consumer, decided once per
// volume: a host mount (hostMount: the staging mount, or for raw block the
// loop device, bound into the pod on the host) or a microVM's device
// (microVM: the loop device handed to a Kata-like runtime, the filesystem
// mounted only in the guest). Each operation that depends on it is
// implemented per handover, beside the other code of that operation
// (stats.go, expand.go, quiesce.go, health.go; publishing to a microVM is
// direct.go), so that the callers do not branch on how the volume is
// handed over.
type handover interface {
	// publish hands the staged volume over at r.TargetPath.
	publish(ctx context.Context, v *store.Volume, r PublishRequest) error
	// unpublish ends the handover at target, where m is mounted (or nil).
	unpublish(ctx context.Context, v *store.Volume, target string, m *device.MountAt) error
	// alive reports whether the handover at target still exists.
	alive(target string) bool
	// recoverPublishing, at start, settles a publication at target that a
	// crash caught half-way (store.Publishing).
	recoverPublishing(ctx context.Context, v *store.Volume, target string) error
	// mountsStaging reports whether the volume's filesystem is (to be)
	// mounted at its staging path on the host: never for raw block nor
	// while a guest has it.
	mountsStaging() bool
	// beforeHostPublish is called before the volume is bound at target on
	// the host; it returns the volume as recorded afterwards.
	beforeHostPublish(ctx context.Context, v *store.Volume, target string) (*store.Volume, error)
	// stats reports usage as its consumer sees it.
	stats(ctx context.Context, v *store.Volume, path string) (Stats, error)
	// grow makes the filesystem follow a loop device that just grew.
	grow(ctx context.Context, v *store.Volume) error
	// quiesce makes the image consistent for a copy; the returned function
	// ends that.
	quiesce(v *store.Volume) (func(), error)
	// unheld says what the staged volume is when quiesce cannot hold its
	// consumer's writes ("a raw block volume in use"), so that only an
	// atomic copy of it is one instant; "" when quiesce holds them.
	unheld(v *store.Volume) string
	// health adds the conditions of the staged volume's consumer side.
	health(ctx context.Context, v *store.Volume, viaRuntime bool, add addCondition) error
}

// addCondition records one health condition.
type addCondition func(sev Severity, reason, format string, a ...any)

// handoverOf returns how the staged volume v is handed over now: to the
// microVM its direct publication names, or by host mount.
func (n *Node) handoverOf(v *store.Volume) handover {
	if t, ok := directPublication(v); ok {
		return microVM{n: n, target: t}
	}
	return hostMount{n: n, block: v.Stage != nil && v.Stage.Block}
}

// handoverFor returns how a publish request hands the volume over.
func (n *Node) handoverFor(v *store.Volume, r PublishRequest) handover {
	if r.Direct {
		return microVM{n: n, target: r.TargetPath}
	}
	return hostMount{n: n, block: v.Stage != nil && v.Stage.Block}
}

// handoverAt returns how the volume was handed over at target: as its
// publication there records, or by host mount if none does.
func (n *Node) handoverAt(v *store.Volume, target string) handover {
	if p, ok := v.Publications[target]; ok && p.Direct {
		return microVM{n: n, target: target}
	}
	return hostMount{n: n, block: v.Stage != nil && v.Stage.Block}
}

// hostMount hands a volume over on the host: its filesystem mounted at the
// staging path and bound at each target, or for raw block its loop device
// bound at each target.
type hostMount struct {
	n     *Node
	block bool
}

func (h hostMount) mountsStaging() bool { return !h.block }

func (h hostMount) alive(target string) bool {
	m, _ := h.n.dev.MountedAt(target)
	return m != nil
}

// recoverPublishing of a host mount: nothing here; the mount, if it
// exists, completes the publication (Recover, livePublications).
func (hostMount) recoverPublishing(context.Context, *store.Volume, string) error { return nil }

func (h hostMount) beforeHostPublish(ctx context.Context, v *store.Volume, _ string) (*store.Volume, error) {
	return h.n.ensureStaged(ctx, v)
}

// microVM hands a volume over to a microVM runtime: its loop device is
// described in the mount information at target, and the guest mounts it.
type microVM struct {
	n      *Node
	target string
}

func (microVM) mountsStaging() bool { return false }

func (m microVM) alive(target string) bool {
	return m.n.direct != nil && directvolume.Exists(m.n.direct.Root, target)
}

func (m microVM) publish(ctx context.Context, v *store.Volume, r PublishRequest) error {
	return m.n.publishDirect(ctx, v, r)
}

func (m microVM) unpublish(ctx context.Context, v *store.Volume, target string, _ *device.MountAt) error {
	return m.n.undoDirect(ctx, v.ID, target)
}

// recoverPublishing of a microVM's volume: an assignment whose mount
// information was never written is rolled back.
func (m microVM) recoverPublishing(ctx context.Context, v *store.Volume, target string) error {
	if m.n.direct == nil || directvolume.Exists(m.n.direct.Root, target) {
		return nil
	}
	klog.InfoS("Rolling back interrupted direct assignment", "volume", v.ID, "target", target)
	return m.n.undoDirect(ctx, v.ID, target)
}

// beforeHostPublish of a microVM's volume: the host cannot mount what a
// guest has.
func (m microVM) beforeHostPublish(_ context.Context, v *store.Volume, target string) (*store.Volume, error) {
	if target != m.target {
		return nil, fmt.Errorf("volume %s is assigned to a microVM at %s: it cannot be mounted on the host meanwhile: %w", v.ID, m.target, errkind.ErrInUse)
	}
	return v, nil
}
