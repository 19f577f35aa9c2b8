package node

import (
	"context"
	"errors"

	"k8s.io/klog/v2"

	"github.com/podvol/podvol/internal/store"
)

// Recover reconciles the store with the kernel after a restart: private
// growth mounts an interrupted NodeExpandVolume left are removed, stages caught
// half-way are rolled back (kubelet retries them), finished stages get their
// loop device and staging mount back if a reboot took them, publications whose
// mount is gone are forgotten, and loop devices of pool images that no stage
// owns are detached.
func (n *Node) Recover(ctx context.Context) error {
	vols, err := n.store.Volumes()
	if err != nil {
		return err
	}
	var errs []error
	// A growth interrupted at its private mount goes first: nothing below
	// may mount the filesystem a second time, or find it mounted there.
	if err := n.cleanGrowMounts(); err != nil {
		errs = append(errs, err)
	}
	owned := map[string]bool{}
	for _, v := range vols {
		if v.Stage == nil {
			continue
		}
		switch v.Stage.State {
		case store.Staging:
			klog.InfoS("Rolling back interrupted stage", "volume", v.ID, "stagingPath", v.Stage.Path)
			if err := n.teardownStage(v); err != nil {
				errs = append(errs, err)
			}
		case store.Staged:
			// A crash during a snapshot leaves the filesystem
			// frozen, and every writer in the pod hangs: thaw first.
			if !v.Stage.Block {
				if f, err := n.dev.OpenFilesystemOn(v.Stage.Path, v.Stage.Device); err == nil {
					if err := f.Thaw(); err != nil {
						klog.V(2).InfoS("Thaw at start", "volume", v.ID, "err", err)
					}
					f.Close()
				}
			}
			// An assignment to a microVM whose mount information is
			// gone (ended, or never written) no longer keeps the
			// staging mount away.
			n.livePublications(v)
			if v, err = n.store.Volume(v.ID); err != nil {
				errs = append(errs, err)
				continue
			}
			dev, err := n.restoreStage(ctx, v)
			if err != nil {
				klog.ErrorS(err, "Could not restore staged volume; kubelet's next NodeStageVolume will retry", "volume", v.ID)
				errs = append(errs, err)
			}
			owned[dev] = true
		}
	}
	// Publications caught half-way: keep the ones whose mount exists.
	for _, v := range vols {
		if v.Stage == nil || v.Stage.State != store.Staged {
			continue
		}
		for t, p := range v.Publications {
			if p.State != store.Publishing {
				continue
			}
			if err := n.handoverAt(v, t).recoverPublishing(ctx, v, t); err != nil {
				errs = append(errs, err)
			}
		}
		if v, err = n.store.Volume(v.ID); err != nil {
			errs = append(errs, err)
			continue
		}
		n.livePublications(v)
		_, err := n.store.Update(v.ID, func(v *store.Volume) error {
			for t, p := range v.Publications {
				if p.State == store.Publishing {
					p.State = store.Published
					klog.InfoS("Completed interrupted publish", "volume", v.ID, "target", t)
				}
			}
			return nil
		})
		if err != nil {
			errs = append(errs, err)
		}
	}
	if n.direct != nil {
		n.scanDirect(vols)
	}
	loops, err := n.dev.LoopDevices()
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for dev, backing := range loops {
		id, detachAs, ours := n.pool.LoopImage(dev, backing)
		if !ours || owned[dev] {
			continue
		}
		if mnts, _ := n.dev.MountsOf(dev); len(mnts) > 0 {
			klog.InfoS("Leaving mounted loop device that no stage records", "device", dev, "backing", backing, "mounts", mnts)
			continue
		}
		klog.InfoS("Detaching loop device that no stage owns", "device", dev, "backing", backing, "volume", id)
		if err := n.dev.DetachLoop(dev, detachAs); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// restoreStage makes a staged volume's loop device and mount exist again.
func (n *Node) restoreStage(ctx context.Context, v *store.Volume) (string, error) {
	if n.stageIntact(v) {
		return v.Stage.Device, nil
	}
	dev, err := n.ensureLoop(v, v.Stage.Block)
	if err != nil {
		return "", err
	}
	if _, err := n.store.Update(v.ID, func(v *store.Volume) error {
		v.Stage.Device = dev
		return nil
	}); err != nil {
		return dev, err
	}
	if !n.handoverOf(v).mountsStaging() || !isDir(v.Stage.Path) {
		return dev, nil
	}
	klog.InfoS("Restoring staging mount", "volume", v.ID, "device", dev, "stagingPath", v.Stage.Path)
	return dev, n.mountStaging(ctx, v, dev, v.Stage.Path, v.Stage.MountFlags)
}
