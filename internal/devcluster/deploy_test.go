package devcluster

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
