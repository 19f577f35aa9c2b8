// Package deploy tests deploy/base's node-side RBAC and admission policies
// against a real kube-apiserver (envtest): requests are made with real
// service account tokens bound to pods on named nodes, as the podvol-node
// pods' own tokens are; and the tenant-facing admission policies, with
// tenants impersonated under real RBAC.
//
// PODVOL_NODE_POLICY, PODVOL_NODE_RBAC and PODVOL_ADMISSION_POLICY name other
// files to apply instead of deploy/base/node-policy.yaml,
// deploy/base/rbac-node.yaml and deploy/base/admission-policy.yaml: pointing
// them at an empty file or an older version shows what the shipped ones
// prevent (the tests then fail).
package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/podvol/podvol/internal/versions"
	"github.com/podvol/podvol/test/kubetest"
)

const (
	namespace = "podvol-system"
	saName    = "podvol-node"
	saUser    = "system:serviceaccount:" + namespace + ":" + saName
	nodeKey   = "authentication.kubernetes.io/node-name"
)

var bg = context.Background()

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// manifest is deploy/base/<name>, or the file the environment names instead.
func manifest(t *testing.T, env, name string) string {
	if p := os.Getenv(env); p != "" {
		t.Logf("%s=%s: applying it instead of deploy/base/%s", env, p, name)
		return p
	}
	return filepath.Join(repoRoot(), "deploy", "base", name)
}

// snapshotCRDs is the snapshot CRDs' directory in external-snapshotter's
// client module, the version deploy/base names.
func snapshotCRDs(t *testing.T) string {
	out, err := exec.Command("go", "mod", "download", "-json", versions.SnapshotterClient).Output()
	if err != nil {
		t.Fatalf("download external-snapshotter's client module for the snapshot CRDs: %v", err)
	}
	var m struct{ Dir string }
	if err := json.Unmarshal(out, &m); err != nil || m.Dir == "" {
		t.Fatalf("go mod download said %q: %v", out, err)
	}
	return filepath.Join(m.Dir, "config", "crd")
}

// referenceGrantCRD is gateway-api's ReferenceGrant CRD, which
// external-provisioner watches with CrossNamespaceVolumeDataSource.
func referenceGrantCRD(t *testing.T) string {
	out, err := exec.Command("go", "mod", "download", "-json", versions.GatewayAPIModule).Output()
	if err != nil {
		t.Fatalf("download gateway-api for its ReferenceGrant CRD: %v", err)
	}
	var m struct{ Dir string }
	if err := json.Unmarshal(out, &m); err != nil || m.Dir == "" {
		t.Fatalf("go mod download said %q: %v", out, err)
	}
	return filepath.Join(m.Dir, "config", "crd", "standard", "gateway.networking.k8s.io_referencegrants.yaml")
}

// apply creates every object of a multi-document YAML file, namespaced ones
// without a namespace in podvol-system (as kustomize's namespace does).
func apply(t *testing.T, c client.Client, path string) []*unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatalf("%s: %v", path, err)
		}
		if len(u.Object) == 0 {
			continue
		}
		namespaced, err := c.IsObjectNamespaced(u)
		if err != nil {
			t.Fatalf("%s: %s: %v", path, u.GetKind(), err)
		}
		if namespaced && u.GetNamespace() == "" {
			u.SetNamespace(namespace)
		}
		if err := c.Create(bg, u); err != nil {
			t.Fatalf("%s: create %s %s: %v", path, u.GetKind(), u.GetName(), err)
		}
		objs = append(objs, u)
	}
	return objs
}

// identity is one way of calling the API.
type identity struct {
	name string
	kc   kubernetes.Interface
	dyn  dynamic.Interface
}

func newIdentity(t *testing.T, name string, cfg *rest.Config) *identity {
	t.Helper()
	return &identity{name: name, kc: kubernetes.NewForConfigOrDie(cfg), dyn: dynamic.NewForConfigOrDie(cfg)}
}

// env is an API server with podvol-node's RBAC and node policies applied,
// and the identities the tests use.
type env struct {
	admin *identity
	ac    client.Client
	// nodeA and nodeB are podvol-node pods' tokens on node-a and node-b;
	// unbound is a podvol-node token bound to no pod (no node name);
	// impersonated is the admin impersonating podvol-node on node-a.
	nodeA, nodeB, unbound, impersonated *identity
	policies                            []*unstructured.Unstructured
	api                                 *kubetest.Env
	// tokens of nodeA and nodeB, for processes.
	tokens map[string]string
}

// start runs an API server (with the snapshot CRDs and ReferenceGrant's) and
// kube-controller-manager's controllers named, applies podvol-node's RBAC
// and policies, and makes the DaemonSet's pods on node-a and node-b.
func start(t *testing.T, controllers ...string) *env {
	api := kubetest.StartWith(t, kubetest.Options{CRDDirs: []string{snapshotCRDs(t), referenceGrantCRD(t)}})
	ac, err := client.New(api.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{admin: newIdentity(t, "admin", api.Config), ac: ac, api: api, tokens: map[string]string{}}
	controllerManager(t, api, append([]string{"validatingadmissionpolicy-status-controller"}, controllers...)...)
	kc := e.admin.kc
	for _, ns := range []string{namespace, "tenant"} {
		if _, err := kc.CoreV1().Namespaces().Create(bg, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	apply(t, ac, manifest(t, "PODVOL_NODE_RBAC", "rbac-node.yaml"))
	apply(t, ac, manifest(t, "PODVOL_CONTROLLER_RBAC", "rbac-controller.yaml"))
	apply(t, ac, manifest(t, "PODVOL_METRICS_RBAC", "rbac-metrics.yaml"))
	e.policies = apply(t, ac, manifest(t, "PODVOL_NODE_POLICY", "node-policy.yaml"))

	token := func(ref *authenticationv1.BoundObjectReference) string {
		tr, err := kc.CoreV1().ServiceAccounts(namespace).CreateToken(bg, saName,
			&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{BoundObjectRef: ref}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	withToken := func(tok string) *rest.Config {
		cfg := rest.AnonymousClientConfig(api.Config)
		cfg.BearerToken = tok
		return cfg
	}
	// A pod of the DaemonSet on each node (no scheduler here: the node is
	// set as the scheduler would), and a token bound to it, as the kubelet
	// requests for the pod's projected service account volume.
	labels := map[string]string{"app.kubernetes.io/name": "podvol", "app.kubernetes.io/component": "node"}
	ds, err := kc.AppsV1().DaemonSets(namespace).Create(bg, &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "podvol-node"},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: labels},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "plugin", Image: "podvol-plugin"}}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	podToken := func(node string) string {
		pod, err := kc.CoreV1().Pods(namespace).Create(bg, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "podvol-node-" + node, Labels: labels, OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "apps/v1", Kind: "DaemonSet", Name: ds.Name, UID: ds.UID, Controller: ptr.To(true)}}},
			Spec: corev1.PodSpec{ServiceAccountName: saName, NodeName: node,
				Containers: []corev1.Container{{Name: "plugin", Image: "podvol-plugin"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return token(&authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID})
	}
	for _, n := range []string{"node-a", "node-b"} {
		if _, err := kc.CoreV1().Nodes().Create(bg, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n,
			Labels: map[string]string{"topology.podvol.io/node": n}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []string{"node-a", "node-b"} {
		e.tokens[n] = podToken(n)
	}
	e.nodeA = newIdentity(t, "podvol-node on node-a", withToken(e.tokens["node-a"]))
	e.nodeB = newIdentity(t, "podvol-node on node-b", withToken(e.tokens["node-b"]))
	e.unbound = newIdentity(t, "podvol-node, token bound to no pod", withToken(token(nil)))
	imp := rest.CopyConfig(api.Config)
	imp.Impersonate = rest.ImpersonationConfig{UserName: saUser,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
		Extra:  map[string][]string{nodeKey: {"node-a"}}}
	e.impersonated = newIdentity(t, "admin impersonating podvol-node on node-a", imp)

	// What the API server makes of each token: the pod-bound ones carry
	// their pod's node, with no feature gate set.
	for _, id := range []*identity{e.nodeA, e.nodeB, e.unbound} {
		r, err := id.kc.AuthenticationV1().SelfSubjectReviews().Create(bg, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		u := r.Status.UserInfo
		t.Logf("%s: user %s, %s=%v", id.name, u.Username, nodeKey, u.Extra[nodeKey])
		if u.Username != saUser {
			t.Fatalf("%s authenticates as %s", id.name, u.Username)
		}
	}
	return e
}

// controllerManager runs kube-controller-manager with only the controllers
// named against the API server. validatingadmissionpolicy-status-controller
// type-checks each policy against the types it matches and writes the
// warnings into the policy's status.
func controllerManager(t *testing.T, api *kubetest.Env, controllers ...string) {
	script := filepath.Join(repoRoot(), "tools", "k8s", "build.sh")
	out, err := exec.Command(script, "kube-controller-manager").Output()
	if err != nil {
		t.Fatalf("build or find kube-controller-manager: %v", err)
	}
	bin := filepath.Join(strings.TrimSpace(string(out)), "kube-controller-manager")
	ctx, cancel := context.WithCancel(bg)
	log, err := os.Create(filepath.Join(t.TempDir(), "kube-controller-manager.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, bin, "--kubeconfig", api.Kubeconfig, "--controllers="+strings.Join(controllers, ","),
		"--leader-elect=false", "--secure-port=0", "--use-service-account-credentials=false")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(log.Name())
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			t.Logf("kube-controller-manager's log ends:\n%s", b)
		}
	})
}

// eventually retries f until it returns nil or d has passed.
func eventually(d time.Duration, f func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// refusedByPolicy tells whether err is a refusal by one of podvol-node's
// admission policies (not RBAC's).
func refusedByPolicy(err error) bool {
	return err != nil && apierrors.IsForbidden(err) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy 'podvol-node-")
}

func allowed(t *testing.T, id *identity, what string, err error) {
	t.Helper()
	if err != nil {
		t.Errorf("%s: %s: want allowed, got: %v", id.name, what, err)
	}
}

// refused checks that a policy refused the request with a message naming
// each of want.
func refused(t *testing.T, id *identity, what string, err error, want ...string) {
	t.Helper()
	switch {
	case err == nil:
		t.Errorf("%s: %s: want refused by a podvol-node policy, it was allowed", id.name, what)
	case !refusedByPolicy(err):
		t.Errorf("%s: %s: want refused by a podvol-node policy, got: %v", id.name, what, err)
	default:
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %s: refusal does not say %q: %v", id.name, what, w, err)
			}
		}
		t.Logf("%s: %s: refused: %v", id.name, what, err)
	}
}

// forbiddenByRBAC checks that RBAC refused the request.
func forbiddenByRBAC(t *testing.T, id *identity, what string, err error) {
	t.Helper()
	if err == nil || !apierrors.IsForbidden(err) || refusedByPolicy(err) {
		t.Errorf("%s: %s: want forbidden by RBAC, got: %v", id.name, what, err)
	}
}

var (
	vsGVR       = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshots"}
	vscGVR      = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshotcontents"}
	vsClassGVR  = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshotclasses"}
	vgsGVR      = schema.GroupVersionResource{Group: "groupsnapshot.storage.k8s.io", Version: "v1", Resource: "volumegroupsnapshots"}
	vgscGVR     = schema.GroupVersionResource{Group: "groupsnapshot.storage.k8s.io", Version: "v1", Resource: "volumegroupsnapshotcontents"}
	vgsClassGVR = schema.GroupVersionResource{Group: "groupsnapshot.storage.k8s.io", Version: "v1", Resource: "volumegroupsnapshotclasses"}
	vapGVR      = schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingadmissionpolicies"}
)
