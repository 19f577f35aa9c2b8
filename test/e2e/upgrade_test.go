package e2e

import (
	"fmt"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/podvol/podvol/internal/device"
)

// previousRelease is the commit of the podvol that the upgrade test starts
// from: the last one that landed before the plugin or controller changed
// (stop 31, 2026-12-02). Move it forward when they change again; the test
// needs the checkout's history to reach it.
const previousRelease = "590663c3f2d65fd414c16939ee6714dd1defbce8"

// testUpgrade installs the previous release's chart with its own images (on
// a cluster whose podvol is uninstalled first), starts pods that keep
// writing to a persistent, a generic ephemeral and an inline volume, and
// upgrades to the checkout's chart and images with helm upgrade: every pod
// keeps writing with no gap, no podvol container restarts, the persistent
// volume staged by the old plugin is unstaged and staged again by the new
// one with its data. Then helm uninstall with the volumes in use: what
// docs/operations.md says happens (the pods keep writing, nothing holding
// data is deleted, a new pod waits for the driver), and installing again
// picks everything up; deleting it all leaves no image or loop device.
func testUpgrade(t *testing.T) {
	src := filepath.Join(t.TempDir(), "podvol-previous")
	if out, err := osexec.Command("git", "clone", "--quiet", "--shared", "--no-checkout", cluster.Repo, src).CombinedOutput(); err != nil {
		t.Fatalf("git clone --shared %s: %v\n%s", cluster.Repo, err, out)
	}
	if out, err := osexec.Command("git", "-C", src, "checkout", "--quiet", previousRelease).CombinedOutput(); err != nil {
		t.Fatalf("the previous release, commit %s, is not in %s's history (a shallow clone? git fetch --unshallow): %v\n%s",
			previousRelease, cluster.Repo, err, out)
	}
	head, err := osexec.Command("git", "-C", cluster.Repo, "rev-parse", "HEAD").Output()
	must(t, "git rev-parse HEAD", err)
	if strings.TrimSpace(string(head)) == previousRelease {
		t.Fatalf("the previous release is the checkout itself (%s): the upgrade would change nothing; pin an older commit", previousRelease)
	}
	prev, err := cluster.BuildRelease(ctx(t), src)
	must(t, "build the previous release's images", err)
	current := cluster.CurrentRelease()
	// The namespace goes after podvol is back (cleanups run last first):
	// its claims need a provisioner to go.
	n := ns(t)
	// Whatever happens, the cluster ends with the checkout's podvol.
	t.Cleanup(func() {
		if images := podvolImages(t); !strings.Contains(images, current.Tag) || strings.Contains(images, prev.Tag) {
			must(t, "reinstall the checkout's podvol", cluster.Install(ctx(t), current))
		}
	})
	start := time.Now()
	must(t, "uninstall podvol", cluster.Uninstall(ctx(t)))
	must(t, "install the previous release", cluster.Install(ctx(t), prev))
	wantImages(t, prev.Tag)
	t.Logf("previous release (commit %.12s, images %s) installed in %s", previousRelease, prev.Tag, time.Since(start).Round(time.Second))

	baseline := poolCounts(t)
	pods, uids := startWriters(t, n)
	node := podNode(t, n, "persistent")
	inUse := poolCounts(t)
	time.Sleep(3 * time.Second)

	noRestarts(t) // the previous release's, before its pods are replaced
	start = time.Now()
	must(t, "helm upgrade to the checkout's chart and images", cluster.Install(ctx(t), current))
	wantImages(t, current.Tag)
	t.Logf("helm upgrade rolled podvol out in %s", time.Since(start).Round(time.Second))
	time.Sleep(3 * time.Second)
	stillWriting(t, n, pods, uids)
	noRestarts(t)

	// The persistent volume, staged by the old plugin: unstaged and staged
	// again by the new one, on its node, with what was written.
	handle := get(t, "", "pv/"+get(t, n, "pvc/data", "{.spec.volumeName}"), "{.spec.csi.volumeHandle}")
	image := node.PoolDir() + "/volumes/" + handle + ".img"
	if loops, err := device.LoopsFor(image); err != nil || len(loops) == 0 {
		t.Fatalf("the persistent volume's image %s has no loop device while staged (%v, %v)", image, loops, err)
	}
	deletePod(t, n, "persistent")
	// Unstaged by the new plugin before a pod uses it again: its loop
	// device goes.
	eventually(t, 2*time.Minute, func() string {
		if loops, err := device.LoopsFor(image); err != nil || len(loops) > 0 {
			return fmt.Sprintf("the unused persistent volume's image %s is still on %v (%v)", image, loops, err)
		}
		return ""
	})
	// It keeps what the first pod wrote and starts a log of its own.
	pod(t, n, "persistent-again", `mv /vol/log /vol/log.before && `+writer, "persistentVolumeClaim: {claimName: data}")
	waitPod(t, n, "persistent-again")
	if got := podNode(t, n, "persistent-again"); got.Name != node.Name {
		t.Fatalf("the claim's pod runs on %s after the upgrade, its volume is on %s", got.Name, node.Name)
	}
	if loops, err := device.LoopsFor(image); err != nil || len(loops) == 0 {
		t.Fatalf("the persistent volume's image %s has no loop device once staged again (%v, %v)", image, loops, err)
	}
	before := exec(t, n, "persistent-again", "cat /vol/log.before")
	checkLog(t, "persistent (before the upgrade, read after it)", before, logEnd(t, before))
	uids["persistent-again"] = get(t, n, "pod/persistent-again", "{.metadata.uid}")
	pods = []string{"persistent-again", "ephemeral", "inline"}

	// helm uninstall with the volumes in use (docs/operations.md, "What
	// helm uninstall does with volumes present").
	must(t, "helm uninstall with volumes in use", cluster.Uninstall(ctx(t)))
	time.Sleep(5 * time.Second)
	stillWriting(t, n, pods, uids)
	if phase := get(t, n, "pvc/data", "{.status.phase}"); phase != "Bound" {
		t.Fatalf("claim data is %s after helm uninstall, not Bound", phase)
	}
	if now := poolCounts(t); now != inUse {
		t.Fatalf("after helm uninstall the pools hold %s, with the volumes in use before it %s", now, inUse)
	}
	pod(t, n, "waits", "echo ok > /vol/f", "csi:\n  driver: podvol.io\n  volumeAttributes: {size: 64Mi}")
	eventually(t, 2*time.Minute, func() string {
		out, _ := cluster.RunKubectl(ctx(t), "-n", n, "get", "events", "--field-selector", "involvedObject.name=waits", "-o", "jsonpath={.items[*].message}")
		if !strings.Contains(out, "driver name podvol.io not found in the list of registered CSI drivers") {
			return "pod waits has no event naming the missing driver yet: " + out
		}
		return ""
	})

	start = time.Now()
	must(t, "install the checkout's podvol again", cluster.Install(ctx(t), current))
	t.Logf("installed again in %s", time.Since(start).Round(time.Second))
	waitPod(t, n, "waits")
	if got := exec(t, n, "waits", "cat /vol/f"); got != "ok" {
		t.Fatalf("the pod that waited for the driver reads %q", got)
	}
	time.Sleep(3 * time.Second)
	stillWriting(t, n, pods, uids)

	// Everything deleted: no image or loop device of these volumes is left.
	for _, p := range append(pods, "waits") {
		deletePod(t, n, p)
	}
	_, err = cluster.RunKubectl(ctx(t), "-n", n, "delete", "pvc", "data", "--wait=true", "--timeout=3m")
	must(t, "delete claim data", err)
	eventually(t, 2*time.Minute, func() string {
		if now := poolCounts(t); now != baseline {
			return "the pools hold " + now + ", before the test " + baseline
		}
		return ""
	})
}

// logEnd is the time of a writer's log's last line.
func logEnd(t *testing.T, log string) time.Time {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(log), "\n")
	var sec int64
	if f := strings.Fields(lines[len(lines)-1]); len(f) == 2 {
		if _, err := fmt.Sscan(f[1], &sec); err != nil {
			t.Fatalf("the log's last line %q has no time: %v", lines[len(lines)-1], err)
		}
	}
	return time.Unix(sec, 0)
}

// poolCounts says how many images and loop devices each node's pool has.
func poolCounts(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, nd := range cluster.Nodes {
		s, err := nd.PoolState(ctx(t))
		must(t, "the pool of "+nd.Name, err)
		fmt.Fprintf(&b, "%s: %d images, %d loop devices; ", nd.Name, len(s.Images), len(s.Loops))
	}
	return strings.TrimSuffix(b.String(), "; ")
}

// podvolImages lists the images podvol's pods run.
// Pods on their way out (an old controller pod still terminating after
// the rollout) are not listed.
func podvolImages(t *testing.T) string {
	t.Helper()
	out, err := cluster.Get(ctx(t), "podvol-system", "pods",
		"{range .items[*]}{.spec.containers[0].image} {.metadata.deletionTimestamp}{\"\\n\"}{end}")
	must(t, "podvol's pods", err)
	var running []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(l); len(f) == 1 {
			running = append(running, f[0])
		}
	}
	return strings.Join(running, "\n")
}

// wantImages fails unless every podvol pod runs podvol's image tagged tag.
func wantImages(t *testing.T, tag string) {
	t.Helper()
	images := strings.Fields(podvolImages(t))
	if len(images) == 0 {
		t.Fatalf("no podvol pod runs")
	}
	for _, img := range images {
		if !strings.HasSuffix(img, ":"+tag) {
			t.Fatalf("a podvol pod runs %s, not the images tagged %s:\n%s", img, tag, podvolImages(t))
		}
	}
}

// noRestarts fails if a podvol container restarted.
func noRestarts(t *testing.T) {
	t.Helper()
	out, restarted, err := podvolRestarts(ctx(t))
	must(t, "podvol's pods", err)
	if strings.TrimSpace(out) == "" {
		t.Fatalf("no podvol pod is running")
	}
	if restarted {
		t.Fatalf("a podvol container restarted (container=restarts per pod):\n%s", out)
	}
}
