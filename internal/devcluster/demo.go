package devcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/podvol/podvol/internal/kubectlplugin"
	"github.com/podvol/podvol/internal/names"
)

// Image is the busybox image every demo and e2e pod runs.
const Image = "localhost/busybox:podvol"

// Apply applies a manifest.
func (c *Cluster) Apply(ctx context.Context, manifest string) error {
	f, err := os.CreateTemp(c.path("run"), "manifest-*.yaml")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.WriteString(manifest); err != nil {
		return err
	}
	f.Close()
	_, err = c.kubectl(ctx, "apply", "-f", f.Name())
	return err
}

// WaitPod waits until the pod is Ready.
func (c *Cluster) WaitPod(ctx context.Context, ns, name string, timeout time.Duration) error {
	_, err := c.kubectl(ctx, "-n", ns, "wait", "--for=condition=Ready", "--timeout="+timeout.String(), "pod/"+name)
	if err != nil {
		desc, _ := c.kubectl(ctx, "-n", ns, "describe", "pod", name)
		return fmt.Errorf("%w\n%s", err, lastLines(desc, 25))
	}
	return nil
}

// Exec runs a shell command in a pod and returns its output.
func (c *Cluster) Exec(ctx context.Context, ns, pod, script string) (string, error) {
	out, err := c.kubectl(ctx, "-n", ns, "exec", pod, "--", "sh", "-c", script)
	return strings.TrimSpace(out), err
}

// Get returns a jsonpath of an object.
func (c *Cluster) Get(ctx context.Context, ns, obj, jsonpath string) (string, error) {
	args := []string{"get", obj, "-o", "jsonpath=" + jsonpath}
	if ns != "" {
		args = append([]string{"-n", ns}, args...)
	}
	out, err := c.kubectl(ctx, args...)
	return strings.TrimSpace(out), err
}

// PodSpec is the spec of a busybox pod that runs script, then sleeps, with
// one volume mounted at path, indented by n spaces. volume is the volume's
// definition below its name, at indentation 0 (e.g. "csi:\n  driver: ...").
// The pod is Ready only once script has finished, so that what it wrote can
// be read.
func PodSpec(n int, script, name, path, volume string) string {
	s := fmt.Sprintf(`terminationGracePeriodSeconds: 1
containers:
- name: main
  image: %s
  imagePullPolicy: IfNotPresent
  command: ["sh", "-c", %q]
  readinessProbe: {exec: {command: [test, -e, /tmp/ready]}, periodSeconds: 1}
  volumeMounts: [{name: %s, mountPath: %s}]
`, Image, script+" && touch /tmp/ready && exec sleep 36000", name, path)
	if volume != "" {
		s += "volumes:\n- name: " + name + "\n" + indent(volume, 2) + "\n"
	}
	return indent(s, n)
}

type demoRow struct{ lifecycle, objects, where, result string }

// Demo walks through every volume lifecycle on the running cluster, checking
// each, and ends with a table.
func (c *Cluster) Demo(ctx context.Context) error {
	const ns = "podvol-demo"
	steps := []struct {
		name string
		run  func() (objects, where string, err error)
	}{
		{"generic ephemeral volume (Deployment)", func() (string, string, error) { return c.demoGenericEphemeral(ctx, ns) }},
		{"CSI inline ephemeral volume (Pod)", func() (string, string, error) { return c.demoInline(ctx, ns) }},
		{"persistent volume (StatefulSet), pod restarted", func() (string, string, error) { return c.demoStatefulSet(ctx, ns) }},
		{"snapshot and restore", func() (string, string, error) { return c.demoSnapshot(ctx, ns) }},
		{"restore on another node (data pulled)", func() (string, string, error) { return c.demoRestoreElsewhere(ctx, ns) }},
		{"clone", func() (string, string, error) { return c.demoClone(ctx, ns) }},
		{"ephemeral clone, reset when its pod goes", func() (string, string, error) { return c.demoEphemeralClone(ctx, ns) }},
		{"online resize (xfs)", func() (string, string, error) { return c.demoResize(ctx, ns) }},
		{"a second pool (class " + FastClass + ")", func() (string, string, error) { return c.demoDeviceClass(ctx, ns) }},
		{"drain with data (the StatefulSet's volume follows)", func() (string, string, error) { return c.demoDrain(ctx, ns) }},
	}
	fmt.Fprintf(c.Out, "\n== podvol demo: every lifecycle, in namespace %s\n", ns)
	_, _ = c.kubectl(ctx, "delete", "namespace", ns, "--ignore-not-found", "--wait=true", "--timeout=2m")
	if _, err := c.kubectl(ctx, "create", "namespace", ns); err != nil {
		return err
	}
	var rows []demoRow
	failed := 0
	start := time.Now()
	for i, s := range steps {
		fmt.Fprintf(c.Out, "[%d/%d] %s (%s so far)\n", i+1, len(steps), s.name, time.Since(start).Round(time.Second))
		objects, where, err := s.run()
		r := demoRow{s.name, objects, where, "pass"}
		if err != nil {
			failed++
			r.result = "FAIL"
			fmt.Fprintf(c.Out, "      FAILED: %v\n", err)
		}
		rows = append(rows, r)
	}
	fmt.Fprintln(c.Out)
	tw := tabwriter.NewWriter(c.Out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "LIFECYCLE\tOBJECTS\tWHERE THE VOLUME LIVES\tRESULT")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.lifecycle, r.objects, r.where, r.result)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(c.Out, "\nLook around: export KUBECONFIG=%s PATH=%s:%s:$PATH; kubectl -n %s get pods,pvc,volumesnapshots; kubectl podvol volumes -n %s\nTear down: make down\n",
		c.Kubeconfig(), filepath.Dir(c.Kubectl()), c.KubectlPodvolDir(), ns, ns)
	// The admin's view of the pools the demo used, through the kubectl
	// plugin (docs/operations.md, "kubectl podvol"), once it has caught up.
	if err := c.capacityCaughtUp(ctx); err != nil {
		fmt.Fprintf(c.Out, "\n(%v)\n", err)
	}
	fmt.Fprintf(c.Out, "\n$ kubectl podvol status\n")
	out, _, statusErr := c.KubectlPodvol(ctx, nil, "status")
	fmt.Fprint(c.Out, out)
	if failed > 0 {
		return fmt.Errorf("%d of %d lifecycles failed", failed, len(steps))
	}
	return statusErr
}

// where tells on which node and in which image file a PVC's volume lives.
func (c *Cluster) where(ctx context.Context, ns, pvc string) string {
	pv, _ := c.Get(ctx, ns, "pvc/"+pvc, "{.spec.volumeName}")
	node, _ := c.Get(ctx, "", "pv/"+pv, "{.spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values[0]}")
	handle, _ := c.Get(ctx, "", "pv/"+pv, "{.spec.csi.volumeHandle}")
	dir := c.poolOf(node)
	if n := c.Node(node); n != nil && strings.HasPrefix(handle, "pv-"+FastPool+"-") {
		dir = n.FastPoolDir()
	}
	return fmt.Sprintf("node %s, %s/volumes/%s.img", node, dir, handle)
}

// demoDeviceClass: a claim of the class whose pool only some nodes have
// lands on one of them, in that pool.
func (c *Cluster) demoDeviceClass(ctx context.Context, ns string) (string, string, error) {
	err := c.Apply(ctx, fmt.Sprintf(`apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: fast, namespace: %s}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: %s
  resources: {requests: {storage: 256Mi}}
---
apiVersion: v1
kind: Pod
metadata: {name: fast, namespace: %s}
spec:
%s`, ns, FastClass, ns, PodSpec(2, "echo fast > /data/hello", "data", "/data", "persistentVolumeClaim: {claimName: fast}")))
	if err != nil {
		return "", "", err
	}
	if err := c.WaitPod(ctx, ns, "fast", 3*time.Minute); err != nil {
		return "", "", err
	}
	if out, err := c.Exec(ctx, ns, "fast", "cat /data/hello"); err != nil || out != "fast" {
		return "", "", fmt.Errorf("read back %q: %w", out, err)
	}
	return "PVC fast of class " + FastClass + " (pool " + FastPool + ", not on every node)", c.where(ctx, ns, "fast"), nil
}

func (c *Cluster) demoGenericEphemeral(ctx context.Context, ns string) (string, string, error) {
	err := c.Apply(ctx, fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: scratch, namespace: %s}
spec:
  replicas: 1
  selector: {matchLabels: {app: scratch}}
  template:
    metadata: {labels: {app: scratch}}
    spec:
%s`, ns, PodSpec(6, "echo scratch > /scratch/hello", "scratch", "/scratch", `ephemeral:
  volumeClaimTemplate:
    spec:
      accessModes: [ReadWriteOnce]
      storageClassName: podvol
      resources: {requests: {storage: 256Mi}}`)))
	if err != nil {
		return "", "", err
	}
	if _, err := c.kubectl(ctx, "-n", ns, "rollout", "status", "deployment/scratch", "--timeout=3m"); err != nil {
		return "", "", err
	}
	pod, err := c.Get(ctx, ns, "pods", "{.items[0].metadata.name}")
	if err != nil {
		return "", "", err
	}
	out, err := c.Exec(ctx, ns, pod, "cat /scratch/hello")
	if err != nil || out != "scratch" {
		return "", "", fmt.Errorf("read back %q: %w", out, err)
	}
	owner, _ := c.Get(ctx, ns, "pvc/"+pod+"-scratch", "{.metadata.ownerReferences[0].name}")
	if owner != pod {
		return "", "", fmt.Errorf("PVC %s-scratch is owned by %q, not the pod", pod, owner)
	}
	return "Deployment scratch, Pod " + pod + ", PVC " + pod + "-scratch (owned by the pod)", c.where(ctx, ns, pod+"-scratch"), nil
}

func (c *Cluster) demoInline(ctx context.Context, ns string) (string, string, error) {
	err := c.Apply(ctx, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: inline, namespace: %s}
spec:
%s`, ns, PodSpec(2, "echo inline > /scratch/hello", "scratch", "/scratch", `csi:
  driver: podvol.io
  volumeAttributes: {size: 128Mi}`)))
	if err != nil {
		return "", "", err
	}
	if err := c.WaitPod(ctx, ns, "inline", 3*time.Minute); err != nil {
		return "", "", err
	}
	out, err := c.Exec(ctx, ns, "inline", "cat /scratch/hello && df -h /scratch | tail -1")
	if err != nil || !strings.HasPrefix(out, "inline") {
		return "", "", fmt.Errorf("read back %q: %w", out, err)
	}
	node, _ := c.Get(ctx, ns, "pod/inline", "{.spec.nodeName}")
	return "Pod inline (volumes[].csi, no PVC)", "node " + node + ", an image in " + c.poolOf(node) + "/volumes, deleted with the pod", nil
}

// DBStatefulSet is a StatefulSet "db" of one busybox pod running script,
// with a volume "data" of class and size mounted at path.
func DBStatefulSet(ns, class, size, script, path string) string {
	return fmt.Sprintf(`apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db, namespace: %s}
spec:
  serviceName: db
  replicas: 1
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec:
%s  volumeClaimTemplates:
  - metadata: {name: data}
    spec:
      accessModes: [ReadWriteOnce]
      storageClassName: %s
      resources: {requests: {storage: %s}}
`, ns, PodSpec(6, script, "data", path, ""), class, size)
}

// MigratingDBStatefulSet is DBStatefulSet whose claims follow their pod
// off a drained node (names.MigrateOnDrain).
func MigratingDBStatefulSet(ns, class, size, script, path string) string {
	return strings.Replace(DBStatefulSet(ns, class, size, script, path), "  - metadata: {name: data}\n",
		fmt.Sprintf("  - metadata: {name: data, annotations: {%s: \"true\"}}\n", names.MigrateOnDrain), 1)
}

func (c *Cluster) demoStatefulSet(ctx context.Context, ns string) (string, string, error) {
	err := c.Apply(ctx, DBStatefulSet(ns, "podvol-xfs", "512Mi", "test -f /data/rows || echo 'row 1' > /data/rows", "/data"))
	if err != nil {
		return "", "", err
	}
	if err := c.waitSts(ctx, ns); err != nil {
		return "", "", err
	}
	if _, err := c.kubectl(ctx, "-n", ns, "delete", "pod", "db-0", "--wait=true"); err != nil {
		return "", "", err
	}
	if err := c.waitSts(ctx, ns); err != nil {
		return "", "", err
	}
	out, err := c.Exec(ctx, ns, "db-0", "cat /data/rows")
	if err != nil || out != "row 1" {
		return "", "", fmt.Errorf("after the pod's restart: %q: %w", out, err)
	}
	return "StatefulSet db, PVC data-db-0 (podvol-xfs)", c.where(ctx, ns, "data-db-0"), nil
}

func (c *Cluster) waitSts(ctx context.Context, ns string) error {
	if _, err := c.kubectl(ctx, "-n", ns, "rollout", "status", "statefulset/db", "--timeout=3m"); err != nil {
		return err
	}
	return c.WaitPod(ctx, ns, "db-0", 3*time.Minute)
}

// readerPod runs a pod that mounts pvc and prints the file.
func (c *Cluster) readerPod(ctx context.Context, ns, name, pvc string) (string, error) {
	err := c.Apply(ctx, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s}
spec:
%s`, name, ns, PodSpec(2, "true", "data", "/data", "persistentVolumeClaim: {claimName: "+pvc+"}")))
	if err != nil {
		return "", err
	}
	if err := c.WaitPod(ctx, ns, name, 3*time.Minute); err != nil {
		return "", err
	}
	return c.Exec(ctx, ns, name, "cat /data/rows")
}

func (c *Cluster) demoSnapshot(ctx context.Context, ns string) (string, string, error) {
	err := c.Apply(ctx, fmt.Sprintf(`apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: db-snap, namespace: %[1]s}
spec:
  volumeSnapshotClassName: podvol
  source: {persistentVolumeClaimName: data-db-0}
`, ns))
	if err != nil {
		return "", "", err
	}
	if _, err := c.kubectl(ctx, "-n", ns, "wait", "--for=jsonpath={.status.readyToUse}=true", "--timeout=3m", "volumesnapshot/db-snap"); err != nil {
		return "", "", err
	}
	// Written after the snapshot: the restore must not see it.
	if _, err := c.Exec(ctx, ns, "db-0", "echo 'row 2' >> /data/rows"); err != nil {
		return "", "", err
	}
	err = c.Apply(ctx, fmt.Sprintf(`apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: db-restore, namespace: %s}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: podvol-xfs
  resources: {requests: {storage: 512Mi}}
  dataSource: {apiGroup: snapshot.storage.k8s.io, kind: VolumeSnapshot, name: db-snap}
`, ns))
	if err != nil {
		return "", "", err
	}
	out, err := c.readerPod(ctx, ns, "restore-reader", "db-restore")
	if err != nil || out != "row 1" {
		return "", "", fmt.Errorf("restored volume holds %q, want the data at the snapshot: %w", out, err)
	}
	return "VolumeSnapshot db-snap, PVC db-restore", c.where(ctx, ns, "db-restore") + " (reflink of the snapshot)", nil
}

// demoRestoreElsewhere restores db-snap for a pod that can run only on
// another node than the snapshot's: that node's plugin pulls the data.
func (c *Cluster) demoRestoreElsewhere(ctx context.Context, ns string) (string, string, error) {
	content, err := c.Get(ctx, ns, "volumesnapshot/db-snap", "{.status.boundVolumeSnapshotContentName}")
	if err != nil {
		return "", "", err
	}
	handle, err := c.Get(ctx, "", "volumesnapshotcontent/"+content, "{.status.snapshotHandle}")
	if err != nil {
		return "", "", err
	}
	_, source, _ := strings.Cut(handle, "@")
	other := ""
	for _, n := range c.Nodes {
		if n.Name != source {
			other = n.Name
			break
		}
	}
	if other == "" {
		return "", "", fmt.Errorf("no node but %s to restore on", source)
	}
	err = c.Apply(ctx, fmt.Sprintf(`apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: db-restore-elsewhere, namespace: %[1]s}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: podvol-xfs
  resources: {requests: {storage: 512Mi}}
  dataSource: {apiGroup: snapshot.storage.k8s.io, kind: VolumeSnapshot, name: db-snap}
---
apiVersion: v1
kind: Pod
metadata: {name: elsewhere-reader, namespace: %[1]s}
spec:
  nodeSelector: {%[2]s: %[3]s}
%[4]s`, ns, names.TopologyKey, other, PodSpec(2, "true", "data", "/data", "persistentVolumeClaim: {claimName: db-restore-elsewhere}")))
	if err != nil {
		return "", "", err
	}
	if err := c.WaitPod(ctx, ns, "elsewhere-reader", 3*time.Minute); err != nil {
		return "", "", err
	}
	out, err := c.Exec(ctx, ns, "elsewhere-reader", "cat /data/rows")
	if err != nil || out != "row 1" {
		return "", "", fmt.Errorf("the restore on %s holds %q, want the data at the snapshot: %w", other, out, err)
	}
	return "PVC db-restore-elsewhere, pod pinned to " + other, c.where(ctx, ns, "db-restore-elsewhere") + " (pulled from " + source + ")", nil
}

// demoDrain: the StatefulSet's claim is annotated to follow its pod; the
// drain of the pod's node evicts it, and it starts on another node with
// its data, its claim bound to the volume's copy there.
func (c *Cluster) demoDrain(ctx context.Context, ns string) (string, string, error) {
	from, err := c.Get(ctx, ns, "pod/db-0", "{.spec.nodeName}")
	if err != nil {
		return "", "", err
	}
	rows, err := c.Exec(ctx, ns, "db-0", "cat /data/rows")
	if err != nil {
		return "", "", err
	}
	if _, err := c.kubectl(ctx, "-n", ns, "annotate", "pvc", "data-db-0", names.MigrateOnDrain+"=true", "--overwrite"); err != nil {
		return "", "", err
	}
	defer func() { _, _ = c.kubectl(context.WithoutCancel(ctx), "uncordon", from) }()
	if out, err := c.kubectl(ctx, "drain", from, "--ignore-daemonsets", "--delete-emptydir-data", "--pod-selector=app=db", "--timeout=3m"); err != nil {
		return "", "", fmt.Errorf("kubectl drain %s: %w\n%s", from, err, out)
	}
	for deadline := time.Now().Add(5 * time.Minute); ; time.Sleep(2 * time.Second) {
		node, _ := c.Get(ctx, ns, "pod/db-0", "{.spec.nodeName}")
		if node != "" && node != from {
			break
		}
		if time.Now().After(deadline) {
			events, _ := c.kubectl(ctx, "-n", ns, "get", "events", "--field-selector=involvedObject.kind=PersistentVolumeClaim", "--sort-by=.lastTimestamp")
			return "", "", fmt.Errorf("after 5 minutes db-0 is not on another node than %s:\n%s", from, lastLines(events, 15))
		}
	}
	if err := c.WaitPod(ctx, ns, "db-0", 3*time.Minute); err != nil {
		return "", "", err
	}
	out, err := c.Exec(ctx, ns, "db-0", "cat /data/rows")
	if err != nil {
		return "", "", err
	}
	if out != rows {
		return "", "", fmt.Errorf("db-0 after the drain holds %q, want the rows it had (%q)", out, rows)
	}
	return "StatefulSet db, claim annotated " + names.MigrateOnDrain + ", kubectl drain " + from, c.where(ctx, ns, "data-db-0") + " (moved from " + from + ")", nil
}

// cloneOfDB creates a PVC that clones data-db-0, with annotations (YAML
// flow mapping entries, may be empty).
func (c *Cluster) cloneOfDB(ctx context.Context, ns, name, annotations string) error {
	return c.Apply(ctx, fmt.Sprintf(`apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: %s, namespace: %s, annotations: {%s}}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: podvol-xfs
  resources: {requests: {storage: 512Mi}}
  dataSource: {kind: PersistentVolumeClaim, name: data-db-0}
`, name, ns, annotations))
}

func (c *Cluster) demoClone(ctx context.Context, ns string) (string, string, error) {
	if err := c.cloneOfDB(ctx, ns, "db-clone", ""); err != nil {
		return "", "", err
	}
	out, err := c.readerPod(ctx, ns, "clone-reader", "db-clone")
	if err != nil || out != "row 1\nrow 2" {
		return "", "", fmt.Errorf("clone holds %q, want the source's data: %w", out, err)
	}
	return "PVC db-clone (dataSource: PVC data-db-0)", c.where(ctx, ns, "db-clone") + " (reflink of the source)", nil
}

// demoEphemeralClone: podvol-controller gives a clone back to the next pod
// as a fresh copy of its source, whatever the last pod wrote.
func (c *Cluster) demoEphemeralClone(ctx context.Context, ns string) (string, string, error) {
	if err := c.cloneOfDB(ctx, ns, "db-scratch", names.Lifecycle+": "+names.ResetOnDetach); err != nil {
		return "", "", err
	}
	if _, err := c.readerPod(ctx, ns, "scratch-user", "db-scratch"); err != nil {
		return "", "", err
	}
	if _, err := c.Exec(ctx, ns, "scratch-user", "echo scribbled >> /data/rows"); err != nil {
		return "", "", err
	}
	if _, err := c.kubectl(ctx, "-n", ns, "delete", "pod", "scratch-user", "--wait=true", "--timeout=2m"); err != nil {
		return "", "", err
	}
	err := waitFor("podvol-controller to reset PVC db-scratch", 2*time.Minute, func() error {
		if n, _ := c.Get(ctx, ns, "pvc/db-scratch", "{.metadata.annotations.podvol\\.io/reset-count}"); n != "1" {
			return fmt.Errorf("reset count %q: %w", n, errNotYet)
		}
		return nil
	})
	if err != nil {
		return "", "", err
	}
	out, err := c.readerPod(ctx, ns, "scratch-next", "db-scratch")
	if err != nil || out != "row 1\nrow 2" {
		return "", "", fmt.Errorf("the next pod's clone holds %q, want the source's data without the last pod's writes: %w", out, err)
	}
	return "PVC db-scratch (podvol.io/lifecycle: reset-on-detach), Pod scratch-user writes, Pod scratch-next sees the source",
		c.where(ctx, ns, "db-scratch") + " (a fresh reflink for each pod)", nil
}

func (c *Cluster) demoResize(ctx context.Context, ns string) (string, string, error) {
	if _, err := c.kubectl(ctx, "-n", ns, "patch", "pvc", "data-db-0", "--type=merge", "-p", `{"spec":{"resources":{"requests":{"storage":"1Gi"}}}}`); err != nil {
		return "", "", err
	}
	var size string
	err := waitFor("the pod to see its volume grow to 1 GiB", 3*time.Minute, func() error {
		out, err := c.Exec(ctx, ns, "db-0", "df -k /data | tail -1 | awk '{print $2}'")
		if err != nil {
			return err
		}
		size = out
		var kb int
		if _, err := fmt.Sscan(out, &kb); err != nil {
			return fmt.Errorf("filesystem size %q: %w", out, err)
		}
		if kb < 900*1024 {
			return fmt.Errorf("filesystem is %s KiB: %w", out, errNotYet)
		}
		return nil
	})
	if err != nil {
		return "", "", err
	}
	out, err := c.Exec(ctx, ns, "db-0", "cat /data/rows")
	if err != nil || !strings.HasPrefix(out, "row 1") {
		return "", "", fmt.Errorf("data after resize: %q: %w", out, err)
	}
	return "PVC data-db-0 512Mi -> 1Gi while db-0 runs", c.where(ctx, ns, "data-db-0") + " (" + size + " KiB now)", nil
}

func indent(s string, n int) string {
	pad := strings.Repeat(" ", n)
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if l != "" {
			lines[i] = pad + l
		}
	}
	return strings.Join(lines, "\n")
}

// poolOf is the host path of the named node's pool.
func (c *Cluster) poolOf(node string) string {
	if n := c.Node(node); n != nil {
		return n.PoolDir()
	}
	return "(node " + node + " is not one of the dev cluster's)"
}

// poolCapacity finds a pool's capacity in the plugin's metrics; %s is
// the pool's name, quoted for a regular expression.
const poolCapacity = `(?m)^podvol_pool_capacity_bytes\{[^}]*pool="%s"[^}]*\} (\S+)$`

// capacityCaughtUp waits until the pool size kubectl podvol shows for each
// node (free space from CSIStorageCapacity plus what the API says is
// allocated) is the size the node's plugin exports: external-provisioner
// refreshes CSIStorageCapacity every minute, so right after the demo's last
// resize the free space it shows is behind.
func (c *Cluster) capacityCaughtUp(ctx context.Context) error {
	return waitFor("the pools' free space in CSIStorageCapacity, refreshed every minute", 90*time.Second, func() error {
		out, _, err := c.KubectlPodvol(ctx, nil, "status", "-o", "json")
		if err != nil {
			return err
		}
		var doc struct{ Nodes []kubectlplugin.NodeStatus }
		if err := json.Unmarshal([]byte(out), &doc); err != nil {
			return err
		}
		for _, s := range doc.Nodes {
			n := c.Node(s.Node)
			if n == nil {
				continue
			}
			page, err := n.FetchMetrics(ctx, PluginMetrics)
			if err != nil {
				return err
			}
			m := regexp.MustCompile(fmt.Sprintf(poolCapacity, regexp.QuoteMeta(s.Pool))).FindStringSubmatch(page)
			if m == nil {
				return fmt.Errorf("node %s's plugin exports no capacity of pool %s", s.Node, s.Pool)
			}
			want, _ := strconv.ParseFloat(m[1], 64)
			if s.PoolBytes == nil {
				time.Sleep(2 * time.Second)
				return fmt.Errorf("node %s publishes no capacity of pool %s: %w", s.Node, s.Pool, errNotYet)
			}
			if *s.PoolBytes != int64(want) {
				time.Sleep(2 * time.Second)
				return fmt.Errorf("node %s pool %s: free + allocated is %d bytes, its size %d: %w", s.Node, s.Pool, *s.PoolBytes, int64(want), errNotYet)
			}
		}
		return nil
	})
}
