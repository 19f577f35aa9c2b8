package devcluster

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/podvol/podvol/internal/device"
)

// featureGates: CrossNamespaceVolumeDataSource is alpha in 1.37, and without
// it the API server silently drops a dataSourceRef's namespace.
const featureGates = "CrossNamespaceVolumeDataSource=true"

func httpOK(url string) error {
	cl := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := cl.Get(url)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return nil
}

func (c *Cluster) startControlPlane() error {
	err := c.startProcess("etcd", nil, c.bins["etcd"], "--name", "podvol-dev", "--data-dir", c.path("etcd"),
		"--listen-client-urls", "http://127.0.0.1:2379", "--advertise-client-urls", "http://127.0.0.1:2379",
		"--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", "podvol-dev=http://127.0.0.1:2380", "--listen-metrics-urls", "http://127.0.0.1:2381")
	if err != nil {
		return err
	}
	if err := waitFor("etcd (logs/etcd.log)", time.Minute, func() error { return httpOK("http://127.0.0.1:2379/health") }); err != nil {
		return err
	}
	pk := c.path("pki")
	err = c.startProcess("kube-apiserver", nil, c.bins["kube-apiserver"],
		"--etcd-servers=http://127.0.0.1:2379", "--bind-address=127.0.0.1", "--secure-port=6443", "--advertise-address=127.0.0.1",
		// The default reconciler keeps failing on a loopback advertise address.
		"--endpoint-reconciler-type=none",
		"--tls-cert-file="+pk+"/apiserver.crt", "--tls-private-key-file="+pk+"/apiserver.key", "--client-ca-file="+pk+"/ca.crt",
		"--service-account-key-file="+pk+"/sa.pub", "--service-account-signing-key-file="+pk+"/sa.key",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range="+serviceCIDR, "--authorization-mode=Node,RBAC", "--allow-privileged=true",
		"--kubelet-client-certificate="+pk+"/admin.crt", "--kubelet-client-key="+pk+"/admin.key",
		// The node is "localhost": the API server reaches the kubelet by name.
		"--kubelet-preferred-address-types=Hostname",
		"--feature-gates="+featureGates, "--cert-dir="+c.path("apiserver-certs"))
	if err != nil {
		return err
	}
	return waitFor("kube-apiserver (logs/kube-apiserver.log)", 2*time.Minute, func() error { return httpOK("https://127.0.0.1:6443/readyz") })
}

func (c *Cluster) startControllers() error {
	k, pk := c.Kubeconfig(), c.path("pki")
	err := c.startProcess("kube-controller-manager", nil, c.bins["kube-controller-manager"],
		"--kubeconfig="+k, "--authentication-kubeconfig="+k, "--authorization-kubeconfig="+k,
		"--bind-address=127.0.0.1", "--secure-port=10257", "--leader-elect=false",
		"--cluster-signing-cert-file="+pk+"/ca.crt", "--cluster-signing-key-file="+pk+"/ca.key", "--root-ca-file="+pk+"/ca.crt",
		"--service-account-private-key-file="+pk+"/sa.key", "--use-service-account-credentials=true",
		// podvol-controller's ephemeral volume controller takes over.
		"--controllers=*,-ephemeral-volume-controller",
		// A lost node (ReplaceNode) is noticed in seconds, not a minute.
		"--node-monitor-grace-period=20s",
		"--feature-gates="+featureGates, "--cert-dir="+c.path("kcm-certs"))
	if err != nil {
		return err
	}
	return c.startProcess("kube-scheduler", nil, c.bins["kube-scheduler"],
		"--kubeconfig="+k, "--authentication-kubeconfig="+k, "--authorization-kubeconfig="+k,
		"--bind-address=127.0.0.1", "--secure-port=10259", "--leader-elect=false")
}

func (c *Cluster) containerdSock() string { return c.path("run", "containerd.sock") }

func (c *Cluster) startContainerd(ctx context.Context) error {
	cni := fmt.Sprintf(`{"cniVersion": "0.4.0", "name": "podvol-dev", "plugins": [
  {"type": "bridge", "bridge": %q, "isGateway": true, "isDefaultGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "dataDir": %q}},
  {"type": "loopback"}]}`, bridge, podCIDR, c.path("cni", "ipam"))
	if err := os.WriteFile(c.path("cni", "10-podvol-dev.conflist"), []byte(cni), 0o644); err != nil {
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
`, c.path("containerd", "root"), c.path("containerd", "state"), c.containerdSock(), c.path("run", "containerd-ttrpc.sock"), c.path("containerd", "runc"), c.path("cni"))
	if err := os.WriteFile(c.path("containerd.toml"), []byte(conf), 0o644); err != nil {
		return err
	}
	containerd, _ := exec.LookPath("containerd")
	if err := c.startProcess("containerd", nil, containerd, "--config", c.path("containerd.toml")); err != nil {
		return err
	}
	if err := waitFor("containerd (logs/containerd.log)", time.Minute, func() error {
		_, err := c.run(ctx, "ctr", "-a", c.containerdSock(), "version")
		return err
	}); err != nil {
		return err
	}
	ents, err := os.ReadDir(c.path("images"))
	if err != nil {
		return err
	}
	for _, e := range ents {
		if _, err := c.run(ctx, "ctr", "-a", c.containerdSock(), "-n", "k8s.io", "images", "import", "--no-unpack", c.path("images", e.Name())); err != nil {
			return fmt.Errorf("import %s: %w", e.Name(), err)
		}
	}
	return nil
}

func (c *Cluster) kubeletDir() string { return c.path("kubelet") }

func (c *Cluster) startKubelet(ctx context.Context) error {
	// Bidirectional mount propagation (the CSI plugin's mounts reaching
	// kubelet and pods) needs a shared kubelet root; / is private here.
	kd := c.kubeletDir()
	if m, _ := device.MountedAt(kd); m == nil {
		if err := device.Mount(ctx, kd, kd, "", []string{"bind"}); err != nil {
			return err
		}
		if _, err := c.run(ctx, "mount", "--make-rshared", kd); err != nil {
			return err
		}
	}
	p := pki{dir: c.path("pki")}
	cert, err := p.kubelet(c.NodeName)
	if err != nil {
		return err
	}
	if err := p.kubeconfig(c.path("kubelet.kubeconfig"), cert); err != nil {
		return err
	}
	// The API server reaches the kubelet at the node's name: a node named
	// by a loopback address is served there.
	address := "127.0.0.1"
	if ip := net.ParseIP(c.NodeName); ip != nil && ip.IsLoopback() {
		address = c.NodeName
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
containerRuntimeEndpoint: unix://%s
tlsCertFile: %s/%s.crt
tlsPrivateKeyFile: %s/%s.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %s/ca.crt}
authorization: {mode: Webhook}
clusterDomain: cluster.local
podLogsDir: %s
resolvConf: /etc/resolv.conf
evictionHard: {memory.available: "100Mi", nodefs.available: "1%%", imagefs.available: "1%%", nodefs.inodesFree: "1%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
# Volume stats every 10 s rather than every minute: tests read them.
volumeStatsAggPeriod: 10s
`, address, c.containerdSock(), pk, cert, pk, cert, pk, c.path("pod-logs"))
	if err := os.WriteFile(c.path("kubelet-config.yaml"), []byte(conf), 0o644); err != nil {
		return err
	}
	if err := c.startProcess("kubelet", nil, c.bins["kubelet"], "--config="+c.path("kubelet-config.yaml"), "--kubeconfig="+c.path("kubelet.kubeconfig"),
		"--root-dir="+kd, "--hostname-override="+c.NodeName, "--v=2"); err != nil {
		return err
	}
	return waitFor("node "+c.NodeName+" Ready (logs/kubelet.log)", 3*time.Minute, func() error {
		out, err := c.kubectl(ctx, "get", "node", c.NodeName, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		if err != nil {
			return err
		}
		if strings.TrimSpace(out) != "True" {
			return errNotYet
		}
		return nil
	})
}

func (c *Cluster) kubectl(ctx context.Context, args ...string) (string, error) {
	return c.run(ctx, c.bins["kubectl"], append([]string{"--kubeconfig", c.Kubeconfig()}, args...)...)
}

// Kubectl runs kubectl against the cluster.
func (c *Cluster) RunKubectl(ctx context.Context, args ...string) (string, error) {
	return c.kubectl(ctx, args...)
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

var _ = filepath.Join
