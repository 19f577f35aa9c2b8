package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"

	"k8s.io/klog/v2"

	"github.com/podvol/podvol/internal/directvolume"
	"github.com/podvol/podvol/internal/errkind"
	"github.com/podvol/podvol/internal/failpoint"
	"github.com/podvol/podvol/internal/store"
)

// directPublication returns the target of the volume's direct assignment.
func directPublication(v *store.Volume) (string, bool) {
	for t, p := range v.Publications {
		if p.Direct {
			return t, true
		}
	}
	return "", false
}

// publishDirect hands the staged volume to a microVM runtime: the staging
// mount goes (a filesystem is never mounted on the host and in a guest at
// once), the mount information is written for the target, and the target is
// left an empty directory.
func (n *Node) publishDirect(ctx context.Context, v *store.Volume, r PublishRequest) error {
	if n.direct == nil {
		return fmt.Errorf("direct assignment is not configured on this plugin: %w", errkind.ErrInvalid)
	}
	if !r.Exclusive {
		return fmt.Errorf("volume %s: a direct-assigned volume must be ReadWriteOncePod (SINGLE_NODE_SINGLE_WRITER): two guests must never mount one filesystem: %w", v.ID, errkind.ErrInUse)
	}
	if p, ok := v.Publications[r.TargetPath]; ok && p.State == store.Published {
		if !p.Direct {
			return fmt.Errorf("volume %s is already mounted on the host at %s: %w", v.ID, r.TargetPath, errkind.ErrConflict)
		}
		if directvolume.Exists(n.direct.Root, r.TargetPath) {
			return nil
		}
	}
	if live := n.livePublications(v); len(live) > 0 && !(len(live) == 1 && live[0] == r.TargetPath) {
		return fmt.Errorf("volume %s is already published at %v: a direct-assigned volume has one user: %w", v.ID, live, errkind.ErrInUse)
	}
	if err := parentExists(r.TargetPath); err != nil {
		return err
	}
	if _, err := n.store.Update(v.ID, func(v *store.Volume) error {
		if v.Publications == nil {
			v.Publications = map[string]*store.Publication{}
		}
		v.Publications[r.TargetPath] = &store.Publication{Direct: true, Block: r.Block, ReadOnly: r.ReadOnly, AccessMode: store.AccessExclusive, State: store.Publishing}
		return nil
	}); err != nil {
		return err
	}
	failpoint.Hit("direct-after-record")
	if err := n.assign(v, r); err != nil {
		if uerr := n.undoDirect(ctx, v.ID, r.TargetPath); uerr != nil {
			klog.ErrorS(uerr, "Undoing a failed direct assignment", "volume", v.ID, "targetPath", r.TargetPath)
		}
		return err
	}
	_, err := n.store.Update(v.ID, func(v *store.Volume) error {
		v.Publications[r.TargetPath].State = store.Published
		return nil
	})
	return err
}

func (n *Node) assign(v *store.Volume, r PublishRequest) error {
	s := v.Stage
	if !s.Block {
		if err := n.dev.Unmount(s.Path); err != nil {
			return fmt.Errorf("unmount the host staging mount before assigning volume %s to a guest: %w", v.ID, err)
		}
	}
	if err := os.Mkdir(r.TargetPath, 0o750); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create target directory: %w", err)
	}
	info := directvolume.MountInfo{VolumeType: "directvol", Device: s.Device}
	if !s.Block {
		info.FsType = v.FsType
		opts := append([]string(nil), r.MountFlags...)
		if r.ReadOnly {
			opts = append(opts, "ro")
		}
		info.Options = directvolume.GuestOptions(opts)
		if r.FsGroup != "" {
			info.Metadata = map[string]string{directvolume.MetaFsGroup: r.FsGroup}
			if r.FsGroupChangePolicy != "" {
				info.Metadata[directvolume.MetaFsGroupChangePolicy] = r.FsGroupChangePolicy
			}
		}
	}
	return directvolume.Write(n.direct.Root, r.TargetPath, info)
}

// undoDirect ends an assignment: the mount information goes, the target
// goes, and a filesystem volume that is still staged is mounted on the host
// again. Every step is idempotent.
func (n *Node) undoDirect(ctx context.Context, id, target string) error {
	if err := directvolume.Remove(n.direct.Root, target); err != nil {
		return err
	}
	if err := RemoveTarget(target); err != nil {
		return err
	}
	v, err := n.store.Volume(id)
	if err != nil {
		return err
	}
	// The staging mount comes back before the assignment's record goes:
	// if the mount fails, the record keeps the unpublish failing, so that
	// kubelet's retry mounts again, instead of a later publish finding an
	// empty staging directory.
	if s := v.Stage; s != nil && s.State == store.Staged && !s.Block {
		if n.dev.MountedFrom(s.Path, s.Device) != nil {
			klog.InfoS("Mounting the staging path again after a direct assignment", "volume", id, "stagingPath", s.Path)
			if err := n.mountStaging(context.WithoutCancel(ctx), v, s.Device, s.Path, s.MountFlags); err != nil {
				return fmt.Errorf("volume %s left its microVM, but mounting it again at %s failed: %w", id, s.Path, err)
			}
		}
	}
	_, err = n.store.Update(id, func(v *store.Volume) error {
		delete(v.Publications, target)
		return nil
	})
	return err
}

// stats of a microVM's volume: the runtime asks the guest.
func (m microVM) stats(ctx context.Context, v *store.Volume, _ string) (Stats, error) {
	st, err := m.n.direct.Stats(ctx, m.target, v.Stage.Device)
	if errors.Is(err, directvolume.ErrNoSandbox) {
		return Stats{}, fmt.Errorf("volume %s is assigned to a microVM that is not running in a sandbox yet: no stats until it starts: %w", v.ID, errkind.ErrInUse)
	}
	if err != nil {
		return Stats{}, err
	}
	var out Stats
	for _, u := range st.Usage {
		switch u.Unit {
		case 1:
			out.TotalBytes, out.AvailableBytes, out.UsedBytes = u.Total, u.Available, u.Used
		case 2:
			out.TotalInodes, out.FreeInodes, out.UsedInodes = u.Total, u.Available, u.Used
		}
	}
	out.Block = v.Stage.Block
	return out, nil
}

// resizeDirect tells the runtime that the device grew.
func (n *Node) resizeDirect(ctx context.Context, v *store.Volume, target string) error {
	err := n.direct.Resize(ctx, target, v.Stage.Device, v.SizeBytes)
	if errors.Is(err, directvolume.ErrNoSandbox) {
		return fmt.Errorf("volume %s grew to %d bytes, but the microVM it is assigned to is not running in a sandbox yet to grow its filesystem: %w", v.ID, v.SizeBytes, errkind.ErrInUse)
	}
	if err != nil {
		return fmt.Errorf("volume %s grew to %d bytes on the host, but growing it in the guest failed (Kata's agent does not implement online resize of direct volumes yet; stop the pod and the filesystem grows at the next host stage): %w: %w", v.ID, v.SizeBytes, err, errkind.ErrInUse)
	}
	return nil
}

// gid parses a VOLUME_MOUNT_GROUP value.
func gid(s string) (int, error) {
	g, err := strconv.Atoi(s)
	if err != nil || g < 0 {
		return 0, fmt.Errorf("volume mount group %q is not a numeric group id: %w", s, errkind.ErrInvalid)
	}
	return g, nil
}

// scanDirect looks at every direct-volume entry: podvol's own were recovered
// above with their volumes; anything else belongs to another driver and is
// left alone.
func (n *Node) scanDirect(vols []*store.Volume) {
	targets, err := directvolume.Scan(n.direct.Root)
	if err != nil {
		klog.ErrorS(err, "Reading the direct-volume directory", "root", n.direct.Root)
		return
	}
	ours := map[string]bool{}
	for _, v := range vols {
		for t, p := range v.Publications {
			if p.Direct {
				ours[t] = true
			}
		}
	}
	for _, t := range targets {
		if !ours[t] {
			klog.V(2).InfoS("Leaving a direct-volume entry podvol did not write", "target", t)
		}
	}
}
