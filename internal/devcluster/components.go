package devcluster

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
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
		// Each node's kubelet listens on the node's address only.
		"--kubelet-preferred-address-types=InternalIP",
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
	// Up puts the built kube-scheduler back if `make bench-startup` left
	// another one running.
	return c.UseScheduler(c.bins["kube-scheduler"])
}

// UseScheduler makes bin the cluster's kube-scheduler, with the same flags
// whichever binary it is: if another binary runs, it is stopped by its PID
// first. It returns once the new scheduler reports healthy. `make
// bench-startup` runs Kubernetes' and a patched one side by side this way.
func (c *Cluster) UseScheduler(bin string) error {
	want, err := filepath.EvalSymlinks(bin)
	if err != nil {
		return fmt.Errorf("kube-scheduler binary: %w", err)
	}
	if pid, ok := c.running("kube-scheduler"); ok {
		if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); exe == want {
			return nil
		}
		if err := c.stopProcess("kube-scheduler", 30*time.Second); err != nil {
			return err
		}
	}
	k := c.Kubeconfig()
	err = c.startProcess("kube-scheduler", nil, want,
		"--kubeconfig="+k, "--authentication-kubeconfig="+k, "--authorization-kubeconfig="+k,
		"--bind-address=127.0.0.1", "--secure-port=10259", "--leader-elect=false")
	if err != nil {
		return err
	}
	// /readyz, not /healthz: only the former waits for the informers'
	// handlers to sync, before which the scheduler places nothing.
	err = waitFor("kube-scheduler (logs/kube-scheduler.log)", time.Minute, func() error { return httpOK("https://127.0.0.1:10259/readyz") })
	if err != nil {
		return err
	}
	// An old scheduler nobody recorded would answer for a new one that
	// could not listen.
	if _, ok := c.running("kube-scheduler"); !ok {
		return fmt.Errorf("kube-scheduler %s exited after it started (logs/kube-scheduler.log says why)", want)
	}
	return nil
}

// KubernetesBinary returns the path of one of the binaries
// tools/k8s/build.sh builds (building it if it is not cached), such as
// kube-scheduler or kube-scheduler-prebind-watch.
func (c *Cluster) KubernetesBinary(ctx context.Context, name string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.Repo, "tools", "k8s", "build.sh"), name)
	cmd.Stderr = c.Out
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("tools/k8s/build.sh %s: %w (its output above says why)", name, err)
	}
	return filepath.Join(strings.TrimSpace(string(out)), name), nil
}

func (c *Cluster) kubectl(ctx context.Context, args ...string) (string, error) {
	return c.run(ctx, c.bins["kubectl"], append([]string{"--kubeconfig", c.Kubeconfig()}, args...)...)
}

// Kubectl runs kubectl against the cluster.
func (c *Cluster) RunKubectl(ctx context.Context, args ...string) (string, error) {
	return c.kubectl(ctx, args...)
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }
