package deploy

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"

	"github.com/podvol/podvol/internal/versions"
	"github.com/podvol/podvol/test/plugintest"
)

// kubeconfig writes a kubeconfig that authenticates with token (or, when
// token is empty, is the admin's).
func (e *env) kubeconfig(t *testing.T, name, token string) string {
	if token == "" {
		return e.api.Kubeconfig
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: e.api.Config.Host, CertificateAuthorityData: e.api.Config.CAData}
	cfg.AuthInfos["test"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "test"}
	cfg.CurrentContext = "test"
	path := filepath.Join(t.TempDir(), name+".kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// process is a sidecar running for the test; its output goes to a file.
type process struct {
	name, log string
}

func (e *env) run(t *testing.T, name, bin string, env []string, args ...string) *process {
	p := &process{name: name, log: filepath.Join(t.TempDir(), name+".log")}
	f, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(bg)
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		f.Close()
		if t.Failed() {
			b, _ := os.ReadFile(p.log)
			if len(b) > 6000 {
				b = b[len(b)-6000:]
			}
			t.Logf("%s's log ends:\n%s", name, b)
		}
	})
	return p
}

// refusals are the lines of a sidecar's log where the API server refused it.
func (p *process) refusals(allowed *regexp.Regexp) []string {
	b, _ := os.ReadFile(p.log)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if (strings.Contains(l, "forbidden") || strings.Contains(l, "denied request")) && (allowed == nil || !allowed.MatchString(l)) {
			out = append(out, l)
		}
	}
	return out
}

func waitFor(t *testing.T, what string, d time.Duration, f func() error) {
	t.Helper()
	start := time.Now()
	if err := eventually(d, f); err != nil {
		t.Fatalf("%s: not after %v: %v", what, d, err)
	}
	t.Logf("%s after %v", what, time.Since(start).Round(100*time.Millisecond))
}

// TestSidecars runs the node DaemonSet's real sidecars (with its arguments)
// and the real plugin against the API server, each with the token of its
// pod, under rbac-node.yaml and node-policy.yaml, through everything they do
// to the API: provisioning (WaitForFirstConsumer and Immediate binding),
// capacity, expansion by a resizer on another node, snapshots, a restore, a
// clone and a deletion. None of their requests may be refused.
func TestSidecars(t *testing.T) {
	plugintest.RequireRoot(t)
	e := start(t, "persistentvolume-binder-controller", "persistentvolume-protection-controller", "persistentvolumeclaim-protection-controller")
	e.waitForPolicies(t)
	if t.Failed() {
		t.FailNow()
	}
	kc := e.admin.kc
	apply(t, e.ac, filepath.Join(repoRoot(), "deploy", "base", "csidriver.yaml"))

	out, err := exec.Command(filepath.Join(repoRoot(), "tools", "sidecars", "build.sh")).Output()
	if err != nil {
		t.Fatalf("build or find the sidecars: %v", err)
	}
	bin := func(name string) string { return filepath.Join(strings.TrimSpace(string(out)), name) }
	plugin := plugintest.Start(t, plugintest.Options{Dir: plugintest.TempDir(t), NodeID: "node-a", Capacity: "20Gi"})
	csiAddress := "--csi-address=" + plugin.Socket
	nodeA, nodeB := e.kubeconfig(t, "node-a", e.tokens["node-a"]), e.kubeconfig(t, "node-b", e.tokens["node-b"])

	// deploy/base/node.yaml's arguments, node-a's pod. Only the delay
	// before an Immediate claim is taken is shortened (default 20s).
	provisioner := e.run(t, "csi-provisioner", bin("csi-provisioner-"+versions.ExternalProvisioner),
		[]string{"NODE_NAME=node-a", "NAMESPACE=" + namespace, "POD_NAME=podvol-node-node-a"},
		csiAddress, "--kubeconfig="+nodeA, "--node-deployment", "--enable-capacity", "--capacity-ownerref-level=1",
		"--extra-create-metadata", "--feature-gates=CrossNamespaceVolumeDataSource=true", "--timeout=120s", "--kube-api-qps=50", "--kube-api-burst=100",
		"--node-deployment-base-delay=1s", "--node-deployment-max-delay=5s", "-v=4")
	snapshotter := e.run(t, "csi-snapshotter", bin("csi-snapshotter-"+versions.ExternalSnapshotter), []string{"NODE_NAME=node-a"},
		csiAddress, "--kubeconfig="+nodeA, "--node-deployment", "--feature-gates=CSIVolumeGroupSnapshot=false", "-v=4")
	groupSnapshotter := e.run(t, "podvol-group-snapshotter", groupSnapshotterBinary(t), []string{"NODE_NAME=node-a"},
		csiAddress, "--kubeconfig="+nodeA, "-v=4")
	// The one active external-resizer may run on any node: here node-b's,
	// talking to node-a's plugin (ControllerExpandVolume touches no pool).
	resizer := e.run(t, "csi-resizer", bin("csi-resizer-"+versions.ExternalResizer), []string{"NAMESPACE=" + namespace},
		csiAddress, "--kubeconfig="+nodeB, "--leader-election", "--leader-election-namespace="+namespace,
		"--handle-volume-inuse-error=false", "-v=4")
	// Nothing may be refused, whatever else fails.
	t.Cleanup(func() {
		for _, p := range []*process{provisioner, snapshotter, groupSnapshotter, resizer} {
			for _, l := range p.refusals(nil) {
				t.Errorf("%s was refused: %s", p.name, l)
			}
		}
	})
	// podvol-controller's snapshot-controller (its own RBAC is not tested here).
	e.run(t, "snapshot-controller", bin("snapshot-controller-"+versions.ExternalSnapshotter), nil,
		"--kubeconfig="+e.kubeconfig(t, "admin", ""), "--leader-election=false", "--enable-distributed-snapshotting", "-v=4")

	wffc, immediate := storagev1.VolumeBindingWaitForFirstConsumer, storagev1.VolumeBindingImmediate
	for name, mode := range map[string]*storagev1.VolumeBindingMode{"podvol": &wffc, "podvol-immediate": &immediate} {
		_, err := kc.StorageV1().StorageClasses().Create(bg, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name},
			Provisioner: "podvol.io", VolumeBindingMode: mode, AllowVolumeExpansion: ptr.To(true),
			Parameters: map[string]string{"csi.storage.k8s.io/fstype": "ext4"}}, metav1.CreateOptions{})
		must(t, err)
	}
	_, err = e.admin.dyn.Resource(vsClassGVR).Create(bg, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass", "metadata": map[string]any{"name": "podvol"},
		"driver": "podvol.io", "deletionPolicy": "Delete"}}, metav1.CreateOptions{})
	must(t, err)

	claims := kc.CoreV1().PersistentVolumeClaims("tenant")
	claim := func(name, class, size string, selected bool, source *corev1.TypedLocalObjectReference) {
		c := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				StorageClassName: ptr.To(class), DataSource: source,
				Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}}}}
		if selected {
			// What the scheduler does for a pod of this claim on node-a.
			c.Annotations = map[string]string{"volume.kubernetes.io/selected-node": "node-a"}
		}
		_, err := claims.Create(bg, c, metav1.CreateOptions{})
		must(t, err)
	}
	bound := func(name string) func() error {
		return func() error {
			c, err := claims.Get(bg, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if c.Status.Phase != corev1.ClaimBound {
				return fmt.Errorf("claim %s is %s", name, c.Status.Phase)
			}
			return nil
		}
	}
	pvOf := func(name string) *corev1.PersistentVolume {
		c, err := claims.Get(bg, name, metav1.GetOptions{})
		must(t, err)
		pv, err := kc.CoreV1().PersistentVolumes().Get(bg, c.Spec.VolumeName, metav1.GetOptions{})
		must(t, err)
		return pv
	}

	claim("wffc", "podvol", "64Mi", true, nil)
	waitFor(t, "a WaitForFirstConsumer claim selected for node-a is provisioned and bound", 2*time.Minute, bound("wffc"))
	claim("immediate", "podvol-immediate", "64Mi", false, nil)
	waitFor(t, "an Immediate claim is taken by node-a, provisioned and bound", 2*time.Minute, bound("immediate"))
	if n := pvOf("immediate").Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0].Values; len(n) != 1 || n[0] != "node-a" {
		t.Errorf("the Immediate claim's PV is on %v", n)
	}

	waitFor(t, "node-a's capacity is published, owned by the DaemonSet", time.Minute, func() error {
		l, err := kc.StorageV1().CSIStorageCapacities(namespace).List(bg, metav1.ListOptions{})
		if err != nil {
			return err
		}
		n := 0
		for _, c := range l.Items {
			if c.NodeTopology.MatchLabels["topology.podvol.io/node"] == "node-a" && len(c.OwnerReferences) == 1 && c.OwnerReferences[0].Kind == "DaemonSet" {
				n++
			}
		}
		// One per WaitForFirstConsumer class (Immediate ones get none).
		if n != 1 {
			return fmt.Errorf("%d CSIStorageCapacity objects for node-a, want 1: %v", n, l.Items)
		}
		return nil
	})

	_, err = claims.Patch(bg, "wffc", types.MergePatchType, []byte(`{"spec":{"resources":{"requests":{"storage":"128Mi"}}}}`), metav1.PatchOptions{})
	must(t, err)
	waitFor(t, "node-b's resizer grows node-a's PV and hands the claim to node expansion", 2*time.Minute, func() error {
		pv := pvOf("wffc")
		c, err := claims.Get(bg, "wffc", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got := pv.Spec.Capacity[corev1.ResourceStorage]; got.Cmp(resource.MustParse("128Mi")) != 0 {
			return fmt.Errorf("PV capacity %s", got.String())
		}
		if s := c.Status.AllocatedResourceStatuses[corev1.ResourceStorage]; s != corev1.PersistentVolumeClaimNodeResizePending {
			return fmt.Errorf("claim's resize status %q", s)
		}
		return nil
	})

	_, err = e.admin.dyn.Resource(vsGVR).Namespace("tenant").Create(bg, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot", "metadata": map[string]any{"name": "snap"},
		"spec": map[string]any{"volumeSnapshotClassName": "podvol", "source": map[string]any{"persistentVolumeClaimName": "wffc"}}}}, metav1.CreateOptions{})
	must(t, err)
	waitFor(t, "node-a's snapshotter cuts the snapshot", 2*time.Minute, func() error {
		u, err := e.admin.dyn.Resource(vsGVR).Namespace("tenant").Get(bg, "snap", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if ready, _, _ := unstructured.NestedBool(u.Object, "status", "readyToUse"); !ready {
			return fmt.Errorf("not ready: %v", u.Object["status"])
		}
		return nil
	})

	groupSnapshot(t, e, "wffc")

	claim("restored", "podvol", "64Mi", true, &corev1.TypedLocalObjectReference{APIGroup: ptr.To("snapshot.storage.k8s.io"), Kind: "VolumeSnapshot", Name: "snap"})
	waitFor(t, "a claim restored from the snapshot is bound", 2*time.Minute, bound("restored"))
	// (At least the source's size, which has grown.)
	claim("clone", "podvol", "128Mi", true, &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "wffc"})
	waitFor(t, "a clone of a claim is bound", 2*time.Minute, bound("clone"))
	// The provisioner released the restored snapshot, and protects the
	// clone's source until it is deleted.
	u, err := e.admin.dyn.Resource(vsGVR).Namespace("tenant").Get(bg, "snap", metav1.GetOptions{})
	must(t, err)
	for _, f := range u.GetFinalizers() {
		if strings.HasPrefix(f, "provisioner.storage.kubernetes.io/") {
			t.Errorf("the restored snapshot still has finalizer %s", f)
		}
	}
	source, err := claims.Get(bg, "wffc", metav1.GetOptions{})
	must(t, err)
	if !slices.Contains(source.Finalizers, "provisioner.storage.kubernetes.io/cloning-protection") {
		t.Errorf("the clone's source has finalizers %v, no cloning-protection", source.Finalizers)
	}

	// Deleted claims: the provisioner drops the source's protection, deletes
	// each volume and its PV and drops its finalizer.
	var pvs []string
	for _, name := range []string{"wffc", "immediate"} {
		pvs = append(pvs, pvOf(name).Name)
		must(t, claims.Delete(bg, name, metav1.DeleteOptions{}))
	}
	waitFor(t, "released PVs are deleted by node-a", 2*time.Minute, func() error {
		for _, name := range pvs {
			if pv, err := kc.CoreV1().PersistentVolumes().Get(bg, name, metav1.GetOptions{}); err == nil {
				return fmt.Errorf("PV %s still there (%s, finalizers %v)", name, pv.Status.Phase, pv.Finalizers)
			}
		}
		return nil
	})
}

// groupSnapshotterBinary builds cmd/podvol-group-snapshotter.
func groupSnapshotterBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "podvol-group-snapshotter")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/podvol/podvol/cmd/podvol-group-snapshotter").CombinedOutput(); err != nil {
		t.Fatalf("go build podvol-group-snapshotter: %v\n%s", err, out)
	}
	return bin
}

// groupSnapshot takes a VolumeGroupSnapshot of the tenant's claim and
// deletes it: snapshot-controller makes the group content, node-a's
// podvol-group-snapshotter (with node-a's token, under rbac-node.yaml and
// node-policy.yaml) cuts it and, once the group is deleted, deletes it. The
// labels podvol-controller's group-snapshot-routing and snapshot-import set
// (test/controller runs them) are set here as they would.
func groupSnapshot(t *testing.T, e *env, claim string) {
	t.Helper()
	kc := e.admin.kc
	// A patch, not an update: snapshot-controller is still changing the
	// claim's finalizers after the snapshot before this one.
	_, err := kc.CoreV1().PersistentVolumeClaims("tenant").Patch(bg, claim, types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"group":"g"}}}`), metav1.PatchOptions{})
	must(t, err)
	_, err = e.admin.dyn.Resource(vgsClassGVR).Create(bg, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "groupsnapshot.storage.k8s.io/v1", "kind": "VolumeGroupSnapshotClass", "metadata": map[string]any{"name": "podvol"},
		"driver": "podvol.io", "deletionPolicy": "Delete"}}, metav1.CreateOptions{})
	must(t, err)
	_, err = e.admin.dyn.Resource(vgsGVR).Namespace("tenant").Create(bg, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "groupsnapshot.storage.k8s.io/v1", "kind": "VolumeGroupSnapshot", "metadata": map[string]any{"name": "group"},
		"spec": map[string]any{"volumeGroupSnapshotClassName": "podvol",
			"source": map[string]any{"selector": map[string]any{"matchLabels": map[string]any{"group": "g"}}}}}}, metav1.CreateOptions{})
	must(t, err)
	label := func(gvr schema.GroupVersionResource, name string) error {
		_, err := e.admin.dyn.Resource(gvr).Patch(bg, name, types.MergePatchType,
			[]byte(`{"metadata":{"labels":{"snapshot.storage.kubernetes.io/managed-by":"node-a"}}}`), metav1.PatchOptions{})
		return err
	}
	var content string
	waitFor(t, "snapshot-controller makes the group content", time.Minute, func() error {
		u, err := e.admin.dyn.Resource(vgsGVR).Namespace("tenant").Get(bg, "group", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if content, _, _ = unstructured.NestedString(u.Object, "status", "boundVolumeGroupSnapshotContentName"); content == "" {
			return fmt.Errorf("no content yet: %v", u.Object["status"])
		}
		return label(vgscGVR, content)
	})
	waitFor(t, "node-a's group snapshotter cuts the group", 2*time.Minute, func() error {
		u, err := e.admin.dyn.Resource(vgsGVR).Namespace("tenant").Get(bg, "group", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if ready, _, _ := unstructured.NestedBool(u.Object, "status", "readyToUse"); !ready {
			return fmt.Errorf("not ready: %v", u.Object["status"])
		}
		return nil
	})
	members, err := e.admin.dyn.Resource(vscGVR).List(bg, metav1.ListOptions{})
	must(t, err)
	var memberContents []string
	for _, m := range members.Items {
		if _, ok := m.GetAnnotations()["groupsnapshot.storage.k8s.io/volumeGroupSnapshotHandle"]; ok {
			memberContents = append(memberContents, m.GetName())
			must(t, label(vscGVR, m.GetName()))
		}
	}
	if len(memberContents) != 1 {
		t.Fatalf("the group of one claim has member contents %v", memberContents)
	}
	must(t, e.admin.dyn.Resource(vgsGVR).Namespace("tenant").Delete(bg, "group", metav1.DeleteOptions{}))
	waitFor(t, "the group's contents are deleted by node-a", 2*time.Minute, func() error {
		for _, x := range []struct {
			gvr  schema.GroupVersionResource
			name string
		}{{vgscGVR, content}, {vscGVR, memberContents[0]}} {
			if u, err := e.admin.dyn.Resource(x.gvr).Get(bg, x.name, metav1.GetOptions{}); err == nil {
				return fmt.Errorf("%s %s still there (finalizers %v)", x.gvr.Resource, x.name, u.GetFinalizers())
			}
		}
		return nil
	})
}
