// Package kubetest starts a real kube-apiserver and etcd for tests
// (controller-runtime's envtest), with binaries built from Go modules by
// tools/k8s/build.sh and cached by version outside the repository.
package kubetest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

var (
	assetsOnce sync.Once
	assetsDir  string
	assetsErr  error
)

// Assets builds (or finds cached) etcd, kube-apiserver and kubectl and
// returns their directory. The first build takes minutes; it says so.
func Assets(t testing.TB) string {
	t.Helper()
	assetsOnce.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		script := filepath.Join(filepath.Dir(file), "..", "..", "tools", "k8s", "build.sh")
		cmd := exec.Command(script, "etcd", "kube-apiserver", "kubectl")
		var out, errb bytes.Buffer
		cmd.Stdout = &out
		cmd.Stderr = &errb
		t.Logf("building or finding the Kubernetes test binaries (a cold build of kube-apiserver takes ~9 minutes on 2 cores)")
		if err := cmd.Run(); err != nil {
			assetsErr = err
			assetsDir = errb.String()
			return
		}
		assetsDir = strings.TrimSpace(out.String())
	})
	if assetsErr != nil {
		t.Fatalf("building the Kubernetes test binaries failed: %v\n%s", assetsErr, assetsDir)
	}
	return assetsDir
}

// Env is a running kube-apiserver with etcd.
type Env struct {
	Config *rest.Config
	// Kubeconfig is a file for processes (the plugin) to reach the API as
	// a cluster admin.
	Kubeconfig string
	env        *envtest.Environment
}

// Start starts the API server; it is stopped when the test ends.
func Start(t testing.TB, crdDirs ...string) *Env {
	return StartWith(t, Options{CRDDirs: crdDirs})
}

// Options configure the API server.
type Options struct {
	CRDDirs      []string
	FeatureGates string // e.g. CrossNamespaceVolumeDataSource=true
	// Flags are more kube-apiserver flags, e.g. disable-admission-plugins.
	Flags map[string]string
}

// StartWith starts the API server with options.
func StartWith(t testing.TB, o Options) *Env {
	t.Helper()
	// envtest's defaults (20 s to start or stop, 10 s for CRDs) are tight
	// on 2 cores shared with a cluster and other API servers.
	e := &envtest.Environment{BinaryAssetsDirectory: Assets(t), CRDDirectoryPaths: o.CRDDirs, ErrorIfCRDPathMissing: true,
		ControlPlaneStartTimeout: 2 * time.Minute, ControlPlaneStopTimeout: time.Minute,
		CRDInstallOptions: envtest.CRDInstallOptions{MaxTime: time.Minute}}
	if o.FeatureGates != "" {
		e.ControlPlane.GetAPIServer().Configure().Append("feature-gates", o.FeatureGates)
	}
	for k, v := range o.Flags {
		e.ControlPlane.GetAPIServer().Configure().Append(k, v)
	}
	cfg, err := e.Start()
	if err != nil {
		t.Fatalf("start kube-apiserver and etcd: %v", err)
	}
	t.Cleanup(func() {
		if err := e.Stop(); err != nil {
			t.Errorf("stop kube-apiserver and etcd: %v", err)
		}
	})
	user, err := e.AddUser(envtest.User{Name: "podvol-test-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	return &Env{Config: cfg, Kubeconfig: path, env: e}
}
