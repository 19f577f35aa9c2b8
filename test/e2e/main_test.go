// Package e2e tests podvol end to end on the dev cluster: a real kubelet,
// containerd, runc, scheduler and the CSI sidecars, with pods that really
// write to their volumes. The cluster is brought up if it is not running
// (the first time builds Kubernetes: minutes) and torn down afterwards
// unless PODVOL_E2E_KEEP is set or it was already running;
// PODVOL_E2E_CONFORMANCE_NEXT brings it up with the conformance suite's
// pools (devcluster.ConformancePoolSize).
package e2e

import (
	"context"
	"embed"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/podvol/podvol/internal/devcluster"
)

var cluster *devcluster.Cluster

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "the end-to-end tests run a kubelet and containerd: run them as root (make test does)")
		os.Exit(1)
	}
	// A lost node's volumes are released after node-loss's grace period:
	// 1 minute here rather than the chart's default 5 (the same code path;
	// a Lease lasts 40 s), as an admin's values would set it.
	cfg := devcluster.Config{Out: os.Stderr, NodeLossGrace: time.Minute}
	if os.Getenv("PODVOL_E2E_CONFORMANCE_NEXT") != "" {
		// make test runs the conformance suite on this cluster next (kept
		// up: PODVOL_E2E_KEEP): a new one gets the pools it needs.
		cfg.PoolSize = devcluster.ConformancePoolSize
	}
	cluster = devcluster.New(cfg)
	wasUp := cluster.Running()
	if !wasUp {
		hostMount = mountScratch()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	err := cluster.Up(ctx)
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "bringing up the dev cluster failed: %v\n", err)
		if !wasUp {
			_ = cluster.Down(context.Background())
		}
		hostMount.remove()
		os.Exit(1)
	}
	code := m.Run()
	hostMount.remove()
	if code == 0 {
		code = checkNoRestarts()
	}
	if !wasUp && os.Getenv("PODVOL_E2E_KEEP") == "" {
		if err := cluster.Down(context.Background()); err != nil {
			fmt.Fprintf(os.Stderr, "tearing down the dev cluster: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// TestCluster runs the end-to-end tests on the dev cluster (go test -run
// 'TestCluster/Namespaced/RawBlockVolume' runs one). The two that count
// every image in the pools run first, alone; then, at once, the tests that
// touch nothing outside their namespace (most of their time is spent
// waiting on pods); then, one after another and in this order, those that
// look at or change the whole cluster: podvol's pods replaced, the default class, pools filled,
// every volume counted, nodes cordoned, drained and lost. The lost node
// comes last: it stops a node for over node-loss's grace period.
func TestCluster(t *testing.T) {
	type test struct {
		name string
		run  func(*testing.T)
	}
	for _, c := range []test{
		{"InstalledByTheChart", testInstalledByTheChart},
		{"ChartEveryOptionDryRun", testChartEveryOptionDryRun},
		{"NodesLetGoOfHostMounts", testNodesLetGoOfHostMounts},
		{"GenericEphemeral", testGenericEphemeral},
		{"Inline", testInline},
	} {
		t.Run(c.name, c.run)
	}
	t.Run("Namespaced", func(t *testing.T) {
		for _, c := range []test{
			{"PersistentSnapshotCloneResize", testPersistentSnapshotCloneResize},
			{"RawBlockVolume", testRawBlockVolume},
			{"ReadWriteOncePod", testReadWriteOncePod},
			{"NonRootPodWritesWithFsGroup", testNonRootPodWritesWithFsGroup},
			{"PodvolEphemeralController", testPodvolEphemeralController},
			{"EphemeralCloneResetsOnDetach", testEphemeralCloneResetsOnDetach},
			{"AdmissionPolicy", testAdmissionPolicy},
			{"MetricsNeedAuthorizedToken", testMetricsNeedAuthorizedToken},
			{"DeviceClasses", testDeviceClasses},
			{"GroupSnapshot", testGroupSnapshot},
			{"RestoreOnAnotherNode", testRestoreOnAnotherNode},
			{"CloneOnAnotherNode", testCloneOnAnotherNode},
			{"BackupMoverPattern", testBackupMoverPattern},
		} {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				c.run(t)
			})
		}
	})
	for _, c := range []test{
		// It replaces every podvol pod while volumes are in use.
		{"RolloutRestart", testRolloutRestart},
		// It uninstalls podvol, installs the previous release, upgrades.
		{"Upgrade", testUpgrade},
		// It stops podvol-controller for a while.
		{"PlacementBeforeScheduling", testPlacementBeforeScheduling},
		// It makes podvol's class the cluster's default for a while.
		{"AdmissionPolicyGaps", testAdmissionPolicyGaps},
		{"Capacity", testCapacity},
		{"MetricsMatchVolumes", testMetricsMatchVolumes},
		{"Prometheus", testPrometheus},
		// It compares every node's pool with what its plugin exports.
		{"KubectlPodvol", testKubectlPodvol},
		{"PerNodeRouting", testPerNodeRouting},
		// It kills podvol's plugins on two nodes mid-transfer.
		{"TransferSurvivesKilledPlugins", testTransferSurvivesKilledPlugins},
		// It cordons and drains a node.
		{"DrainMigratesData", testDrainMigratesData},
		{"DrainWithSomewhereToGo", testDrainWithSomewhereToGo},
		{"NodeLost", testNodeLost},
	} {
		t.Run(c.name, c.run)
	}
}

// ns makes a namespace for one test and deletes it (and waits) afterwards.
func ns(t *testing.T) string {
	t.Helper()
	test := t.Name()[strings.LastIndex(t.Name(), "/")+1:]
	name := "e2e-" + strings.ToLower(strings.NewReplacer("_", "-").Replace(test))
	if len(name) > 60 {
		name = name[:60]
	}
	return nsNamed(t, name)
}

// nsNamed is ns with the namespace's name given.
func nsNamed(t *testing.T, name string) string {
	t.Helper()
	ctx := context.Background()
	_, _ = cluster.RunKubectl(ctx, "delete", "namespace", name, "--ignore-not-found", "--wait=true", "--timeout=3m")
	if _, err := cluster.RunKubectl(ctx, "create", "namespace", name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := cluster.RunKubectl(ctx, "-n", name, "get", "pods,pvc,events", "-o", "wide")
			t.Logf("namespace %s:\n%s", name, out)
		}
		if _, err := cluster.RunKubectl(ctx, "delete", "namespace", name, "--wait=true", "--timeout=5m"); err != nil {
			t.Errorf("delete namespace %s: %v", name, err)
		}
		// The PVs go after their namespace, when the provisioner has
		// deleted the volumes: the next test counts the pool from a
		// quiet start.
		eventually(t, 3*time.Minute, func() string {
			pvs, err := cluster.Get(ctx, "", "pv", `{.items[?(@.spec.claimRef.namespace=="`+name+`")].metadata.name}`)
			if err != nil || pvs != "" {
				return fmt.Sprintf("PVs of namespace %s left: %q %v", name, pvs, err)
			}
			return ""
		})
	})
	return name
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)
	return c
}

func must(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func apply(t *testing.T, manifest string, a ...any) {
	t.Helper()
	must(t, "apply", cluster.Apply(ctx(t), fmt.Sprintf(manifest, a...)))
}

// testdata holds the manifests a reader can also apply by hand (each says
// how: envsubst fills its ${VARS}).
//
//go:embed testdata/*.yaml
var testdata embed.FS

var testdataVar = regexp.MustCompile(`\$\{[A-Z_]+\}`)

// applyFile applies testdata/name with its ${VARS} filled in; IMAGE is the
// dev cluster's busybox unless vars says otherwise. A variable left unset
// fails the test rather than applying an empty string.
func applyFile(t *testing.T, name string, vars map[string]string) {
	t.Helper()
	b, err := testdata.ReadFile("testdata/" + name)
	must(t, "read testdata/"+name, err)
	// Only ${UPPER_CASE} is a variable: a shell's $d in a pod's command
	// stays as it is (as with envsubst given the variables' names).
	manifest := testdataVar.ReplaceAllStringFunc(string(b), func(m string) string {
		v := m[2 : len(m)-1]
		if val, ok := vars[v]; ok {
			return val
		}
		if v == "IMAGE" {
			return devcluster.Image
		}
		t.Fatalf("testdata/%s uses %s, which the test does not set", name, m)
		return ""
	})
	must(t, "apply testdata/"+name, cluster.Apply(ctx(t), manifest))
}

func get(t *testing.T, ns, obj, jsonpath string) string {
	t.Helper()
	out, err := cluster.Get(ctx(t), ns, obj, jsonpath)
	must(t, "get "+obj, err)
	return out
}

func exec(t *testing.T, ns, pod, script string) string {
	t.Helper()
	out, err := cluster.Exec(ctx(t), ns, pod, script)
	must(t, "exec in "+pod+": "+script, err)
	return out
}

// eventually polls check until it returns "" or the timeout passes; the
// last non-empty answer says what was wrong.
func eventually(t *testing.T, timeout time.Duration, check func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	why := ""
	for time.Now().Before(deadline) {
		if why = check(); why == "" {
			return
		}
		time.Sleep(time.Second)
	}
	t.Fatalf("after %s: %s", timeout, why)
}

func podSpecYAML(volume string) string { return devcluster.PodSpec(2, "true", "vol", "/vol", volume) }

func writeString(path, s string) error { return os.WriteFile(path, []byte(s), 0o644) }

// pod creates a busybox pod that runs script with one volume.
func pod(t *testing.T, ns, name, script, volume string) {
	t.Helper()
	apply(t, "apiVersion: v1\nkind: Pod\nmetadata: {name: %s, namespace: %s}\nspec:\n%s", name, ns, devcluster.PodSpec(2, script, "vol", "/vol", volume))
}

func pvc(t *testing.T, ns, name, class, size, extra string) {
	t.Helper()
	apply(t, `apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: %s, namespace: %s}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: %s
  resources: {requests: {storage: %s}}
%s`, name, ns, class, size, extra)
}

func waitPod(t *testing.T, ns, name string) {
	t.Helper()
	// A controller's pod (a StatefulSet's) appears a moment after its
	// owner is applied, and kubectl wait fails at once on a pod that is
	// not there.
	eventually(t, time.Minute, func() string {
		out, err := cluster.RunKubectl(ctx(t), "-n", ns, "get", "pod", name, "--ignore-not-found", "-o", "name")
		if err != nil || strings.TrimSpace(out) == "" {
			return fmt.Sprintf("no pod %s/%s yet (%v)", ns, name, err)
		}
		return ""
	})
	must(t, "pod "+name+" ready", cluster.WaitPod(ctx(t), ns, name, 4*time.Minute))
}

func deletePod(t *testing.T, ns, name string) {
	t.Helper()
	_, err := cluster.RunKubectl(ctx(t), "-n", ns, "delete", "pod", name, "--wait=true", "--timeout=3m")
	must(t, "delete pod "+name, err)
}

// poolImages counts the volume images in the pools of all nodes.
func poolImages(t *testing.T) int {
	count := 0
	for _, node := range cluster.Nodes {
		ents, err := os.ReadDir(node.PoolDir() + "/volumes")
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		count += len(ents)
	}
	return count
}

// podNode is the dev cluster node the pod runs on.
func podNode(t *testing.T, ns, pod string) *devcluster.Node {
	t.Helper()
	name := get(t, ns, "pod/"+pod, "{.spec.nodeName}")
	node := cluster.Node(name)
	if node == nil {
		t.Fatalf("pod %s/%s runs on %q, not a node of the dev cluster (%v)", ns, pod, name, cluster.NodeNames())
	}
	return node
}

// checkNoRestarts fails the run if any container of podvol restarted: a
// crash, or a probe that fails (as a liveness probe aimed at the wrong
// address does on a real cluster), shows only as restarts.
func checkNoRestarts() int {
	out, restarted, err := podvolRestarts(context.Background())
	if err != nil {
		fmt.Fprintf(os.Stderr, "listing podvol's pods: %v\n", err)
		return 1
	}
	if restarted {
		fmt.Fprintf(os.Stderr, "podvol's containers restarted during the run (container=restarts per pod):\n%s\n", out)
		return 1
	}
	fmt.Fprintf(os.Stderr, "podvol's containers: no restarts\n%s\n", out)
	return 0
}

// podvolRestarts lists podvol's pods with each container's restarts
// (container=restarts) and says whether one restarted, or there is none.
func podvolRestarts(ctx context.Context) (out string, restarted bool, err error) {
	out, err = cluster.Get(ctx, "podvol-system", "pods",
		`{range .items[*]}{.metadata.name}{range .status.containerStatuses[*]}{" "}{.name}={.restartCount}{end}{"\n"}{end}`)
	if err != nil {
		return "", false, err
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		for _, f := range strings.Fields(line)[1:] {
			if !strings.HasSuffix(f, "=0") {
				restarted = true
			}
		}
	}
	return out, restarted || strings.TrimSpace(out) == "", nil
}
