// Package devcluster runs a real Kubernetes of several nodes with podvol
// deployed on this machine: the target of `make demo` and of the end-to-end tests.
// Kubernetes, etcd and the CSI sidecars are built from Go modules (cached by
// version outside the repository); containerd, runc and the CNI plugins come
// from Debian; images are built as OCI archives and imported, since no
// registry is reachable. Everything listens on 127.0.0.1 and lives under one
// directory, and Down leaves the machine as it was.
package devcluster

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/podvol/podvol/internal/images"
	"github.com/podvol/podvol/internal/ociimage"
	"github.com/podvol/podvol/internal/versions"
)

// ConformancePoolSize is the first node's pool the conformance suite's six
// runs at once need (test/conformance): up to ~18 volumes and snapshots of
// 1 GiB at a time, and retained snapshots. make test's e2e run brings the
// cluster up with it, as conformance runs next on the same cluster.
const ConformancePoolSize = 60 << 30

// Config says where and how big.
type Config struct {
	// Dir holds every file the cluster makes.
	Dir string
	// Repo is the podvol source tree (deploy/, tools/).
	Repo string
	// Nodes is how many nodes a new cluster has (see Node); a cluster that
	// exists keeps the nodes it has.
	Nodes int
	// PoolSize is the size of the XFS image backing the first node's pool;
	// each next node's is smaller.
	PoolSize int64
	// NodeLossGrace, when set, replaces the chart's default
	// --node-loss-grace-period (a value; a patch of the kustomize overlay),
	// as an admin would:
	// the e2e run waits out a lost node's grace (5 minutes by default).
	NodeLossGrace time.Duration
	// Kustomize deploys podvol with kustomize (deploy/base under an
	// overlay) instead of installing the Helm chart.
	Kustomize bool
	Out       io.Writer
}

// Cluster is one dev cluster.
type Cluster struct {
	Config
	// Nodes are the cluster's nodes, by index.
	Nodes []*Node
	p     *progress
	bins  map[string]string
	// podvolTag tags podvol's images after their binaries' content, so
	// that deploying a changed podvol rolls its pods out.
	podvolTag string
	// children are the components this process started: only those are
	// reaped here, by their own handle.
	children map[int]*os.Process
	metrics  metricsToken
}

const (
	bridge = "podvol0"
)

// DefaultDir is where the cluster lives unless PODVOL_DEV_DIR says otherwise.
func DefaultDir() string {
	if d := os.Getenv("PODVOL_DEV_DIR"); d != "" {
		return d
	}
	return "/var/lib/podvol-dev"
}

// RepoRoot finds the podvol source tree from this file's location.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// New returns a Cluster with defaults filled in.
func New(c Config) *Cluster {
	if c.Dir == "" {
		c.Dir = DefaultDir()
	}
	if c.Repo == "" {
		c.Repo = RepoRoot()
	}
	if c.Nodes == 0 {
		c.Nodes = DefaultNodes
	}
	if c.PoolSize == 0 {
		c.PoolSize = 20 << 30
	}
	if c.Out == nil {
		c.Out = os.Stdout
	}
	cl := &Cluster{Config: c, p: &progress{out: c.Out, start: time.Now()}}
	cl.loadNodes(c.Nodes, c.PoolSize)
	return cl
}

// DefaultNodes is how many nodes a new cluster has unless told otherwise.
const DefaultNodes = 3

// Kubeconfig is the admin kubeconfig of the cluster.
func (c *Cluster) Kubeconfig() string { return filepath.Join(c.Dir, "admin.kubeconfig") }

// Kubectl is the path of the kubectl binary the cluster uses.
func (c *Cluster) Kubectl() string { return c.bins["kubectl"] }

// KubectlPodvol runs `kubectl podvol args...` as an admin would: kubectl
// finds the plugin, the kubectl-podvol built from this tree, on the PATH. It
// returns the standard output and error apart (-o json is parsed from the
// first).
func (c *Cluster) KubectlPodvol(ctx context.Context, stdin io.Reader, args ...string) (stdout, stderr string, err error) {
	// kubectl finds a plugin only by the words before the first flag, so
	// the kubeconfig goes in the environment.
	cmd := exec.CommandContext(ctx, c.bins["kubectl"], append([]string{"podvol"}, args...)...)
	cmd.Dir = c.Repo
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.Kubeconfig(),
		"PATH="+c.KubectlPodvolDir()+string(os.PathListSeparator)+os.Getenv("PATH"))
	cmd.Stdin = stdin
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), errb.String(), fmt.Errorf("kubectl podvol %s: %w\n%s", strings.Join(args, " "), err, errb.String())
	}
	return out.String(), errb.String(), nil
}

// KubectlPodvolDir is the directory of the kubectl-podvol the cluster built:
// on the PATH, kubectl runs it for `kubectl podvol`.
func (c *Cluster) KubectlPodvolDir() string { return filepath.Dir(c.bins["kubectl-podvol"]) }

// Kubelet GETs path from the node's kubelet API (e.g. /stats/summary) as
// the cluster's admin.
func (n *Node) Kubelet(ctx context.Context, path string) ([]byte, error) {
	pk := n.c.path("pki")
	cert, err := tls.LoadX509KeyPair(filepath.Join(pk, "admin.crt"), filepath.Join(pk, "admin.key"))
	if err != nil {
		return nil, err
	}
	ca, err := os.ReadFile(filepath.Join(pk, "ca.crt"))
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca)
	cl := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: roots}}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+n.IP()+":10250"+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := cl.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("kubelet %s: %s: %s", path, resp.Status, b)
	}
	return b, err
}

// Running reports whether the cluster's API server runs.
func (c *Cluster) Running() bool {
	_, ok := c.running("kube-apiserver")
	return ok
}

func (c *Cluster) path(p ...string) string { return filepath.Join(append([]string{c.Dir}, p...)...) }

// Up builds what is missing, starts every component, deploys podvol and
// waits until it serves. Running it again on a running cluster re-deploys
// podvol and changes nothing else.
func (c *Cluster) Up(ctx context.Context) error {
	c.p.begin(10)
	c.p.next("checking the machine")
	if err := c.checkHost(); err != nil {
		return err
	}
	for _, d := range []string{"run", "logs", "images", "deploy"} {
		if err := os.MkdirAll(c.path(d), 0o755); err != nil {
			return err
		}
	}
	if err := c.recordHostPaths(); err != nil {
		return err
	}
	c.p.next("building binaries (cached by version; a cold build of Kubernetes and the sidecars takes ~20 minutes on 2 cores)")
	if err := c.buildBinaries(ctx); err != nil {
		return err
	}
	c.p.next("building images")
	if err := c.buildImages(ctx); err != nil {
		return err
	}
	c.p.next("preparing certificates and the XFS pools of %d nodes", len(c.Nodes))
	if err := c.preparePKI(); err != nil {
		return err
	}
	for _, n := range c.Nodes {
		if err := n.prepare(ctx); err != nil {
			return err
		}
	}
	c.p.next("starting etcd and kube-apiserver")
	if err := c.startControlPlane(); err != nil {
		return err
	}
	c.p.next("starting kube-controller-manager and kube-scheduler")
	if err := c.startControllers(); err != nil {
		return err
	}
	c.p.next("starting %d nodes: namespaces, containerd with the images, kubelet", len(c.Nodes))
	if err := c.serviceNet(); err != nil {
		return err
	}
	if err := c.privateNSDir(ctx); err != nil {
		return err
	}
	for _, n := range c.Nodes {
		if err := n.up(ctx); err != nil {
			return err
		}
		c.p.note("node %s: %s, pods %s, pool %d GiB", n.Name, n.IP(), n.podCIDR(), n.PoolSize>>30)
	}
	c.p.next("waiting for the nodes to be Ready")
	for _, n := range c.Nodes {
		if err := n.waitReady(ctx); err != nil {
			return err
		}
	}
	c.p.next("deploying podvol")
	if err := c.deploy(ctx); err != nil {
		return err
	}
	fmt.Fprintf(c.Out, "\nThe cluster is up (%s). Point kubectl at it with:\n    export KUBECONFIG=%s\n    export PATH=%s:$PATH\nTear it down with: make down\n",
		time.Since(c.p.start).Round(time.Second), c.Kubeconfig(), filepath.Dir(c.Kubectl()))
	return nil
}

func (c *Cluster) checkHost() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("the dev cluster runs a kubelet, containerd and loop devices: run it as root")
	}
	var missing []string
	for _, b := range []string{"containerd", "containerd-shim-runc-v2", "runc", "ctr", "busybox", "mkfs.xfs", "ip", "iptables", "unshare", "nsenter"} {
		if _, err := exec.LookPath(b); err != nil {
			missing = append(missing, b)
		}
	}
	for _, p := range []string{"/usr/lib/cni/bridge", "/usr/lib/cni/host-local", "/usr/lib/cni/loopback"} {
		if _, err := os.Stat(p); err != nil {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing on this machine: %s. Install them with: apt-get install containerd runc containernetworking-plugins busybox-static xfsprogs iproute2 (make deps does)", strings.Join(missing, ", "))
	}
	return nil
}

func (c *Cluster) run(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = c.Repo
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// Attach readies c to work on a cluster that runs already, as it is
// (RunKubectl, the nodes): it finds the binaries Up would use (built and
// cached by then) and deploys nothing.
func (c *Cluster) Attach(ctx context.Context) error {
	if !c.Running() {
		return fmt.Errorf("the dev cluster in %s is not running: bring it up first (make up)", c.Dir)
	}
	return c.buildBinaries(ctx)
}

// buildBinaries builds the Kubernetes binaries and the sidecars (cached) and
// podvol's own.
func (c *Cluster) buildBinaries(ctx context.Context) error {
	c.bins = map[string]string{}
	for _, script := range []string{"tools/k8s/build.sh", "tools/sidecars/build.sh"} {
		cmd := exec.CommandContext(ctx, filepath.Join(c.Repo, script))
		cmd.Stderr = c.Out // the scripts report their progress
		out, err := cmd.Output()
		if err != nil {
			return fmt.Errorf("%s failed: %w (its output above says where)", script, err)
		}
		dir := strings.TrimSpace(string(out))
		ents, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		for _, e := range ents {
			name := e.Name()
			if strings.HasPrefix(name, ".") {
				continue
			}
			// Sidecars are cached as <name>-<version>.
			if v, ok := sidecarImages[strings.TrimSuffix(name, name[max(strings.LastIndex(name, "-v"), 0):])]; ok && strings.HasSuffix(name, "-"+v) {
				name = strings.TrimSuffix(name, "-"+v)
			}
			c.bins[name] = filepath.Join(dir, e.Name())
		}
	}
	bin := c.path("bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return err
	}
	// pause, and kubectl podvol for the demo and the tests (not in an
	// image: it runs on the machine, as an admin's would).
	for name, pkg := range map[string]string{"pause": "./internal/devcluster/pause", "kubectl-podvol": "./cmd/kubectl-podvol"} {
		c.p.note("building %s", name)
		cmd := exec.CommandContext(ctx, "go", "build", "-ldflags", "-s -w -X main.version=dev", "-o", filepath.Join(bin, name), pkg)
		cmd.Dir = c.Repo
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s: %w\n%s", pkg, err, out)
		}
		c.bins[name] = filepath.Join(bin, name)
	}
	// podvol's binaries as `make images` compiles them (internal/images).
	b, err := c.imageBuild()
	if err != nil {
		return err
	}
	podvol, err := b.CompileBinaries(ctx, c.Repo, runtime.GOARCH, bin)
	if err != nil {
		return err
	}
	for name, p := range podvol {
		c.bins[name] = p
	}
	return nil
}

// Images the cluster runs, by the name the deploy overlay uses.
var sidecarImages = versions.Sidecars

// imageBuild is how the dev cluster builds podvol's images: as `make
// images` does, with the version "dev".
func (c *Cluster) imageBuild() (images.Build, error) {
	b, err := images.ForRepo(c.Repo, "dev")
	if err != nil {
		return b, err
	}
	b.Logf = c.p.note
	return b, nil
}

// writePodvolImages writes podvol's two images of this machine's
// architecture, built from bins as `make images` builds them (the plugin's
// programs from Debian packages), to dir as <name>.oci.tar, tagged
// prefix-<their content's hash>: deploying a changed podvol rolls its pods
// out. It returns the tag and the archives.
func (c *Cluster) writePodvolImages(ctx context.Context, b images.Build, bins map[string]string, prefix, dir string) (string, []string, error) {
	tools, err := images.PluginTools(ctx, runtime.GOARCH, images.DefaultCache, c.p.note)
	if err != nil {
		return "", nil, fmt.Errorf("the plugin image: %w", err)
	}
	podvol := map[string]ociimage.Image{
		images.Plugin:     b.PluginImage(runtime.GOARCH, bins, tools),
		images.Controller: b.ControllerImage(runtime.GOARCH, bins[images.Controller]),
	}
	h := sha256.New()
	for _, name := range []string{images.Plugin, images.Controller} {
		layer, err := podvol[name].Layer()
		if err != nil {
			return "", nil, fmt.Errorf("image %s: %w", name, err)
		}
		h.Write(layer)
	}
	tag := fmt.Sprintf("%s-%x", prefix, h.Sum(nil)[:6])
	var archives []string
	for _, name := range []string{images.Plugin, images.Controller} {
		ref := "localhost/" + name + ":" + tag
		archive := filepath.Join(dir, name+".oci.tar")
		if _, err := ociimage.WriteArchive(archive, ref, b.Labels(name), podvol[name]); err != nil {
			return "", nil, fmt.Errorf("image %s: %w", ref, err)
		}
		archives = append(archives, archive)
	}
	return tag, archives, nil
}

func (c *Cluster) buildImages(ctx context.Context) error {
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		return err
	}
	applets, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		return fmt.Errorf("busybox --list: %w", err)
	}
	bb := []ociimage.File{
		{Path: "/bin/busybox", From: busybox, Mode: 0o755},
		{Path: "/etc/passwd", Data: []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n")},
		{Path: "/etc/group", Data: []byte("root:x:0:\nnogroup:x:65534:\n")},
		{Path: "/tmp", Dir: true},
	}
	for _, a := range strings.Fields(string(applets)) {
		if a != "busybox" {
			bb = append(bb, ociimage.File{Path: "/bin/" + a, Link: "busybox"})
		}
	}
	imgs := []image{
		{ref: "localhost/pause:podvol", entrypoint: []string{"/pause"}, files: []ociimage.File{{Path: "/pause", From: c.bins["pause"], Mode: 0o755}}},
		{ref: "localhost/busybox:podvol", entrypoint: []string{"/bin/sh"}, files: bb},
	}
	for name, version := range sidecarImages {
		imgs = append(imgs, image{ref: "localhost/" + name + ":" + version, entrypoint: []string{"/" + name}, files: []ociimage.File{{Path: "/" + name, From: c.bins[name], Mode: 0o755}}})
	}
	for _, img := range imgs {
		name := strings.NewReplacer("localhost/", "", ":", "_").Replace(img.ref)
		if err := img.write(c.path("images", name+".oci.tar")); err != nil {
			return fmt.Errorf("image %s: %w", img.ref, err)
		}
	}
	b, err := c.imageBuild()
	if err != nil {
		return err
	}
	if c.podvolTag, _, err = c.writePodvolImages(ctx, b, c.bins, "dev", c.path("images")); err != nil {
		return err
	}
	c.p.note("%d images in %s", len(imgs)+2, c.path("images"))
	return nil
}

func (c *Cluster) preparePKI() error {
	p := pki{dir: c.path("pki")}
	if err := p.ensure(); err != nil {
		return fmt.Errorf("certificates: %w", err)
	}
	return p.kubeconfig(c.Kubeconfig(), "admin")
}
