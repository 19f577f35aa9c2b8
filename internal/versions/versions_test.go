package versions

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"golang.org/x/mod/modfile"
	"sigs.k8s.io/yaml"
)

func read(t *testing.T, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", rel))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// require returns the version go.mod at rel requires of module.
func require(t *testing.T, rel, module string) string {
	t.Helper()
	f, err := modfile.Parse(rel, read(t, rel), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range f.Require {
		if r.Mod.Path == module {
			return r.Mod.Version
		}
	}
	t.Fatalf("%s does not require %s", rel, module)
	return ""
}

func TestGoModulesBuildTheseVersions(t *testing.T) {
	for _, c := range []struct{ gomod, module, want string }{
		{"tools/k8s/go.mod", "k8s.io/kubernetes", Kubernetes},
		{"tools/sidecars/provisioner/go.mod", "github.com/kubernetes-csi/external-provisioner/v6", ExternalProvisioner},
		{"tools/sidecars/resizer/go.mod", "github.com/kubernetes-csi/external-resizer/v2", ExternalResizer},
		{"tools/sidecars/snapshotter/go.mod", "github.com/kubernetes-csi/external-snapshotter/v8", ExternalSnapshotter},
		// The staging modules are v0.<minor>.<patch> of Kubernetes v1.
		{"go.mod", "k8s.io/api", "v0." + strings.TrimPrefix(Kubernetes, "v1.")},
	} {
		if got := require(t, c.gomod, c.module); got != c.want {
			t.Errorf("%s requires %s %s, want %s (internal/versions)", c.gomod, c.module, got, c.want)
		}
	}
	if _, err := os.Stat("../../tools/e2e/go.mod"); err == nil {
		if got := require(t, "tools/e2e/go.mod", "k8s.io/kubernetes"); got != Kubernetes {
			t.Errorf("tools/e2e/go.mod requires k8s.io/kubernetes %s, want %s", got, Kubernetes)
		}
	}
}

// The build scripts take their versions from the go.mod files, never a
// literal of their own.
func TestScriptsReadGoMod(t *testing.T) {
	version := regexp.MustCompile(`\bv[0-9]+\.[0-9]+\.[0-9]+\b`)
	scripts, _ := filepath.Glob("../../tools/*/build.sh")
	if len(scripts) == 0 {
		t.Fatal("no tools/*/build.sh")
	}
	for _, s := range scripts {
		b, _ := os.ReadFile(s)
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "#") {
				continue
			}
			if v := version.FindString(line); v != "" {
				t.Errorf("%s pins %s itself (read it from the go.mod): %s", s, v, line)
			}
		}
	}
}

func TestManifestsDeployTheseVersions(t *testing.T) {
	var k struct {
		Images []struct{ Name, NewTag string }
	}
	if err := yaml.Unmarshal(read(t, "deploy/base/kustomization.yaml"), &k); err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, img := range k.Images {
		want, ok := Sidecars[img.Name]
		if !ok {
			continue
		}
		seen++
		if img.NewTag != want {
			t.Errorf("deploy/base/kustomization.yaml deploys %s %s, want %s", img.Name, img.NewTag, want)
		}
	}
	if seen != len(Sidecars) {
		t.Errorf("deploy/base/kustomization.yaml names %d of the %d sidecars", seen, len(Sidecars))
	}
}

// Comments and docs that name a version say this one.
func TestDocsNameTheseVersions(t *testing.T) {
	files := []string{"README.md", "CONTRIBUTING.md"}
	for _, pattern := range []string{"../../docs/*.md", "../../deploy/base/*.yaml"} {
		m, _ := filepath.Glob(pattern)
		for _, f := range m {
			files = append(files, strings.TrimPrefix(f, "../../"))
		}
	}
	for _, f := range files {
		for name, v := range map[string]string{"Kubernetes": Kubernetes, "external-provisioner": ExternalProvisioner, "external-resizer": ExternalResizer,
			"csi-snapshotter": ExternalSnapshotter, "external-snapshotter": ExternalSnapshotter, "snapshot-controller": ExternalSnapshotter} {
			for _, m := range regexp.MustCompile(name+`[ /@](v[0-9]+\.[0-9]+\.[0-9]+)`).FindAllStringSubmatch(string(read(t, f)), -1) {
				if m[1] != v {
					t.Errorf("%s says %s %s, want %s", f, name, m[1], v)
				}
			}
		}
	}
}
