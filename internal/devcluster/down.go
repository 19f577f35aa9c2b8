package devcluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/moby/sys/mountinfo"

	"github.com/podvol/podvol/internal/device"
)

// hostPaths are written by the kubelet, containerd and the CNI plugins at
// paths they hard-code, outside the cluster's directory. Up records which
// existed before; Down removes the others.
var hostPaths = []string{
	"/var/lib/kubelet", "/var/log/pods", "/var/log/containers", "/var/lib/cni", "/run/netns", "/run/containerd",
	"/var/lib/podvol", "/run/kata-containers", "/run/vc",
}

func (c *Cluster) recordHostPaths() error {
	f := c.path("host-paths.json")
	existed := map[string]bool{}
	if b, err := os.ReadFile(f); err == nil {
		if err := json.Unmarshal(b, &existed); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
	}
	// A path added to the list since the record was written is recorded
	// now, before anything of this cluster makes it.
	for _, p := range hostPaths {
		if _, ok := existed[p]; !ok {
			existed[p] = fileExists(p)
		}
	}
	b, _ := json.Marshal(existed)
	return os.WriteFile(f, b, 0o600)
}

// Down stops every process the cluster started (by PID), removes its pods'
// containers, every mount and loop device below its directory, its network
// bridge, the host paths it created, and finally the directory itself.
func (c *Cluster) Down(ctx context.Context) error {
	if !fileExists(c.Dir) {
		fmt.Fprintf(c.Out, "no dev cluster at %s\n", c.Dir)
		return nil
	}
	c.p.begin(5)
	var errs []error
	c.p.next("stopping %d nodes: kubelet, the pods' containers, containerd", len(c.Nodes))
	for _, n := range c.Nodes {
		errs = append(errs, n.stop(ctx))
	}
	c.p.next("stopping the control plane")
	errs = append(errs, c.StopPrometheus())
	for _, n := range []string{"kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"} {
		errs = append(errs, c.stopProcess(n, time.Minute))
	}
	c.p.next("removing mounts, loop devices, namespaces and cgroups")
	errs = append(errs, c.unmountAll())
	for _, n := range c.Nodes {
		errs = append(errs, n.removeCgroups())
	}
	c.p.next("removing the network bridge, the nodes' links and the nat rules")
	for _, n := range c.Nodes {
		errs = append(errs, n.removeNetwork())
	}
	errs = append(errs, c.removeServiceRules())
	if _, err := exec.Command("ip", "link", "show", bridge).CombinedOutput(); err == nil {
		if out, err := exec.Command("ip", "link", "del", bridge).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("delete bridge %s: %w: %s", bridge, err, out))
		} else {
			c.p.note("deleted bridge %s", bridge)
		}
	}
	c.p.next("removing files")
	var existed map[string]bool
	if b, err := os.ReadFile(c.path("host-paths.json")); err == nil {
		_ = json.Unmarshal(b, &existed)
		for _, p := range hostPaths {
			// A path the record does not name may have been there before.
			if was, ok := existed[p]; ok && !was && fileExists(p) {
				if err := os.RemoveAll(p); err != nil {
					errs = append(errs, err)
				} else {
					c.p.note("removed %s", p)
				}
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w\n(%s is kept for inspection; run make down again)", err, c.Dir)
	}
	if err := os.RemoveAll(c.Dir); err != nil {
		return err
	}
	fmt.Fprintf(c.Out, "The dev cluster is gone (%s removed).\n", c.Dir)
	return nil
}

// unmountAll unmounts everything below the cluster's directory, deepest
// first (the nodes' namespace files among them: with the nodes' processes
// gone, that ends the namespaces and every mount in them), detaching the
// loop devices of podvol's volumes before the pools that hold their images,
// and the pools' own loop devices last.
func (c *Cluster) unmountAll() error {
	var errs []error
	pools := map[string]bool{}
	for _, n := range c.Nodes {
		for _, dir := range n.Pools() {
			pools[dir] = true
		}
	}
	umount := func(keepPools bool) {
		ms, _ := mountinfo.GetMounts(mountinfo.PrefixFilter(c.Dir))
		sort.Slice(ms, func(i, j int) bool { return len(ms[i].Mountpoint) > len(ms[j].Mountpoint) })
		for _, m := range ms {
			if keepPools && pools[m.Mountpoint] {
				continue
			}
			if err := syscall.Unmount(m.Mountpoint, 0); err != nil {
				if err := syscall.Unmount(m.Mountpoint, syscall.MNT_DETACH); err != nil {
					errs = append(errs, fmt.Errorf("unmount %s: %w", m.Mountpoint, err))
					continue
				}
			}
		}
	}
	detach := func(prefix string) {
		loops, _ := device.LoopDevices()
		for dev, backing := range loops {
			if strings.HasPrefix(backing, prefix) {
				if err := device.DetachLoop(dev, backing); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	umount(true)
	// Loop devices of volumes whose images live in a pool. The plugin
	// attached them inside its container, where the path differs, so they
	// are matched by the images' device and inode numbers, and detached
	// as serving the image at its path here.
	images := map[[2]uint64]string{}
	for pool := range pools {
		_ = filepath.WalkDir(pool, func(p string, d os.DirEntry, err error) error {
			var st syscall.Stat_t
			if err == nil && d.Type().IsRegular() && syscall.Stat(p, &st) == nil {
				images[[2]uint64{st.Dev, st.Ino}] = p
			}
			return nil
		})
	}
	loops, _ := device.LoopDevices()
	for dev := range loops {
		d, ino, err := device.LoopInode(dev)
		if img, ok := images[[2]uint64{d, ino}]; err == nil && ok {
			if err := device.DetachLoop(dev, img); err != nil {
				errs = append(errs, err)
			}
		}
	}
	umount(false)
	detach(c.Dir + "/")
	if ms, _ := mountinfo.GetMounts(mountinfo.PrefixFilter(c.Dir)); len(ms) > 0 {
		errs = append(errs, fmt.Errorf("%d mounts below %s remain", len(ms), c.Dir))
	}
	return errors.Join(errs...)
}
