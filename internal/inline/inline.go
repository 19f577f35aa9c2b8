// Package inline serves CSI inline ephemeral volumes: scratch space that a pod
// names in its spec (volumes[].csi) and that lives and dies with that pod.
// kubelet calls only NodePublishVolume and NodeUnpublishVolume for them, so
// publish creates the volume and mounts it straight at the target, and
// unpublish removes it. Because kubelet does not always call unpublish (a
// reboot, a plugin that was down: kubernetes#127229), a collector removes
// volumes whose pod is gone.
package inline

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/podvol/podvol/internal/device"
	"github.com/podvol/podvol/internal/errkind"
	"github.com/podvol/podvol/internal/keylock"
	"github.com/podvol/podvol/internal/node"
	"github.com/podvol/podvol/internal/pool"
	"github.com/podvol/podvol/internal/store"
)

// NamePrefix marks inline volumes among the pool's volume names; the rest of
// the name is the handle kubelet gave the volume.
const NamePrefix = "inline:"

// Manager publishes, unpublishes and collects inline volumes.
type Manager struct {
	Pool       *pool.Pool
	Node       *node.Node
	KubeletDir string
	// Locks serialises work on one volume handle with the CSI calls about
	// it (the plugin gives both the same Locks).
	Locks *keylock.Locks
	// Device is the mount table the targets are checked in: device.Host{}
	// for this machine, devicetest's fake in tests. Required: every call
	// fails without it, so that a test that forgot its fake does not read
	// and unmount the host's.
	Device device.Mounts
}

var errNoDevice = errors.New("inline.Manager.Device is nil: set device.Host{} for this machine, or devicetest.New() in tests")

// PublishRequest is a validated inline NodePublishVolume.
type PublishRequest struct {
	Handle     string
	TargetPath string
	SizeBytes  int64
	FsType     string
	MountFlags []string
	ReadOnly   bool
	// FsGroup is the pod's fsGroup (VOLUME_MOUNT_GROUP), "" for none.
	FsGroup string
	Pod     store.Inline
}

// VolumeID returns the pool's id of the inline volume kubelet calls handle.
func (m *Manager) VolumeID(handle string) (string, bool) {
	v, err := m.Pool.Store().VolumeByName(NamePrefix + handle)
	if err != nil {
		return "", false
	}
	return v.ID, true
}

// Publish creates the volume in the pool (sharing its capacity with every
// other volume), formats it and mounts it at the target. The caller holds
// the handle's lock.
func (m *Manager) Publish(ctx context.Context, r PublishRequest) error {
	if m.Device == nil {
		return errNoDevice
	}
	pod := r.Pod
	pod.VolumeHandle = r.Handle
	v, err := m.Pool.CreateVolume(ctx, pool.CreateRequest{Name: NamePrefix + r.Handle, SizeBytes: r.SizeBytes, FsType: r.FsType, Inline: &pod})
	if err != nil {
		return fmt.Errorf("inline volume of pod %s/%s: %w", pod.PodNamespace, pod.PodName, err)
	}
	// kubelet publishes again what it finds mounted after a restart: that
	// pod is using the volume, so a repeated publish must neither walk its
	// files again nor, whatever fails, tear the volume down.
	repeat := v.Stage != nil && v.Stage.State == store.Staged && v.Stage.Path == r.TargetPath
	err = m.Node.Stage(ctx, node.StageRequest{VolumeID: v.ID, StagingPath: r.TargetPath, FsType: r.FsType, MountFlags: r.MountFlags})
	if repeat {
		return err
	}
	if err == nil && !r.ReadOnly {
		err = m.Node.ApplyFsGroup(r.TargetPath, r.FsGroup, "")
		if err != nil {
			err = fmt.Errorf("inline volume of pod %s/%s: %w", pod.PodNamespace, pod.PodName, err)
			if uerr := m.Node.Unstage(ctx, v.ID, r.TargetPath); uerr != nil {
				klog.ErrorS(uerr, "Unmounting inline volume after a failed publish", "volume", v.ID)
			}
		}
	}
	if err != nil && !errors.Is(err, errkind.ErrConflict) {
		// Nothing of a volume that could not be mounted is kept; kubelet
		// retries the whole publish.
		if derr := m.Pool.DeleteVolume(ctx, v.ID); derr != nil {
			klog.ErrorS(derr, "Removing inline volume after a failed publish", "volume", v.ID)
		}
	}
	return err
}

// Unpublish unmounts and deletes the volume. An unknown handle is already
// unpublished: kubelet retries an error forever (kubernetes#90752).
func (m *Manager) Unpublish(ctx context.Context, handle, target string) error {
	if m.Device == nil {
		return errNoDevice
	}
	v, err := m.Pool.Store().VolumeByName(NamePrefix + handle)
	if errors.Is(err, store.ErrNotFound) {
		return m.removeUnmounted(target)
	}
	if err != nil {
		return err
	}
	if v.Stage != nil && v.Stage.Path != target {
		return fmt.Errorf("inline volume %s is mounted at %s, not %s: %w", handle, v.Stage.Path, target, errkind.ErrNotFound)
	}
	return m.remove(ctx, v)
}

func (m *Manager) remove(ctx context.Context, v *store.Volume) error {
	if v.Stage != nil {
		if err := m.Node.Unstage(ctx, v.ID, v.Stage.Path); err != nil {
			return err
		}
		if err := m.removeUnmounted(v.Stage.Path); err != nil {
			return err
		}
	}
	return m.Pool.DeleteVolume(ctx, v.ID)
}

func (m *Manager) removeUnmounted(path string) error {
	if mnt, err := m.Device.MountedAt(path); err != nil || mnt != nil {
		if err == nil {
			err = fmt.Errorf("%s still has %s mounted: %w", path, mnt.Source, errkind.ErrInUse)
		}
		return err
	}
	return node.RemoveTarget(path)
}

// Collect removes inline volumes that no pod uses any more: the target is
// not mounted, or the pod's directory is gone from the kubelet root. A volume
// whose target is mounted inside an existing pod directory is never touched.
func (m *Manager) Collect(ctx context.Context) error {
	if m.Device == nil {
		return errNoDevice
	}
	vols, err := m.Pool.Store().Volumes()
	if err != nil {
		return err
	}
	var errs []error
	for _, v := range vols {
		if v.Inline == nil {
			continue
		}
		if err := m.collect(ctx, v.ID, v.Inline.VolumeHandle); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (m *Manager) collect(ctx context.Context, id, handle string) error {
	defer m.Locks.Lock(handle)()
	v, err := m.Pool.Store().Volume(id)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil || v.State != store.Ready {
		return err
	}
	why := m.unused(v)
	if why == "" {
		return nil
	}
	klog.InfoS("Collecting inline volume", "volume", v.ID, "pod", v.Inline.PodNamespace+"/"+v.Inline.PodName, "podUID", v.Inline.PodUID, "reason", why)
	if v.Stage != nil && v.Stage.State == store.Staged {
		if mnt, _ := m.Device.MountedAt(v.Stage.Path); mnt != nil {
			// The pod directory is gone but our mount is still there
			// (a kubelet that removed the directory without us).
			if err := m.Device.Unmount(v.Stage.Path); err != nil {
				return err
			}
		}
	}
	return m.remove(ctx, v)
}

// unused says why a volume is not in use, or "".
func (m *Manager) unused(v *store.Volume) string {
	s := v.Stage
	if s == nil {
		return "never mounted, or unmounted without being deleted"
	}
	if s.State != store.Staged {
		return ""
	}
	podDir := filepath.Join(m.KubeletDir, "pods", v.Inline.PodUID)
	// The pod-directory rule applies only to targets kubelet placed in that
	// directory: a wrong --kubelet-dir must not make live volumes look dead.
	if v.Inline.PodUID != "" && strings.HasPrefix(s.Path, podDir+"/") {
		if _, err := os.Stat(podDir); errors.Is(err, os.ErrNotExist) {
			return "the pod's directory " + podDir + " is gone"
		}
	}
	if mnt, err := m.Device.MountedAt(s.Path); err == nil && mnt == nil {
		return "the target " + s.Path + " is not mounted any more"
	}
	return ""
}

// Run collects at start and then every interval until ctx ends.
func (m *Manager) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := m.Collect(ctx); err != nil {
			klog.ErrorS(err, "Collecting inline volumes")
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
