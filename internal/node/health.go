package node

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/podvol/podvol/internal/directvolume"
	"github.com/podvol/podvol/internal/errkind"
	"github.com/podvol/podvol/internal/store"
)

// Severity of a health condition, from least to most severe.
type Severity int

const (
	Degraded     Severity = iota + 1 // works, but not as it should
	Inaccessible                     // the pod cannot use it now; the data may be intact
	DataLoss                         // data is gone or damaged
)

// String is the severity's name, as the health metric labels it.
func (s Severity) String() string {
	switch s {
	case Degraded:
		return "Degraded"
	case Inaccessible:
		return "Inaccessible"
	case DataLoss:
		return "DataLoss"
	}
	return fmt.Sprintf("Severity(%d)", int(s))
}

// Condition is one problem with a volume.
type Condition struct {
	Severity Severity
	Reason   string // CamelCase, for machines
	Message  string // for the cluster admin: what is wrong, what to do
}

// Health checks a volume for what can go wrong with an image, its loop
// device, its mounts and its filesystem. No condition means healthy. With
// viaRuntime, a direct-assigned volume is also asked about through the
// runtime that holds it (only the node side does that).
func (n *Node) Health(ctx context.Context, id string, viaRuntime bool) ([]Condition, error) {
	v, err := n.volume(id)
	if err != nil {
		return nil, err
	}
	var cs []Condition
	add := func(sev Severity, reason, format string, a ...any) {
		cs = append(cs, Condition{sev, reason, fmt.Sprintf(format, a...)})
	}
	img := n.pool.ImagePath(v.ID)
	fi, err := os.Lstat(img)
	switch {
	case errors.Is(err, os.ErrNotExist):
		add(DataLoss, "ImageMissing", "the image file %s is gone: the volume's data is lost unless a loop device still holds it open; restore from a snapshot", img)
	case err != nil:
		add(Inaccessible, "ImageUnreadable", "cannot inspect image %s: %v", img, err)
	case !fi.Mode().IsRegular():
		add(Inaccessible, "ImageNotAFile", "%s is a %s, not an image file: someone replaced it; podvol will not use it", img, fi.Mode().Type())
	case fi.Size() < v.SizeBytes:
		add(DataLoss, "ImageTruncated", "image %s is %d bytes, the volume is %d: its end was cut off; check the pool filesystem and restore from a snapshot", img, fi.Size(), v.SizeBytes)
	}
	s := v.Stage
	if s == nil || s.State != store.Staged {
		return cs, nil
	}
	switch backing := n.dev.LoopBackingFile(s.Device); {
	case backing == "":
		add(Inaccessible, "LoopDeviceDetached", "loop device %s of the staged volume was detached: unstage and stage the volume again (restart the pod)", s.Device)
		return cs, nil
	case !n.dev.LoopServes(s.Device, img):
		add(Inaccessible, "LoopDeviceMismatch", "loop device %s now serves %s, not this volume's image: something outside podvol reused it; restart the pod to stage the volume again", s.Device, backing)
		return cs, nil
	}
	if err := n.handoverOf(v).health(ctx, v, viaRuntime, add); err != nil {
		return nil, err
	}
	return cs, nil
}

// health of a microVM's volume: what the runtime says of it, if asked.
func (m microVM) health(ctx context.Context, v *store.Volume, viaRuntime bool, add addCondition) error {
	if !viaRuntime {
		return nil
	}
	st, err := m.n.direct.Stats(ctx, m.target, v.Stage.Device)
	switch {
	case errors.Is(err, directvolume.ErrNoSandbox):
		return fmt.Errorf("volume %s is assigned to a microVM that is not running in a sandbox yet: %w", v.ID, errkind.ErrInUse)
	case err != nil:
		add(Inaccessible, "RuntimeUnreachable", "the runtime holding volume %s did not answer: %v", v.ID, err)
	case st.Condition != nil && (st.Condition.Abnormal || (st.Condition.Message != "" && st.Condition.Message != "OK")):
		add(Degraded, "RuntimeReportsAbnormal", "the guest reports: %s", st.Condition.Message)
	}
	return nil
}

// health of a host mount: the staging mount, its filesystem and the
// targets' mounts.
func (h hostMount) health(_ context.Context, v *store.Volume, _ bool, add addCondition) error {
	n, s := h.n, v.Stage
	if s.Block {
		return nil
	}
	m, err := n.dev.MountedAt(s.Path)
	switch {
	case err != nil:
		add(Inaccessible, "MountTableUnreadable", "cannot read the mount table: %v", err)
	case m == nil || m.Source != s.Device:
		add(Inaccessible, "StagingMountMissing", "the volume is not mounted at its staging path %s any more: restart the pod to stage it again", s.Path)
	default:
		if m.ReadOnly() && !hasFlag(s.MountFlags, "ro") {
			add(Degraded, "ReadOnly", "the filesystem at %s is read-only (%s): the kernel remounts it so after errors; check the kernel log and run fsck after unstaging", s.Path, m.Super)
		}
		if err := n.dev.ReadableRoot(s.Path); err != nil {
			add(Inaccessible, "FilesystemShutdown", "the %s filesystem at %s fails every access (%v): it has shut down after an error; unstage it and repair it (xfs_repair / e2fsck)", v.FsType, s.Path, err)
		}
	}
	if v.FsType == "ext4" {
		if count, fn := n.dev.Ext4Errors(s.Device); count > 0 {
			add(Degraded, "FilesystemErrors", "ext4 recorded %d error(s) (last in %s): run e2fsck on the volume after unstaging it", count, fn)
		}
	}
	for t := range v.Publications {
		if m, _ := n.dev.MountedAt(t); m == nil {
			add(Inaccessible, "PublishMountMissing", "the volume is no longer mounted at %s: restart the pod", t)
		}
	}
	return nil
}

func hasFlag(flags []string, f string) bool {
	for _, x := range flags {
		if x == f {
			return true
		}
	}
	return false
}
