// Package kubetest starts a real kube-apiserver and etcd for tests
// (controller-runtime's envtest), with binaries built from Go modules by
// tools/k8s/build.sh and cached by version outside the repository.
package kubetest

import (
	"bytes"
	"errors"
	"fmt"
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
	dir, err := assets(func(msg string) { t.Log(msg) })
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func assets(logf func(string)) (string, error) {
	assetsOnce.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		script := filepath.Join(filepath.Dir(file), "..", "..", "tools", "k8s", "build.sh")
		cmd := exec.Command(script, "etcd", "kube-apiserver", "kubectl")
		var out, errb bytes.Buffer
		cmd.Stdout = &out
		cmd.Stderr = &errb
		logf("building or finding the Kubernetes test binaries (a cold build of kube-apiserver takes ~9 minutes on 2 cores)")
		if err := cmd.Run(); err != nil {
			assetsErr = fmt.Errorf("building the Kubernetes test binaries failed: %w\n%s", err, errb.String())
			return
		}
		assetsDir = strings.TrimSpace(out.String())
	})
	return assetsDir, assetsErr
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

// StartWith starts the API server with options; it is stopped when the
// test ends.
func StartWith(t testing.TB, o Options) *Env {
	t.Helper()
	e, stop, err := start(o, func(msg string) { t.Log(msg) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("stop kube-apiserver and etcd: %v", err)
		}
	})
	return e
}

// Shared starts an API server for a whole test binary, from TestMain:
// starting one costs seconds, and a package's tests can share it if each
// cleans up after itself. Call stop when the tests have run.
func Shared(o Options) (e *Env, stop func() error, err error) {
	return start(o, func(msg string) { fmt.Fprintln(os.Stderr, msg) })
}

func start(o Options, logf func(string)) (*Env, func() error, error) {
	dir, err := assets(logf)
	if err != nil {
		return nil, nil, err
	}
	// envtest's defaults (20 s to start or stop, 10 s for CRDs) are tight
	// on 2 cores shared with a cluster and other API servers.
	e := &envtest.Environment{BinaryAssetsDirectory: dir, CRDDirectoryPaths: o.CRDDirs, ErrorIfCRDPathMissing: true,
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
		return nil, nil, fmt.Errorf("start kube-apiserver and etcd: %w", err)
	}
	tmp, err := os.MkdirTemp("", "kubetest-")
	stop := func() error { return errors.Join(e.Stop(), os.RemoveAll(tmp)) }
	if err != nil {
		return nil, nil, errors.Join(err, stop())
	}
	user, err := e.AddUser(envtest.User{Name: "podvol-test-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return nil, nil, errors.Join(err, stop())
	}
	kc, err := user.KubeConfig()
	if err != nil {
		return nil, nil, errors.Join(err, stop())
	}
	path := filepath.Join(tmp, "kubeconfig")
	if err := os.WriteFile(path, kc, 0o600); err != nil {
		return nil, nil, errors.Join(err, stop())
	}
	return &Env{Config: cfg, Kubeconfig: path, env: e}, stop, nil
}
