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
	"strconv"
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
}

func (c *Cluster) recordHostPaths() error {
	f := c.path("host-paths.json")
	if fileExists(f) {
		return nil
	}
	existed := map[string]bool{}
	for _, p := range hostPaths {
		existed[p] = fileExists(p)
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
	c.p.next("stopping the kubelet and the pods' containers")
	errs = append(errs, c.stopProcess("kubelet", 30*time.Second))
	if _, ok := c.running("containerd"); ok {
		c.removeContainers(ctx)
	}
	errs = append(errs, c.stopProcess("containerd", 30*time.Second))
	c.killShims()
	c.p.next("stopping the control plane")
	for _, n := range []string{"kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"} {
		errs = append(errs, c.stopProcess(n, time.Minute))
	}
	c.p.next("removing mounts and loop devices")
	errs = append(errs, c.unmountAll())
	c.p.next("removing the network bridge, its nat rules and namespaces")
	errs = append(errs, c.removeServiceRules())
	if _, err := exec.Command("ip", "link", "show", bridge).CombinedOutput(); err == nil {
		if out, err := exec.Command("ip", "link", "del", bridge).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("delete bridge %s: %w: %s", bridge, err, out))
		} else {
			c.p.note("deleted bridge %s", bridge)
		}
	}
	c.removeNetns()
	c.p.next("removing files")
	var existed map[string]bool
	if b, err := os.ReadFile(c.path("host-paths.json")); err == nil {
		_ = json.Unmarshal(b, &existed)
		for _, p := range hostPaths {
			if !existed[p] && fileExists(p) {
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

func (c *Cluster) removeContainers(ctx context.Context) {
	ctr := func(args ...string) string {
		out, _ := exec.CommandContext(ctx, "ctr", append([]string{"-a", c.containerdSock(), "-n", "k8s.io"}, args...)...).Output()
		return string(out)
	}
	for _, t := range strings.Fields(ctr("tasks", "ls", "-q")) {
		ctr("tasks", "kill", "-s", "SIGKILL", t)
	}
	time.Sleep(500 * time.Millisecond)
	for _, t := range strings.Fields(ctr("tasks", "ls", "-q")) {
		ctr("tasks", "rm", "-f", t)
	}
	for _, ct := range strings.Fields(ctr("containers", "ls", "-q")) {
		ctr("containers", "rm", ct)
	}
}

// killShims stops containerd shims that serve this cluster's containerd (its
// socket path is in their command line), by PID.
func (c *Cluster) killShims() {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(b), c.containerdSock()) || !strings.Contains(string(b), "containerd-shim") {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			c.p.note("killed shim pid %d", pid)
		}
	}
}

// unmountAll unmounts everything below the cluster's directory, deepest
// first, detaching the loop devices of podvol's volumes before the pool that
// holds their images, and the pool's own loop device last.
func (c *Cluster) unmountAll() error {
	var errs []error
	pool := c.path("pool")
	umount := func(keepPool bool) {
		ms, _ := mountinfo.GetMounts(mountinfo.PrefixFilter(c.Dir))
		sort.Slice(ms, func(i, j int) bool { return len(ms[i].Mountpoint) > len(ms[j].Mountpoint) })
		for _, m := range ms {
			if keepPool && m.Mountpoint == pool {
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
	// Loop devices of volumes whose images live in the pool. The plugin
	// attached them inside its container, where the path differs, so they
	// are matched by the images' device and inode numbers.
	images := map[[2]uint64]bool{}
	_ = filepath.WalkDir(pool, func(p string, d os.DirEntry, err error) error {
		var st syscall.Stat_t
		if err == nil && d.Type().IsRegular() && syscall.Stat(p, &st) == nil {
			images[[2]uint64{st.Dev, st.Ino}] = true
		}
		return nil
	})
	loops, _ := device.LoopDevices()
	for dev, backing := range loops {
		if d, ino, err := device.LoopInode(dev); err == nil && images[[2]uint64{d, ino}] {
			if err := device.DetachLoop(dev, backing); err != nil {
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

// removeNetns removes the CNI network namespaces no process uses any more.
func (c *Cluster) removeNetns() {
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "cni-") {
			continue
		}
		if out, _ := exec.Command("ip", "netns", "pids", e.Name()).Output(); strings.TrimSpace(string(out)) != "" {
			continue
		}
		_ = exec.Command("ip", "netns", "del", e.Name()).Run()
	}
}
