package devcluster

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/podvol/podvol/internal/device"
)

// Node is one node of the dev cluster. Each node is a network namespace and
// a mount namespace of its own, made by podvol-dev (no container image, no
// container runtime underneath), holding its own containerd, kubelet, cgroup
// subtree and XFS pool:
//   - network: an address on the host's bridge (the host routes between
//     nodes and to each node's pod subnet), its own loopback (so every node's
//     host-network pods listen on 127.0.0.1 without clashing) and its pods'
//     bridge;
//   - mounts: the paths podvol's manifests and the kubelet name
//     (/var/lib/kubelet, /var/lib/podvol, /run/containerd, ...) are bound from
//     the node's directory, so deploy/base runs with no host path changed and
//     each node's podvol sees only its own pool, as on separate machines.
type Node struct {
	// Index numbers the node from 1; it fixes its addresses and directory.
	Index int
	// Name is the Node object's name (ReplaceNode changes it).
	Name string
	// PoolSize is the size of the node's XFS pool image.
	PoolSize int64
	c        *Cluster
}

const (
	nodeSubnet  = "10.89.0" // node i at .(10+i), the host at .1
	hostGateway = nodeSubnet + ".1"
)

// IP is the node's address (its InternalIP).
func (n *Node) IP() string { return fmt.Sprintf("%s.%d", nodeSubnet, 10+n.Index) }

// PoolDir is the node's pool as the host sees it (the node's processes see
// it at /var/lib/podvol).
func (n *Node) PoolDir() string { return n.dir("pool") }

// FastPool is the name of the dev cluster's second pool (a device class),
// which every node but the last has, each of its own size, so that the
// class FastClass is served by some nodes only; FastPoolMount is where the
// node's processes see it, and FastPoolLabel (="true") the Node label the
// chart's pool asks for, which the node's kubelet sets.
const (
	FastPool      = "fast"
	FastPoolMount = "/var/lib/podvol-fast"
	FastPoolLabel = "podvol.io/pool-fast"
	FastClass     = "podvol-fast"
)

// HasFastPool reports whether the node has the pool FastPool.
func (n *Node) HasFastPool() bool { return n.Index >= 1 && n.Index < len(n.c.Nodes) }

// FastPoolDir is the node's pool FastPool as the host sees it (empty on a
// node without one).
func (n *Node) FastPoolDir() string { return n.dir("pool-fast") }

// FastPoolSize is the size of the node's pool FastPool: 4 GiB on node 1,
// 2 GiB more on each next one.
func (n *Node) FastPoolSize() int64 { return int64(2+2*n.Index) << 30 }

// Pools are the node's pools by name, as the host sees them.
func (n *Node) Pools() map[string]string {
	p := map[string]string{"default": n.PoolDir()}
	if n.HasFastPool() {
		p[FastPool] = n.FastPoolDir()
	}
	return p
}

func (n *Node) podCIDR() string { return fmt.Sprintf("10.88.%d.0/24", n.Index) }

// dir is below the node's directory. Index 0 is the one node of the
// single-node layout of earlier podvol-dev versions, whose files are at the
// top of the cluster's directory: Down removes such a cluster too.
func (n *Node) dir(p ...string) string {
	if n.Index == 0 {
		return n.c.path(p...)
	}
	return n.c.path(append([]string{"nodes", strconv.Itoa(n.Index)}, p...)...)
}

func (n *Node) proc(name string) string {
	if n.Index == 0 {
		return name
	}
	return fmt.Sprintf("node%d-%s", n.Index, name)
}
func (n *Node) netNS() string      { return n.c.path("ns", strconv.Itoa(n.Index)+".net") }
func (n *Node) mntNS() string      { return n.c.path("ns", strconv.Itoa(n.Index)+".mnt") }
func (n *Node) utsNS() string      { return n.c.path("ns", strconv.Itoa(n.Index)+".uts") }
func (n *Node) veth() string       { return "pvn" + strconv.Itoa(n.Index) }
func (n *Node) cgroupRoot() string { return "/podvol-dev-" + strconv.Itoa(n.Index) }

// ContainerdSock is the node's containerd socket.
func (n *Node) ContainerdSock() string { return n.dir("run", "containerd.sock") }

// nodeBinds are the host paths a node's processes see as the node's own:
// the kubelet's root, the paths deploy/base mounts into podvol's plugin, and
// the paths containerd and the CNI plugins hard-code.
var nodeBinds = []struct{ host, sub string }{
	{"/var/lib/kubelet", "kubelet"},
	{"/var/lib/podvol", "pool"},
	{FastPoolMount, "pool-fast"},
	{"/run/kata-containers/shared/direct-volumes", "kata/direct-volumes"},
	{"/run/vc/sbs", "kata/sbs"},
	{"/var/log/pods", "pod-logs"},
	{"/var/lib/cni", "cni-state"},
	{"/run/containerd", "run-containerd"},
	{"/run/netns", "netns"},
}

// loadNodes reads the nodes of an existing cluster from its directory, or
// plans count new ones: node 1's pool is poolSize, each next one smaller,
// so that capacity decides placement.
func (c *Cluster) loadNodes(count int, poolSize int64) {
	if fileExists(c.path("pool.img")) {
		c.Nodes = append(c.Nodes, &Node{Index: 0, Name: "(single-node layout)", c: c})
		return
	}
	// The count planned first stands: a node whose making was cut short
	// is made on the next Up.
	if b, err := os.ReadFile(c.path("nodes", "count")); err == nil {
		if planned, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && planned > 0 {
			count = planned
		}
	}
	have := map[int]bool{}
	ents, _ := os.ReadDir(c.path("nodes"))
	for _, e := range ents {
		i, err := strconv.Atoi(e.Name())
		if err != nil || i < 1 {
			continue
		}
		n := &Node{Index: i, c: c}
		b, err := os.ReadFile(n.dir("name"))
		if err != nil {
			continue
		}
		n.Name = strings.TrimSpace(string(b))
		st, err := os.Stat(n.dir("pool.img"))
		if err != nil {
			continue
		}
		n.PoolSize = st.Size()
		have[i] = true
		c.Nodes = append(c.Nodes, n)
	}
	for i := 1; i <= count; i++ {
		if !have[i] {
			size := poolSize * int64(count+1-i) / int64(count) >> 30 << 30
			c.Nodes = append(c.Nodes, &Node{Index: i, Name: fmt.Sprintf("node-%d", i), PoolSize: max(size, 2<<30), c: c})
		}
	}
	sort.Slice(c.Nodes, func(i, j int) bool { return c.Nodes[i].Index < c.Nodes[j].Index })
}

// Node returns the node of that name, or nil.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// NodeNames are the names of the cluster's nodes.
func (c *Cluster) NodeNames() []string {
	var s []string
	for _, n := range c.Nodes {
		s = append(s, n.Name)
	}
	return s
}

// prepare makes the node's directory and pool (on the host).
func (n *Node) prepare(ctx context.Context) error {
	if n.Index == 0 {
		return fmt.Errorf("%s holds a dev cluster of the single-node layout of an earlier podvol-dev: remove it with `make down` first", n.c.Dir)
	}
	if err := os.MkdirAll(n.dir("run"), 0o755); err != nil {
		return err
	}
	if !fileExists(n.c.path("nodes", "count")) {
		if err := os.WriteFile(n.c.path("nodes", "count"), []byte(strconv.Itoa(len(n.c.Nodes))), 0o644); err != nil {
			return err
		}
	}
	for _, b := range nodeBinds {
		if err := os.MkdirAll(n.dir(b.sub), 0o755); err != nil {
			return err
		}
	}
	if err := n.preparePool(ctx, n.PoolDir(), n.dir("pool.img"), n.PoolSize); err != nil {
		return err
	}
	if n.HasFastPool() {
		if err := n.preparePool(ctx, n.FastPoolDir(), n.dir("pool-fast.img"), n.FastPoolSize()); err != nil {
			return err
		}
	}
	// Last: a node with a name has a pool (loadNodes).
	return os.WriteFile(n.dir("name"), []byte(n.Name), 0o644)
}

// preparePool makes a pool of the node, mounted at mnt, an XFS filesystem
// (reflink: snapshots and clones in constant time) on a loop-attached
// sparse image of size bytes.
func (n *Node) preparePool(ctx context.Context, mnt, img string, size int64) error {
	if m, _ := device.MountedAt(mnt); m != nil {
		return nil
	}
	if !fileExists(img) {
		// Made under another name and renamed once formatted: an image
		// by this name always holds a filesystem.
		tmp := img + ".new"
		f, err := os.Create(tmp)
		if err != nil {
			return err
		}
		err = f.Truncate(size)
		f.Close()
		if err != nil {
			return err
		}
		if _, err := n.c.run(ctx, "mkfs.xfs", "-q", "-f", "-m", "reflink=1", tmp); err != nil {
			return err
		}
		if err := os.Rename(tmp, img); err != nil {
			return err
		}
	}
	devs, err := device.LoopsFor(img)
	if err != nil {
		return err
	}
	dev := ""
	if len(devs) > 0 {
		dev = devs[0]
	} else if dev, err = device.AttachLoop(img, device.LoopOptions{DirectIO: true}); err != nil {
		// The pool stands for a node's disk: with direct I/O the host's
		// page cache holds none of it, as it would hold none of a disk's
		// data beyond what the node's filesystems cache.
		return fmt.Errorf("node %s: attach the pool image: %w", n.Name, err)
	}
	if err := device.Mount(ctx, dev, mnt, "xfs", nil); err != nil {
		return fmt.Errorf("node %s: mount the pool: %w", n.Name, err)
	}
	n.c.p.note("node %s: pool %s (%d GiB, XFS with reflink) at %s", n.Name, dev, size>>30, mnt)
	return nil
}

// privateNSDir makes the directory holding the namespaces' files a private
// mount: a namespace file can only be bound where mounts do not propagate.
func (c *Cluster) privateNSDir(ctx context.Context) error {
	d := c.path("ns")
	if m, _ := device.MountedAt(d); m != nil {
		return nil
	}
	if err := os.MkdirAll(d, 0o755); err != nil {
		return err
	}
	if err := device.Mount(ctx, d, d, "", []string{"bind"}); err != nil {
		return err
	}
	_, err := c.run(ctx, "mount", "--make-private", d)
	return err
}

// namespaces makes the node's network and mount namespaces, once.
func (n *Node) namespaces(ctx context.Context) error {
	c := n.c
	ready := n.dir("namespaces-ready")
	if fileExists(ready) {
		return nil
	}
	if _, ok := c.running(n.proc("containerd")); ok {
		// Made by a podvol-dev that wrote no mark, and in use.
		return os.WriteFile(ready, nil, 0o644)
	}
	// Whatever a cut-short attempt made goes first.
	for _, f := range []string{n.netNS(), n.mntNS(), n.utsNS()} {
		if m, _ := device.MountedAt(f); m != nil {
			if err := syscall.Unmount(f, syscall.MNT_DETACH); err != nil {
				return fmt.Errorf("node %s: remove the namespace of an earlier attempt %s: %w", n.Name, f, err)
			}
		}
	}
	if err := n.removeNetwork(); err != nil {
		return err
	}
	for _, f := range []string{n.netNS(), n.mntNS(), n.utsNS()} {
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			return err
		}
	}
	// The mount namespace starts as a copy of the host's, with every mount
	// private: nothing the node mounts reaches the host or another node.
	// Its own hostname too: host-network pods (external-resizer's leader
	// election identity, for one) tell nodes apart by it.
	if _, err := c.run(ctx, "unshare", "--net="+n.netNS(), "--mount="+n.mntNS(), "--uts="+n.utsNS(), "--propagation", "private", "true"); err != nil {
		return fmt.Errorf("node %s: namespaces: %w", n.Name, err)
	}
	in := func(args ...string) error {
		_, err := c.run(ctx, "nsenter", append(n.enter(), args...)...)
		return err
	}
	// The node's end of the link is made inside its namespace and the other
	// end sent to this process's (the host's) namespace.
	steps := [][]string{
		{"ip", "link", "add", "eth0", "type", "veth", "peer", "name", n.veth(), "netns", strconv.Itoa(os.Getpid())},
		{"hostname", n.Name},
		{"ip", "link", "set", "lo", "up"},
		{"ip", "addr", "add", n.IP() + "/24", "dev", "eth0"},
		{"ip", "link", "set", "eth0", "up"},
		{"ip", "route", "add", "default", "via", hostGateway},
		{"sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"},
	}
	// Each other node's pods straight through that node, across the
	// bridge, as a real network routes them: the host does not forward
	// (its ip_forward is left as it is), so a reply from this node to a
	// pod elsewhere (Prometheus scraping this node's plugin) must not go
	// through it.
	for _, o := range c.Nodes {
		if o.Index != n.Index {
			steps = append(steps, []string{"ip", "route", "replace", o.podCIDR(), "via", o.IP()})
		}
	}
	for _, b := range nodeBinds {
		if err := os.MkdirAll(b.host, 0o755); err != nil {
			return err
		}
		steps = append(steps, []string{"mount", "--bind", n.dir(b.sub), b.host})
	}
	// Bidirectional mount propagation (the CSI plugin's mounts reaching the
	// kubelet and pods) needs a shared kubelet root.
	steps = append(steps, []string{"mount", "--make-rshared", "/var/lib/kubelet"},
		// The copies of other nodes' namespace files would keep those alive.
		[]string{"umount", "-l", c.path("ns")})
	// Nor does a node see the other nodes' pools.
	for _, o := range c.Nodes {
		if o != n {
			for _, dir := range o.Pools() {
				steps = append(steps, []string{"sh", "-c", `if mountpoint -q "$0"; then umount -l "$0"; fi`, dir})
			}
		}
	}
	for _, s := range steps {
		if err := in(s...); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	// The copy holds whatever else the host had mounted from a loop device
	// at this moment, other tests' volumes among them (make test runs the
	// host's tests beside the cluster's): a private copy never sees their
	// unmount, keeps their filesystems alive, and their loop devices could
	// not detach until the node went.
	mounts, err := c.run(ctx, "nsenter", append(n.enter(), "cat", "/proc/self/mountinfo")...)
	if err != nil {
		return fmt.Errorf("node %s: its mounts: %w", n.Name, err)
	}
	for _, m := range loopMountsBut(mounts, slices.Collect(maps.Values(n.Pools()))...) {
		// One above it may have taken it along already.
		_ = in("umount", "-l", m)
	}
	if err := ipCmd("link", "set", n.veth(), "master", bridge, "up"); err != nil {
		return err
	}
	if err := ipCmd("route", "replace", n.podCIDR(), "via", n.IP()); err != nil {
		return err
	}
	if err := n.cgroups(); err != nil {
		return err
	}
	return os.WriteFile(ready, nil, 0o644)
}

// cgroupDirs are the node's cgroup directories, one per cgroup v1
// hierarchy, or the one of the unified hierarchy.
func (n *Node) cgroupDirs() []string {
	if fileExists("/sys/fs/cgroup/cgroup.controllers") {
		return []string{"/sys/fs/cgroup" + n.cgroupRoot()}
	}
	var dirs []string
	ents, _ := os.ReadDir("/sys/fs/cgroup")
	for _, e := range ents {
		h := filepath.Join("/sys/fs/cgroup", e.Name())
		if fileExists(filepath.Join(h, "cgroup.procs")) {
			dirs = append(dirs, h+n.cgroupRoot())
		}
	}
	return dirs
}

// cgroups makes the node's cgroup subtree: each kubelet manages its own
// kubepods below its own root and takes the others' for nothing.
func (n *Node) cgroups() error {
	for _, d := range n.cgroupDirs() {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("node %s: cgroup %s: %w", n.Name, d, err)
		}
	}
	// A new cpuset cgroup (v1) has no CPUs and no memory nodes to run on.
	const cpuset = "/sys/fs/cgroup/cpuset"
	if fileExists(cpuset + n.cgroupRoot()) {
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if b, err := os.ReadFile(cpuset + "/" + f); err == nil {
				// The path is cgroupfs's and the node's index, no input.
				if err := os.WriteFile(cpuset+n.cgroupRoot()+"/"+f, b, 0o644); err != nil { //nolint:gosec // G703: see above

					return fmt.Errorf("node %s: %w", n.Name, err)
				}
			}
		}
	}
	return nil
}

// removeCgroups removes the node's cgroup subtree, deepest first. A
// process still in it (a container whose containerd was gone, so that
// nothing stopped it) is killed by its PID first: it would hold the node's
// namespaces and cgroups.
func (n *Node) removeCgroups() error {
	var errs []error
	for _, root := range n.cgroupDirs() {
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for _, d := range dirs {
			b, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
					n.c.p.note("node %s: killing pid %d, left in cgroup %s", n.Name, pid, d)
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
		for _, d := range dirs {
			var err error
			for try := 0; try < 50; try++ {
				if err = syscall.Rmdir(d); err == nil || errors.Is(err, syscall.ENOENT) {
					err = nil
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
			}
		}
	}
	return errors.Join(errs...)
}

// start starts a component of the node inside its namespaces.
func (n *Node) start(name, bin string, args ...string) error {
	return n.c.startProcess(n.proc(name), nil, "/usr/bin/nsenter", append(n.enter(), append([]string{bin}, args...)...)...)
}

// enter is nsenter's arguments to run a command in the node's namespaces.
func (n *Node) enter() []string {
	return []string{"--net=" + n.netNS(), "--mount=" + n.mntNS(), "--uts=" + n.utsNS(), "--"}
}

func (n *Node) startContainerd(ctx context.Context) error {
	c := n.c
	cni := fmt.Sprintf(`{"cniVersion": "0.4.0", "name": "podvol-dev", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "isDefaultGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "dataDir": %q}},
  {"type": "loopback"}]}`, n.podCIDR(), n.dir("cni", "ipam"))
	if err := os.MkdirAll(n.dir("cni"), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(n.dir("cni", "10-podvol-dev.conflist"), []byte(cni), 0o644); err != nil {
		return err
	}
	conf := fmt.Sprintf(`version = 2
root = %q
state = %q
[grpc]
  address = %q
[ttrpc]
  address = %q
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/pause:podvol"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true
  # Root here may lack CAP_SYS_RESOURCE: a negative oom_score_adj makes runc fail.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = %q
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %q
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = ""
`, n.dir("containerd", "root"), n.dir("containerd", "state"), n.ContainerdSock(), n.dir("run", "containerd-ttrpc.sock"), n.dir("containerd", "runc"), n.dir("cni"))
	if err := os.WriteFile(n.dir("containerd.toml"), []byte(conf), 0o644); err != nil {
		return err
	}
	containerd, _ := exec.LookPath("containerd")
	if err := n.start("containerd", containerd, "--config", n.dir("containerd.toml")); err != nil {
		return err
	}
	if err := waitFor("node "+n.Name+": containerd (logs/"+n.proc("containerd")+".log)", time.Minute, func() error {
		_, err := c.run(ctx, "ctr", "-a", n.ContainerdSock(), "version")
		return err
	}); err != nil {
		return err
	}
	ents, err := os.ReadDir(c.path("images"))
	if err != nil {
		return err
	}
	for _, e := range ents {
		if _, err := c.run(ctx, "ctr", "-a", n.ContainerdSock(), "-n", "k8s.io", "images", "import", "--no-unpack", c.path("images", e.Name())); err != nil {
			return fmt.Errorf("node %s: import %s: %w", n.Name, e.Name(), err)
		}
	}
	return nil
}

func (n *Node) startKubelet() error {
	c := n.c
	p := pki{dir: c.path("pki")}
	cert, err := p.kubelet(n.Name, n.IP())
	if err != nil {
		return err
	}
	// The node reaches the API server as its pods do: at the kubernetes
	// Service's address, which the host translates to the loopback listener.
	if err := p.kubeconfigFor(n.dir("kubelet.kubeconfig"), cert, "https://"+apiServiceIP+":443"); err != nil {
		return err
	}
	pk := c.path("pki")
	conf := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %s
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
failCgroupV1: false
failSwapOn: false
cgroupDriver: cgroupfs
cgroupRoot: %s
containerRuntimeEndpoint: unix://%s
tlsCertFile: %s/%s.crt
tlsPrivateKeyFile: %s/%s.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %s/ca.crt}
authorization: {mode: Webhook}
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
evictionHard: {memory.available: "100Mi", nodefs.available: "1%%", imagefs.available: "1%%", nodefs.inodesFree: "1%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
# Volume stats every 10 s rather than every minute: tests read them.
volumeStatsAggPeriod: 10s
`, n.IP(), n.cgroupRoot(), n.ContainerdSock(), pk, cert, pk, cert, pk)
	if err := os.WriteFile(n.dir("kubelet-config.yaml"), []byte(conf), 0o644); err != nil {
		return err
	}
	args := []string{"--config=" + n.dir("kubelet-config.yaml"), "--kubeconfig=" + n.dir("kubelet.kubeconfig"),
		"--hostname-override=" + n.Name, "--node-ip=" + n.IP(), "--v=2"}
	if n.HasFastPool() {
		// The label the chart's pool fast asks a node for.
		args = append(args, "--node-labels="+FastPoolLabel+"=true")
	}
	return n.start("kubelet", c.bins["kubelet"], args...)
}

// waitReady waits until the node's kubelet has registered it Ready.
func (n *Node) waitReady(ctx context.Context) error {
	return waitFor("node "+n.Name+" Ready (logs/"+n.proc("kubelet")+".log)", 3*time.Minute, func() error {
		out, err := n.c.kubectl(ctx, "get", "node", n.Name, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		if err != nil {
			return err
		}
		if strings.TrimSpace(out) != "True" {
			return errNotYet
		}
		return nil
	})
}

// up starts the node: namespaces, containerd with the images, kubelet.
func (n *Node) up(ctx context.Context) error {
	if err := n.namespaces(ctx); err != nil {
		return err
	}
	if err := n.startContainerd(ctx); err != nil {
		return err
	}
	return n.startKubelet()
}

// stop stops the node's kubelet, kills its pods' containers and stops its
// containerd, as a node does when it loses power (its disk stays).
func (n *Node) stop(ctx context.Context) error {
	errs := []error{n.c.stopProcess(n.proc("kubelet"), 30*time.Second)}
	if _, ok := n.c.running(n.proc("containerd")); ok {
		n.removeContainers(ctx)
	}
	errs = append(errs, n.c.stopProcess(n.proc("containerd"), 30*time.Second))
	n.killShims()
	return errors.Join(errs...)
}

func (n *Node) removeContainers(ctx context.Context) {
	ctr := func(args ...string) string {
		out, _ := exec.CommandContext(ctx, "ctr", append([]string{"-a", n.ContainerdSock(), "-n", "k8s.io"}, args...)...).Output()
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

// killShims stops containerd shims that serve this node's containerd (its
// socket path is in their command line), by PID.
func (n *Node) killShims() {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(b), n.ContainerdSock()) || !strings.Contains(string(b), "containerd-shim") {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			n.c.p.note("node %s: killed shim pid %d", n.Name, pid)
		}
	}
}

// removeNetwork removes the host's end of the node's link (the node's end
// goes with it) and the route to its pods.
func (n *Node) removeNetwork() error {
	_ = exec.Command("ip", "route", "del", n.podCIDR()).Run()
	if exec.Command("ip", "link", "show", n.veth()).Run() != nil {
		return nil
	}
	err := ipCmd("link", "del", n.veth())
	// The link also goes by itself when the node's network namespace
	// ends, which may happen between the two commands.
	if err != nil && exec.Command("ip", "link", "show", n.veth()).Run() != nil {
		return nil
	}
	return err
}

// Fetch GETs url from inside the node's network namespace, where its
// host-network pods listen on the node's own loopback (podvol's metrics).
func (n *Node) Fetch(ctx context.Context, url string) (string, error) {
	return n.c.run(ctx, "nsenter", "--net="+n.netNS(), "--", "busybox", "wget", "-q", "-O", "-", url)
}

// loopMountsBut lists the mount points in mountinfo (the format of
// /proc/self/mountinfo) whose source is a loop device, but the root and
// the mounts of the devices mounted at keep (the pools, and their bind
// mounts at the paths deploy/base names), outermost first.
func loopMountsBut(mountinfo string, keep ...string) []string {
	type mount struct{ point, source string }
	var loops []mount
	keepSources := map[string]bool{}
	for _, l := range strings.Split(mountinfo, "\n") {
		pre, post, ok := strings.Cut(l, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 2 || !strings.HasPrefix(g[1], "/dev/loop") {
			continue
		}
		// Spaces and the like come octal-escaped (\040).
		m := mount{unescapeMountinfo(f[4]), g[1]}
		if slices.Contains(keep, m.point) {
			keepSources[m.source] = true
		}
		loops = append(loops, m)
	}
	// above reports whether point holds a kept mount point below it.
	above := func(point string) bool {
		for _, k := range keep {
			if strings.HasPrefix(k, strings.TrimSuffix(point, "/")+"/") {
				return true
			}
		}
		return false
	}
	// Nor the filesystem a kept mount is on (the cluster's directory on a
	// loop device: the node's binds of it share its source), nor a mount
	// above one, which would take it along.
	for _, k := range keep {
		holder, holderSource := "", ""
		for _, m := range loops {
			if strings.HasPrefix(k, strings.TrimSuffix(m.point, "/")+"/") && len(m.point) > len(holder) {
				holder, holderSource = m.point, m.source
			}
		}
		if holder != "" {
			keepSources[holderSource] = true
		}
	}
	var out []string
	for _, m := range loops {
		if m.point == "/" || keepSources[m.source] || above(m.point) {
			continue
		}
		out = append(out, m.point)
	}
	return out
}

func unescapeMountinfo(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
