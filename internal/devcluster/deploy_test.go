package devcluster

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/podvol/podvol/internal/chart"
)

func TestGracePatchReplacesTheFlagOfDeployBase(t *testing.T) {
	base := filepath.Join("..", "..", "deploy", "base", "controller.yaml")
	p, err := gracePatch(base, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(base)
	if err != nil {
		t.Fatal(err)
	}
	// The test op carries deploy/base's own argument, so kustomize refuses
	// the patch if the index points anywhere else.
	var want string
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.TrimSpace(l); strings.HasPrefix(f, "- "+graceFlag) {
			want = strings.TrimPrefix(f, "- ")
		}
	}
	if want == "" {
		t.Fatalf("deploy/base/controller.yaml has no %s", graceFlag)
	}
	for _, s := range []string{"name: podvol-controller", `value: "` + want + `"`, `value: "` + graceFlag + `1m0s"`, "op: replace", "op: test"} {
		if !strings.Contains(p, s) {
			t.Errorf("patch lacks %q:\n%s", s, p)
		}
	}
}

func TestGracePatchWithoutTheFlag(t *testing.T) {
	f := filepath.Join(t.TempDir(), "controller.yaml")
	if err := os.WriteFile(f, []byte("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  template:\n    spec:\n      containers: [{name: c, args: [--a]}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := gracePatch(f, time.Minute); err == nil || !strings.Contains(err.Error(), graceFlag) {
		t.Fatalf("got %v, want an error naming %s", err, graceFlag)
	}
}

// A node's mount namespace starts as a copy of the host's: the loop-backed
// mounts that are not its pool (another test's volume, another node's pool)
// are the ones it lets go of.
func TestLoopMountsBut(t *testing.T) {
	mountinfo := `22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 22 7:3 / /var/lib/podvol-dev/nodes/1/pool rw,relatime - xfs /dev/loop3 rw
31 22 7:4 / /var/lib/podvol-dev/nodes/2/pool rw,relatime - xfs /dev/loop4 rw
40 22 7:9 / /tmp/podvol-test-1/pods/pv\040one-mount rw,relatime - xfs /dev/loop9 rw,discard
43 22 7:3 / /var/lib/podvol rw,relatime - xfs /dev/loop3 rw
41 22 0:50 / /dev/shm rw - tmpfs tmpfs rw
42 22 7:1 / / rw - ext4 /dev/loop1 rw
`
	got := loopMountsBut(mountinfo, "/var/lib/podvol-dev/nodes/1/pool")
	want := []string{"/var/lib/podvol-dev/nodes/2/pool", "/tmp/podvol-test-1/pods/pv one-mount"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// On a machine whose cluster directory is itself on a loop device, the
// node's binds of it (same source) and the mount above the pool stay.
func TestLoopMountsButKeepsTheClusterDirsFilesystem(t *testing.T) {
	mountinfo := `22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
25 22 7:0 / /var/lib/podvol-dev rw - ext4 /dev/loop0 rw
30 25 7:3 / /var/lib/podvol-dev/nodes/1/pool rw,relatime - xfs /dev/loop3 rw
44 22 7:0 /nodes/1/kubelet /var/lib/kubelet rw - ext4 /dev/loop0 rw
40 22 7:9 / /tmp/other rw - xfs /dev/loop9 rw
`
	got := loopMountsBut(mountinfo, "/var/lib/podvol-dev/nodes/1/pool")
	if strings.Join(got, "|") != "/tmp/other" {
		t.Fatalf("got %q, want only /tmp/other", got)
	}
}

// The dev cluster's values render the chart with the images it builds, its
// grace period, every sidecar included, and its pool set and class.
func TestValuesRenderTheLocalImages(t *testing.T) {
	repo := filepath.Join("..", "..")
	c := &Cluster{Config: Config{Repo: repo, NodeLossGrace: time.Minute}, podvolTag: "dev-0123"}
	values, err := c.values()
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(f, []byte(values), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	helm, err := chart.Helm(ctx, repo, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	out, err := chart.Template(ctx, helm, repo, "--values", f)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{`image: "localhost/podvol-plugin:dev-0123"`, `image: "localhost/podvol-controller:dev-0123"`, "- --node-loss-grace-period=1m0s",
		"- --pool=" + FastPool + "=" + FastPoolMount + ",node-label=" + FastPoolLabel + "=true", "name: " + FastClass, `pool: "` + FastPool + `"`,
		// The chart's own classes stay.
		"name: podvol-xfs", "name: podvol-direct"}
	for name, v := range sidecarImages {
		want = append(want, `image: "localhost/`+name+":"+v+`"`)
	}
	for _, w := range want {
		if !strings.Contains(string(out), w) {
			t.Errorf("the chart rendered with the dev cluster's values has no %q:\n%s", w, values)
		}
	}
}
