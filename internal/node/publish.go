package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/podvol/podvol/internal/device"
	"github.com/podvol/podvol/internal/errkind"
	"github.com/podvol/podvol/internal/failpoint"
	"github.com/podvol/podvol/internal/store"
)

// PublishRequest is a validated NodePublishVolume.
type PublishRequest struct {
	VolumeID    string
	StagingPath string
	TargetPath  string
	Block       bool
	ReadOnly    bool
	MountFlags  []string
	// Exclusive is ReadWriteOncePod (SINGLE_NODE_SINGLE_WRITER): the volume
	// may be published at one target only.
	Exclusive bool
	// Direct assigns the volume to a microVM instead of mounting it.
	Direct bool
	// FsGroup is the pod's fsGroup (VOLUME_MOUNT_GROUP), a numeric gid.
	FsGroup string
	// FsGroupChangePolicy is Always or OnRootMismatch.
	FsGroupChangePolicy string
}

// bindFlags are the per-mount flags a bind mount can carry. Filesystem
// options (discard, errors=...) were applied at the staging mount.
var bindFlags = []string{"ro", "nosuid", "nodev", "noexec", "noatime", "nodiratime", "relatime", "strictatime", "lazytime"}

// Publish bind-mounts the staged volume (or its device node) at the target.
func (n *Node) Publish(ctx context.Context, r PublishRequest) error {
	v, err := n.volume(r.VolumeID)
	if err != nil {
		return err
	}
	s := v.Stage
	if s == nil || s.State != store.Staged || s.Path != r.StagingPath {
		return fmt.Errorf("volume %s is not staged at %s: call NodeStageVolume first: %w", v.ID, r.StagingPath, errkind.ErrNotStaged)
	}
	if s.Block != r.Block {
		return fmt.Errorf("volume %s is staged for %s access, publish asks for %s: %w", v.ID, accessName(s.Block), accessName(r.Block), errkind.ErrInvalid)
	}
	return n.handoverFor(v, r).publish(ctx, v, r)
}

// publish by host mount: a bind of the staging mount, or of the loop
// device, at the target.
func (h hostMount) publish(ctx context.Context, v *store.Volume, r PublishRequest) error {
	n := h.n
	v, err := n.handoverOf(v).beforeHostPublish(ctx, v, r.TargetPath)
	if err != nil {
		return err
	}
	if p, ok := v.Publications[r.TargetPath]; ok && p.State == store.Published {
		if p.ReadOnly != r.ReadOnly || p.Exclusive() != r.Exclusive {
			return fmt.Errorf("volume %s is already published at %s with other options: %w", v.ID, r.TargetPath, errkind.ErrConflict)
		}
		if m, _ := n.dev.MountedAt(r.TargetPath); m != nil {
			return nil
		}
	}
	for t, p := range v.Publications {
		if t == r.TargetPath {
			continue
		}
		if r.Exclusive || p.Exclusive() {
			if m, _ := n.dev.MountedAt(t); m != nil {
				return fmt.Errorf("volume %s is ReadWriteOncePod and already published at %s: %w", v.ID, t, errkind.ErrInUse)
			}
		}
	}
	if err := parentExists(r.TargetPath); err != nil {
		return err
	}

	mode := store.AccessShared
	if r.Exclusive {
		mode = store.AccessExclusive
	}
	if _, err := n.store.Update(v.ID, func(v *store.Volume) error {
		if v.Publications == nil {
			v.Publications = map[string]*store.Publication{}
		}
		v.Publications[r.TargetPath] = &store.Publication{Block: r.Block, ReadOnly: r.ReadOnly, AccessMode: mode, State: store.Publishing}
		return nil
	}); err != nil {
		return err
	}
	failpoint.Hit("publish-after-record")

	if err := n.bind(ctx, v, r); err != nil {
		// A record left behind is harmless: the target is not mounted, and
		// the next publish or unpublish of it converges.
		if _, uerr := n.store.Update(v.ID, func(v *store.Volume) error {
			delete(v.Publications, r.TargetPath)
			return nil
		}); uerr != nil {
			klog.ErrorS(uerr, "Removing the record of a failed publication", "volume", v.ID, "targetPath", r.TargetPath)
		}
		return err
	}
	_, err = n.store.Update(v.ID, func(v *store.Volume) error {
		v.Publications[r.TargetPath].State = store.Published
		return nil
	})
	return err
}

func (n *Node) bind(ctx context.Context, v *store.Volume, r PublishRequest) error {
	source := v.Stage.Path
	if r.Block {
		source = v.Stage.Device
		// The target of a block publish is a file for the device node
		// to be bound onto.
		f, err := os.OpenFile(r.TargetPath, os.O_CREATE|os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o640)
		if err != nil {
			return fmt.Errorf("create target file: %w", err)
		}
		f.Close()
	} else if err := os.Mkdir(r.TargetPath, 0o750); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create target directory: %w", err)
	}
	if m, err := n.dev.MountedAt(r.TargetPath); err != nil {
		return err
	} else if m != nil {
		return fmt.Errorf("target %s already has %s mounted: %w", r.TargetPath, m.Source, errkind.ErrConflict)
	}
	opts := []string{"bind"}
	if r.ReadOnly {
		opts = append(opts, "ro")
	}
	for _, f := range r.MountFlags {
		if slices.Contains(bindFlags, f) && !slices.Contains(opts, f) {
			opts = append(opts, f)
		}
	}
	if err := n.dev.Mount(ctx, source, r.TargetPath, "", opts); err != nil {
		return fmt.Errorf("publish volume %s at %s: %w", v.ID, r.TargetPath, err)
	}
	if !r.Block && !r.ReadOnly {
		if err := n.ApplyFsGroup(r.TargetPath, r.FsGroup, r.FsGroupChangePolicy); err != nil {
			if uerr := n.dev.Unmount(r.TargetPath); uerr != nil {
				klog.ErrorS(uerr, "Unmounting a publication whose fsGroup could not be applied", "volume", v.ID, "targetPath", r.TargetPath)
			}
			return fmt.Errorf("volume %s: %w", v.ID, err)
		}
	}
	return nil
}

// ApplyFsGroup gives the filesystem mounted at path to a pod's fsGroup (a
// VOLUME_MOUNT_GROUP value; "" means none). kubelet leaves fsGroup to a
// driver that advertises VOLUME_MOUNT_GROUP, so without this a non-root pod
// cannot write to its own volume.
func (n *Node) ApplyFsGroup(path, fsGroup, changePolicy string) error {
	if fsGroup == "" {
		return nil
	}
	g, err := gid(fsGroup)
	if err == nil {
		err = n.dev.SetGroup(path, g, changePolicy == "OnRootMismatch")
	}
	if err != nil {
		return fmt.Errorf("apply fsGroup %s: %w", fsGroup, err)
	}
	return nil
}

func accessName(block bool) string {
	if block {
		return "block"
	}
	return "filesystem"
}

// Unpublish unmounts the target and removes it. A target that holds nothing
// of the volume is already unpublished: kubelet retries an error forever
// (kubernetes#90752), so only a real failure is reported.
func (n *Node) Unpublish(ctx context.Context, id, target string) error {
	v, err := n.volume(id)
	if err != nil && !errors.Is(err, errkind.ErrNotFound) {
		return err
	}
	m, merr := n.dev.MountedAt(target)
	if merr != nil {
		return merr
	}
	if v == nil {
		if m != nil {
			return fmt.Errorf("volume %s does not exist here, yet %s is mounted at %s: leaving it alone: %w", id, m.Source, target, errkind.ErrNotFound)
		}
		return RemoveTarget(target)
	}
	return n.handoverAt(v, target).unpublish(ctx, v, target, m)
}

// unpublish of a host mount: unmount the target, if it holds this volume,
// and remove it.
func (h hostMount) unpublish(ctx context.Context, v *store.Volume, target string, m *device.MountAt) error {
	n, id := h.n, v.ID
	if m != nil {
		if _, ours := v.Publications[target]; !ours && !n.mountIsVolume(v, m) {
			return fmt.Errorf("%s has %s mounted, which is not volume %s: leaving it alone: %w", target, m.Source, id, errkind.ErrInvalid)
		}
		if err := n.dev.Unmount(target); err != nil {
			return err
		}
	}
	if err := RemoveTarget(target); err != nil {
		return err
	}
	_, err := n.store.Update(v.ID, func(v *store.Volume) error {
		delete(v.Publications, target)
		return nil
	})
	return err
}

// mountIsVolume reports whether a mount is a bind of this volume's staging
// mount or device node.
func (n *Node) mountIsVolume(v *store.Volume, m *device.MountAt) bool {
	if v.Stage == nil {
		return false
	}
	return m.Source == v.Stage.Device || strings.TrimPrefix(m.Root, "/") == strings.TrimPrefix(v.Stage.Device, "/dev/")
}
