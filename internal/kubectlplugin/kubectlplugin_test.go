package kubectlplugin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
	"sigs.k8s.io/yaml"

	"github.com/podvol/podvol/internal/names"
	"github.com/podvol/podvol/internal/topology"
)

const gi = int64(1) << 30

func node(name string, ready bool) *corev1.Node {
	s := corev1.ConditionFalse
	if ready {
		s = corev1.ConditionTrue
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: s}}}}
}

func csiNode(name string) *storagev1.CSINode {
	return &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{Name: names.Driver, NodeID: name}}}}
}

func capacity(node, class string, free int64) *storagev1.CSIStorageCapacity {
	return &storagev1.CSIStorageCapacity{ObjectMeta: metav1.ObjectMeta{Name: "csisc-" + node + "-" + class, Namespace: DefaultNamespace},
		StorageClassName: class, Capacity: resource.NewQuantity(free, resource.BinarySI),
		NodeTopology: &metav1.LabelSelector{MatchLabels: map[string]string{names.TopologyKey: node}}}
}

func class(name, direct string) *storagev1.StorageClass {
	c := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: names.Driver, Parameters: map[string]string{}}
	if direct != "" {
		c.Parameters[names.ParamDirectAssign] = direct
	}
	return c
}

func pv(name, handle, node, class, claim string, bytes int64) *corev1.PersistentVolume {
	p := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PersistentVolumeSpec{
		Capacity:               corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(bytes, resource.BinarySI)},
		StorageClassName:       class,
		PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: names.Driver, VolumeHandle: handle}},
		NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: names.TopologyKey, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}},
	}, Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeBound}}
	if claim != "" {
		ns, n, _ := strings.Cut(claim, "/")
		p.Spec.ClaimRef = &corev1.ObjectReference{Namespace: ns, Name: n}
	}
	return p
}

func pod(ns, name, node string, vols ...corev1.Volume) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{NodeName: node, Volumes: vols}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
}

func claimVol(name, claim string) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}
}

func inlineVol(name string, attrs map[string]string) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{Driver: names.Driver, VolumeAttributes: attrs}}}
}

func pluginPod(node string, ready bool, restarts int32, args ...string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: DefaultNamespace, Name: "podvol-node-" + node,
		Labels: map[string]string{"app.kubernetes.io/name": "podvol", "app.kubernetes.io/component": "node"}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: PluginContainer, Image: "example/podvol-plugin:v1.2.3", Args: args}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{Name: PluginContainer, Ready: ready, RestartCount: restarts,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}}}
	if restarts > 0 {
		p.Status.ContainerStatuses[0].LastTerminationState.Terminated = &corev1.ContainerStateTerminated{Reason: "Error",
			FinishedAt: metav1.NewTime(time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC))}
	}
	return p
}

func record(name, node string, data map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: DefaultNamespace, Name: name,
		Labels:      map[string]string{names.ReleasedLabel: "true", names.ReleasedNodeLabel: node},
		Annotations: map[string]string{names.ReleasedNodeAnnotation: node}}, Data: data}
}

func content(name, source, handle, snapshot string, bytes int64) *unstructured.Unstructured {
	ns, n, _ := strings.Cut(snapshot, "/")
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
		"metadata": map[string]any{"name": name},
		"spec": map[string]any{"driver": names.Driver, "source": map[string]any{"volumeHandle": source},
			"volumeSnapshotRef": map[string]any{"namespace": ns, "name": n}},
		"status": map[string]any{"snapshotHandle": handle, "restoreSize": bytes, "readyToUse": true},
	}}
}

func ptr[T any](v T) *T { return &v }

// cluster is three nodes: a (healthy, two PVs, a snapshot), b (an inline
// volume, a restarted plugin), c (lost and back without podvol, records).
func cluster(t *testing.T) Clients {
	t.Helper()
	deleting := node("d", true)
	deleting.DeletionTimestamp = ptr(metav1.Now())
	deleting.Finalizers = []string{names.NodeLossFinalizer}
	objs := []runtime.Object{
		node("a", true), node("b", true), node("c", false), deleting,
		csiNode("a"), csiNode("b"), csiNode("d"),
		capacity("a", "podvol", 5*gi), capacity("a", "podvol-xfs", 5*gi), capacity("b", "podvol", 9*gi),
		capacity("a", "other", 99*gi),
		class("podvol", ""), class("podvol-xfs", ""), class("podvol-direct", "auto"), class("kata-always", "always"),
		&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "other"}, Provisioner: "other.example.com"},
		pv("pv-1", "pv-aaa", "a", "podvol", "app/data", 1*gi),
		pv("pv-2", "pv-bbb", "a", "podvol-direct", "app/vm-disk", 2*gi),
		pv("pv-3", "pv-ccc", "b", "kata-always", "other/idle", gi/2),
		&corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "not-ours"}, Spec: corev1.PersistentVolumeSpec{
			Capacity:               corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("7Gi")},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: "other.example.com", VolumeHandle: "x"}}}},
		pod("app", "web", "a", claimVol("data", "data")),
		func() *corev1.Pod {
			p := pod("app", "vm", "a", claimVol("disk", "vm-disk"))
			p.Spec.RuntimeClassName = ptr("kata")
			return p
		}(),
		func() *corev1.Pod {
			p := pod("app", "done", "a", claimVol("data", "data"))
			p.Status.Phase = corev1.PodSucceeded
			return p
		}(),
		pod("tmp", "scratch", "b", inlineVol("s", map[string]string{"size": "100Mi"}), inlineVol("t", nil)),
		&nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "kata", Annotations: map[string]string{names.DirectAssignAnnotation: "true"}}, Handler: "kata"},
		pluginPod("a", true, 0),
		pluginPod("b", true, 2, "--node-id=b", "--inline-default-size=256Mi"),
		record("podvol-released-c", "c", map[string]string{
			"pv-old1": "volumeHandle=pv-111 claim=db/data-db-0 released=2026-12-01T10:00:00Z size=1073741824",
			"pv-old2": "volumeHandle=pv-222 claim=db/data-db-1 released=2026-12-01T10:00:01Z"}),
		record("podvol-released-c-x1", "c", map[string]string{"pv-old3": "volumeHandle=pv-333 claim= released=2026-12-01T10:00:02Z"}),
		record("podvol-released-a", "a", map[string]string{"pv-back": "volumeHandle=pv-444 claim=db/data-db-2 released=2026-12-01T11:00:00Z size=536870912"}),
	}
	scheme := runtime.NewScheme()
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme, map[schema.GroupVersionResource]string{contentsGVR: "VolumeSnapshotContentList"},
		content("snapcontent-1", "pv-aaa", "snap-1@a", "app/daily", gi),
		content("snapcontent-2", "pv-aaa", "snap-2", "app/hourly", gi/4),
		&unstructured.Unstructured{Object: map[string]any{"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
			"metadata": map[string]any{"name": "foreign"}, "spec": map[string]any{"driver": "other.example.com"}}})
	used := func(n uint64) *uint64 { return &n }
	return Clients{Kube: fake.NewClientset(objs...), Dynamic: dyn,
		Summary: func(_ context.Context, node string) (*statsv1alpha1.Summary, error) {
			switch node {
			case "a":
				return &statsv1alpha1.Summary{Pods: []statsv1alpha1.PodStats{
					{PodRef: statsv1alpha1.PodReference{Namespace: "app", Name: "web"}, VolumeStats: []statsv1alpha1.VolumeStats{
						{Name: "data", PVCRef: &statsv1alpha1.PVCReference{Namespace: "app", Name: "data"}, FsStats: statsv1alpha1.FsStats{UsedBytes: used(300 << 20)}}}},
				}}, nil
			case "b":
				return &statsv1alpha1.Summary{Pods: []statsv1alpha1.PodStats{
					{PodRef: statsv1alpha1.PodReference{Namespace: "tmp", Name: "scratch"}, VolumeStats: []statsv1alpha1.VolumeStats{
						{Name: "s", FsStats: statsv1alpha1.FsStats{UsedBytes: used(1 << 20)}}}},
				}}, nil
			}
			return nil, errors.New("forbidden: nodes/proxy")
		}}
}

func gather(t *testing.T) *State {
	t.Helper()
	st, err := Gather(context.Background(), cluster(t), DefaultNamespace, GatherOptions{Pods: true, Stats: true})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestStatus(t *testing.T) {
	rows := gather(t).Status()
	got := map[string]NodeStatus{}
	for _, r := range rows {
		got[r.Node] = r
	}
	if len(rows) != 4 || rows[0].Node != "a" || rows[3].Node != "d" {
		t.Fatalf("status rows: %+v, want nodes a, b, c, d in order", rows)
	}
	mi := int64(1) << 20
	for _, c := range []struct {
		node                                 string
		pool, free                           *int64
		allocated                            int64
		volumes, inline, snapshots, released int
		version                              string
		health                               []string
	}{
		// Two PVs (1Gi, 2Gi), two snapshots (1Gi; 256Mi whose handle
		// names no node, placed by its source volume) and a released
		// volume's image (512Mi).
		{"a", ptr(5*gi + 3*gi + gi + gi/4 + gi/2), ptr(5 * gi), 3*gi + gi + gi/4 + gi/2, 2, 0, 2, 1, "v1.2.3",
			[]string{"1 released volume(s) to reclaim (kubectl podvol released)"}},
		// A PV of 512Mi; inline volumes of 100Mi and of the plugin's
		// --inline-default-size, 256Mi.
		{"b", ptr(9*gi + gi/2 + 100*mi + 256*mi), ptr(9 * gi), gi/2 + 100*mi + 256*mi, 3, 2, 0, 0, "v1.2.3",
			[]string{"plugin restarted 2 times, last: Error at 2026-12-02T09:00:00Z"}},
		// Released volumes whose images are in its pool: one of 1Gi, and
		// two recorded without a size (an older podvol-controller).
		{"c", nil, nil, gi, 0, 0, 0, 3, "", []string{"Node not Ready", "no podvol-node pod"}},
		{"d", nil, nil, 0, 0, 0, 0, 0, "", []string{"Node being deleted (node-loss waits for its Lease)", "no podvol-node pod"}},
	} {
		r := got[c.node]
		eq := func(a, b *int64) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }
		if !eq(r.PoolBytes, c.pool) || !eq(r.FreeBytes, c.free) || r.AllocatedBytes != c.allocated {
			t.Errorf("node %s: pool %s free %s allocated %s, want %s %s %s", c.node, humanPtr(r.PoolBytes), humanPtr(r.FreeBytes), HumanBytes(r.AllocatedBytes),
				humanPtr(c.pool), humanPtr(c.free), HumanBytes(c.allocated))
		}
		if r.Volumes != c.volumes || r.InlineVolumes != c.inline || r.Snapshots != c.snapshots || r.Released != c.released || r.Version != c.version {
			t.Errorf("node %s: %+v, want volumes %d (inline %d), snapshots %d, released %d, version %s", c.node, r, c.volumes, c.inline, c.snapshots, c.released, c.version)
		}
		if strings.Join(r.Health, "|") != strings.Join(c.health, "|") {
			t.Errorf("node %s health: %q, want %q", c.node, r.Health, c.health)
		}
	}
	var out bytes.Buffer
	if err := PrintStatus(&out, OutputTable, rows); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 5 || !strings.HasPrefix(lines[0], "NODE ") || !strings.Contains(lines[1], "9.8Gi") || !strings.Contains(lines[2], "3 (2 inline)") ||
		!strings.HasSuffix(lines[1], "(kubectl podvol released)") {
		t.Errorf("status table:\n%s", out.String())
	}
}

func TestVolumes(t *testing.T) {
	st := gather(t)
	all := st.Volumes(VolumeFilter{})
	byName := map[string]Volume{}
	for _, v := range all {
		byName[v.Claim+v.Inline] = v
	}
	if len(all) != 5 {
		t.Fatalf("volumes: %+v, want 3 PVs and 2 inline volumes", all)
	}
	for _, c := range []struct {
		name, node, direct, used string
		pods, snaps              []string
	}{
		{"app/data", "a", "no", "300Mi", []string{"app/web"}, []string{"app/daily", "app/hourly"}},
		// directAssign: auto, used by a pod whose RuntimeClass takes
		// direct-assigned volumes.
		{"app/vm-disk", "a", "yes", "-", []string{"app/vm"}, nil},
		// directAssign: always; node b's kubelet measured nothing of it.
		{"other/idle", "b", "yes", "-", nil, nil},
		{"tmp/scratch/s", "b", "no", "1Mi", []string{"tmp/scratch"}, nil},
		{"tmp/scratch/t", "b", "no", "-", []string{"tmp/scratch"}, nil},
	} {
		v, ok := byName[c.name]
		if !ok {
			t.Errorf("no volume %s in %+v", c.name, all)
			continue
		}
		if v.Node != c.node || v.Direct != c.direct || humanPtr(v.UsedBytes) != c.used ||
			strings.Join(v.Pods, ",") != strings.Join(c.pods, ",") || strings.Join(v.Snapshots, ",") != strings.Join(c.snaps, ",") {
			t.Errorf("volume %s: %+v (used %s), want node %s direct %s used %s pods %v snapshots %v", c.name, v, humanPtr(v.UsedBytes), c.node, c.direct, c.used, c.pods, c.snaps)
		}
		if v.UsedBytes == nil && v.UsedUnknown == "" {
			t.Errorf("volume %s: used unknown without a reason", c.name)
		}
	}
	if got := st.Volumes(VolumeFilter{Namespace: "app"}); len(got) != 2 {
		t.Errorf("-n app: %+v, want app/data and app/vm-disk", got)
	}
	if got := st.Volumes(VolumeFilter{Node: "b"}); len(got) != 3 {
		t.Errorf("--node b: %+v, want 3", got)
	}
	var out, notes bytes.Buffer
	if err := PrintVolumes(&out, &notes, OutputTable, st.Volumes(VolumeFilter{Namespace: "app"})); err != nil {
		t.Fatal(err)
	}
	if want := "app        data     web   a     1Gi   300Mi  podvol         no      daily,hourly"; !strings.Contains(out.String(), want) {
		t.Errorf("volumes table:\n%s\nwant a line %q", out.String(), want)
	}
	if !strings.Contains(notes.String(), "USED -: not measured by the kubelet") {
		t.Errorf("no reason for USED -: %q", notes.String())
	}
}

// A kubelet's stats that cannot be read leave USED unknown, with why.
func TestVolumesUsedUnknownWithoutStats(t *testing.T) {
	c := cluster(t)
	c.Summary = func(context.Context, string) (*statsv1alpha1.Summary, error) {
		return nil, errors.New("nodes \"a\" is forbidden: cannot get resource \"nodes/proxy\"")
	}
	st, err := Gather(context.Background(), c, DefaultNamespace, GatherOptions{Pods: true, Stats: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range st.Volumes(VolumeFilter{Namespace: "app"}) {
		if v.UsedBytes != nil || !strings.Contains(v.UsedUnknown, "nodes/proxy") {
			t.Errorf("%s: used %v (%q), want unknown because nodes/proxy is refused", v.Claim, v.UsedBytes, v.UsedUnknown)
		}
	}
}

func TestReleased(t *testing.T) {
	rows := gather(t).Released()
	var got []string
	for _, r := range rows {
		got = append(got, strings.Join([]string{r.Node, r.PV, r.Handle, r.Claim, r.NodeState, r.Reclaim, r.Record}, " "))
	}
	want := []string{
		"a pv-back pv-444 db/data-db-2 back kubectl podvol reclaim a pv-back podvol-system/podvol-released-a",
		"c pv-old1 pv-111 db/data-db-0 not running podvol kubectl podvol reclaim c pv-old1 podvol-system/podvol-released-c",
		"c pv-old2 pv-222 db/data-db-1 not running podvol kubectl podvol reclaim c pv-old2 podvol-system/podvol-released-c",
		"c pv-old3 pv-333  not running podvol kubectl podvol reclaim c pv-old3 podvol-system/podvol-released-c-x1",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("released:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	st := &State{Records: []corev1.ConfigMap{*record("r", "gone", map[string]string{"pv-x": "volumeHandle=pv-9 claim=a/b released=t"})}}
	if r := st.Released(); len(r) != 1 || r[0].NodeState != "absent" {
		t.Errorf("record of a node not in the cluster: %+v", r)
	}
}

func TestOutputFormats(t *testing.T) {
	rows := gather(t).Released()
	for _, f := range []string{OutputJSON, OutputYAML} {
		var out bytes.Buffer
		if err := PrintReleased(&out, f, rows); err != nil {
			t.Fatal(err)
		}
		var doc struct{ Released []ReleasedVolume }
		if err := yaml.Unmarshal(out.Bytes(), &doc); err != nil {
			t.Fatalf("-o %s: %v\n%s", f, err, out.String())
		}
		if len(doc.Released) != len(rows) || doc.Released[0].Reclaim != rows[0].Reclaim {
			t.Errorf("-o %s: %+v", f, doc)
		}
	}
}

func TestHumanBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 1023: "1023", 1024: "1Ki", 1536: "1.5Ki", 64 << 20: "64Mi", 10*gi + gi/10: "10.1Gi", 3 << 40: "3Ti"} {
		if got := HumanBytes(n); got != want {
			t.Errorf("HumanBytes(%d) = %s, want %s", n, got, want)
		}
	}
}

// reclaimCluster is node n back with podvol and a record of pv-old (volume
// pv-111) released from it.
func reclaimCluster(extra ...runtime.Object) Clients {
	objs := append([]runtime.Object{node("n", true), csiNode("n"),
		record("podvol-released-n", "n", map[string]string{"pv-old": "volumeHandle=pv-111 claim=db/data released=2026-12-01T10:00:00Z"})}, extra...)
	return Clients{Kube: fake.NewClientset(objs...)}
}

// Each reclaim that must not happen is refused before anything is made.
func TestReclaimRefuses(t *testing.T) {
	inUse := node("n", true)
	inUse.Status.VolumesInUse = []corev1.UniqueVolumeName{"kubernetes.io/csi/podvol.io^pv-111"}
	deleting := node("n", true)
	deleting.DeletionTimestamp = ptr(metav1.Now())
	deleting.Finalizers = []string{"x"}
	for _, c := range []struct {
		name     string
		c        Clients
		node, pv string
		want     string
	}{
		{"not recorded on that node", reclaimCluster(), "n", "pv-other", "PV pv-other is not recorded as released from node n, which has pv-old"},
		{"no record for the node", reclaimCluster(node("m", true), csiNode("m")), "m", "pv-old", "no volume is recorded as released from node m"},
		{"node not back", Clients{Kube: fake.NewClientset(record("podvol-released-n", "n", map[string]string{"pv-old": "volumeHandle=pv-111"}))}, "n", "pv-old", "node n is not back"},
		{"node being deleted", Clients{Kube: fake.NewClientset(deleting, csiNode("n"), record("r", "n", map[string]string{"pv-old": "volumeHandle=pv-111"}))}, "n", "pv-old", "node n is being deleted"},
		{"podvol not running", Clients{Kube: fake.NewClientset(node("n", true), record("r", "n", map[string]string{"pv-old": "volumeHandle=pv-111"}))}, "n", "pv-old", "podvol does not run there yet"},
		{"kubelet still uses it", Clients{Kube: fake.NewClientset(inUse, csiNode("n"), record("r", "n", map[string]string{"pv-old": "volumeHandle=pv-111"}))}, "n", "pv-old", "still has volume pv-111 in use"},
		{"another PV names it", reclaimCluster(pv("recovered", "pv-111", "n", "podvol", "db/copy", gi)), "n", "pv-old", "PV recovered already names volume pv-111"},
		{"a PV of that name not ours", reclaimCluster(pv("reclaim-pv-111", "pv-111", "n", "podvol", "db/copy", gi)), "n", "pv-old", "exists and was not made by an earlier reclaim"},
	} {
		t.Run(c.name, func(t *testing.T) {
			asked := false
			err := Reclaim(context.Background(), c.c, c.node, c.pv, ReclaimOptions{Namespace: DefaultNamespace, Timeout: time.Second, Poll: 10 * time.Millisecond,
				Confirm: func(string) (bool, error) { asked = true; return true, nil }})
			if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Reclaim(%s, %s) = %v, want a refusal saying %q", c.node, c.pv, err, c.want)
			}
			if asked && !strings.Contains(c.want, "not made by an earlier reclaim") {
				t.Error("asked for confirmation of a reclaim that is refused")
			}
			pvcs, _ := c.c.Kube.CoreV1().PersistentVolumeClaims("").List(context.Background(), metav1.ListOptions{})
			if len(pvcs.Items) != 0 {
				t.Errorf("a refused reclaim made claims: %v", pvcs.Items)
			}
			cm, err := c.c.Kube.CoreV1().ConfigMaps(DefaultNamespace).List(context.Background(), metav1.ListOptions{})
			if err != nil || len(cm.Items) != 1 || len(cm.Items[0].Data) != 1 {
				t.Errorf("a refused reclaim changed the record: %v %v", cm, err)
			}
		})
	}
}

// No answer, or no, changes nothing; the question says what is lost.
func TestReclaimAsksFirst(t *testing.T) {
	c := reclaimCluster()
	var plan string
	err := Reclaim(context.Background(), c, "n", "pv-old", ReclaimOptions{Namespace: DefaultNamespace, Timeout: time.Second, Poll: 10 * time.Millisecond,
		Confirm: func(p string) (bool, error) { plan = p; return false, nil }})
	if !errors.Is(err, ErrNotConfirmed) {
		t.Fatalf("Reclaim answered no: %v", err)
	}
	if !strings.Contains(plan, "deletes volume pv-111 from the pool of node n, with its data") || !strings.Contains(plan, "claim db/data") {
		t.Errorf("the question: %q", plan)
	}
	if pvs, _ := c.Kube.CoreV1().PersistentVolumes().List(context.Background(), metav1.ListOptions{}); len(pvs.Items) != 0 {
		t.Errorf("made PVs without confirmation: %v", pvs.Items)
	}
}

// The objects the reclaim makes are the documented ones: a PV naming the
// volume on its node with the provisioner's annotation and Delete policy,
// and a claim bound to it. (Binding and deletion are Kubernetes' and the
// provisioner's: the e2e test NodeLost runs them.)
func TestReclaimMakesTheDocumentedObjects(t *testing.T) {
	c := reclaimCluster()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err := Reclaim(ctx, c, "n", "pv-old", ReclaimOptions{Namespace: DefaultNamespace, Timeout: 100 * time.Millisecond, Poll: 10 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "did not bind") {
		t.Fatalf("Reclaim with no PV controller: %v, want a claim that does not bind", err)
	}
	p, err := c.Kube.CoreV1().PersistentVolumes().Get(context.Background(), "reclaim-pv-111", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Annotations["pv.kubernetes.io/provisioned-by"] != names.Driver || p.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete ||
		topology.Node(p) != "n" || p.Spec.CSI.VolumeHandle != "pv-111" || p.Spec.ClaimRef.Name != "reclaim-pv-111" || p.Spec.ClaimRef.Namespace != DefaultNamespace {
		t.Errorf("PV: %+v", p)
	}
	pvc, err := c.Kube.CoreV1().PersistentVolumeClaims(DefaultNamespace).Get(context.Background(), "reclaim-pv-111", metav1.GetOptions{})
	if err != nil || pvc.Spec.VolumeName != "reclaim-pv-111" || *pvc.Spec.StorageClassName != "" {
		t.Errorf("claim: %+v %v", pvc, err)
	}
	// Run again, it takes up what it made rather than refusing.
	err = Reclaim(ctx, c, "n", "pv-old", ReclaimOptions{Namespace: DefaultNamespace, Timeout: 50 * time.Millisecond, Poll: 10 * time.Millisecond})
	if errors.Is(err, ErrRefused) {
		t.Errorf("a second run refused: %v", err)
	}
}

// dropEntry removes one entry, and the record with the last.
func TestDropEntry(t *testing.T) {
	c := Clients{Kube: fake.NewClientset(record("r", "n", map[string]string{"pv-1": "volumeHandle=a", "pv-2": "volumeHandle=b"}))}
	ctx := context.Background()
	for i, pv := range []string{"pv-1", "pv-2"} {
		if err := dropEntry(ctx, c, DefaultNamespace, &ReleasedVolume{PV: pv, Record: DefaultNamespace + "/r"}); err != nil {
			t.Fatal(err)
		}
		cm, err := c.Kube.CoreV1().ConfigMaps(DefaultNamespace).Get(ctx, "r", metav1.GetOptions{})
		if i == 0 && (err != nil || len(cm.Data) != 1 || cm.Data["pv-2"] == "") {
			t.Errorf("after dropping pv-1: %v %v", cm, err)
		}
		if i == 1 && err == nil {
			t.Errorf("the emptied record is still there: %v", cm)
		}
	}
}

func TestMainRefusesBadUse(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"status", "-o", "wide"}, "-o wide: want one of table, json, yaml"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"reclaim", "node-1"}, "reclaim takes NODE and PV"},
		{[]string{"status", "extra"}, "status takes no arguments"},
		{[]string{"--kubeconfig", "/nonexistent/kubeconfig", "status"}, "kubeconfig"},
	} {
		var out, errb bytes.Buffer
		if code := Main(c.args, strings.NewReader(""), &out, &errb); code != 1 || !strings.Contains(errb.String(), c.want) {
			t.Errorf("kubectl podvol %v: exit %d, stderr %q, want 1 and %q", c.args, code, errb.String(), c.want)
		}
	}
}

// What this package takes from deploy/base is what deploy/base says.
func TestDeployBaseNames(t *testing.T) {
	b, err := os.ReadFile("../../deploy/base/node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var ds struct {
		Spec struct {
			Template struct {
				Metadata struct{ Labels map[string]string }
				Spec     struct {
					Containers []struct {
						Name string
						Args []string
					}
				}
			}
		}
	}
	if err := yaml.Unmarshal(b, &ds); err != nil {
		t.Fatal(err)
	}
	for _, kv := range strings.Split(NodePodSelector, ",") {
		k, v, _ := strings.Cut(kv, "=")
		if ds.Spec.Template.Metadata.Labels[k] != v {
			t.Errorf("podvol-node's pods are not labelled %s (labels %v)", kv, ds.Spec.Template.Metadata.Labels)
		}
	}
	found := false
	for _, c := range ds.Spec.Template.Spec.Containers {
		found = found || c.Name == PluginContainer
	}
	if !found {
		t.Errorf("no container %s in podvol-node", PluginContainer)
	}
	// deploy/base is the chart rendered for its namespace.
	k, err := os.ReadFile("../../deploy/base/node.yaml")
	if err != nil || !strings.Contains(string(k), "namespace: "+DefaultNamespace+"\n") {
		t.Errorf("deploy/base does not put podvol in %s (%v)", DefaultNamespace, err)
	}
	p, err := os.ReadFile("../../cmd/podvol-plugin/main.go")
	if err != nil || !strings.Contains(string(p), `"inline-default-size", "`+defaultInlineSize+`"`) || !strings.HasPrefix(inlineSizeFlag, "--inline-default-size") {
		t.Errorf("the plugin's --inline-default-size or its default %s changed (%v)", defaultInlineSize, err)
	}
}

// A node's pools each get a line: the default one always, another where a
// class of it has capacity on the node or the node holds something of it.
// Each object counts in the pool its handle (or an inline volume's
// attribute) names, and each pool's free space is its classes' capacity.
func TestStatusPerPool(t *testing.T) {
	fast := class("podvol-fast", "")
	fast.Parameters[names.ParamPool] = "fast"
	inline := corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{Driver: names.Driver,
		VolumeAttributes: map[string]string{"size": "1Gi", names.ParamPool: "fast"}}}}
	p := pod("ns", "user", "a", inline)
	p.Status.Phase = corev1.PodRunning
	st := &State{
		Nodes:   []corev1.Node{*node("a", true), *node("b", true)},
		Classes: []storagev1.StorageClass{*class("podvol", ""), *fast},
		Capacities: []storagev1.CSIStorageCapacity{*capacity("a", "podvol", 5*gi), *capacity("a", "podvol-fast", 2*gi),
			*capacity("b", "podvol", 7*gi), *capacity("b", "podvol-fast", 0)},
		PVs: []corev1.PersistentVolume{*pv("pv-a", "pv-0123456789abcdef01234567", "a", "podvol", "ns/a", gi),
			*pv("pv-b", "pv-fast-0123456789abcdef01234567", "a", "podvol-fast", "ns/b", 3*gi)},
		Pods:     []corev1.Pod{*p},
		Contents: []Content{{Name: "c", Handle: "snap-fast-0123456789abcdef01234567@a", RestoreBytes: 3 * gi, Ready: true}},
	}
	rows := st.Status()
	var got []string
	for _, r := range rows {
		got = append(got, fmt.Sprintf("%s/%s size %s allocated %s free %s volumes %d inline %d snapshots %d",
			r.Node, r.Pool, humanPtr(r.PoolBytes), HumanBytes(r.AllocatedBytes), humanPtr(r.FreeBytes), r.Volumes, r.InlineVolumes, r.Snapshots))
	}
	want := []string{
		"a/default size 6Gi allocated 1Gi free 5Gi volumes 1 inline 0 snapshots 0",
		"a/fast size 9Gi allocated 7Gi free 2Gi volumes 2 inline 1 snapshots 1",
		"b/default size 7Gi allocated 0 free 7Gi volumes 0 inline 0 snapshots 0",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("status:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	var out bytes.Buffer
	if err := PrintStatus(&out, OutputTable, rows); err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^a +fast +9Gi +7Gi +2Gi +2 \(1 inline\) +1 `).MatchString(out.String()) {
		t.Errorf("status table has no line for pool fast of node a:\n%s", out.String())
	}
}
