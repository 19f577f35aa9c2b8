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
		{"tools/sidecars/go.mod", "github.com/kubernetes-csi/external-provisioner/v6", ExternalProvisioner},
		{"tools/sidecars/go.mod", "github.com/kubernetes-csi/external-resizer/v2", ExternalResizer},
		{"tools/sidecars/go.mod", "github.com/kubernetes-csi/external-snapshotter/v8", ExternalSnapshotter},
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

// A package compiles once for every binary only if its whole dependency
// closure has the same versions: the e2e suite's module requires what the
// Kubernetes binaries' module does, and the sidecars' module replaces every
// Kubernetes library with Kubernetes' own version (the sidecars ask for
// older ones).
func TestToolModulesShareVersions(t *testing.T) {
	parse := func(rel string) *modfile.File {
		f, err := modfile.Parse(rel, read(t, rel), nil)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	k8s, e2e := parse("tools/k8s/go.mod"), parse("tools/e2e/go.mod")
	want := map[string]string{}
	for _, r := range k8s.Require {
		want[r.Mod.Path] = r.Mod.Version
	}
	shared := 0
	for _, r := range e2e.Require {
		if v, ok := want[r.Mod.Path]; ok {
			shared++
			if v != r.Mod.Version {
				t.Errorf("tools/e2e/go.mod requires %s %s, tools/k8s/go.mod %s: e2e.test would compile its own copy of every package depending on it", r.Mod.Path, r.Mod.Version, v)
			}
		}
	}
	if shared < 100 {
		t.Errorf("tools/e2e/go.mod shares only %d requirements with tools/k8s/go.mod", shared)
	}
	staging := "v0." + strings.TrimPrefix(Kubernetes, "v1.")
	replaced := map[string]bool{}
	for _, r := range parse("tools/sidecars/go.mod").Replace {
		if !strings.HasPrefix(r.Old.Path, "k8s.io/") {
			continue
		}
		replaced[r.Old.Path] = true
		if r.New.Path != r.Old.Path || r.New.Version != staging {
			t.Errorf("tools/sidecars/go.mod replaces %s with %s %s, want %s", r.Old.Path, r.New.Path, r.New.Version, staging)
		}
	}
	for _, m := range []string{"k8s.io/api", "k8s.io/apimachinery", "k8s.io/client-go", "k8s.io/apiserver"} {
		if !replaced[m] {
			t.Errorf("tools/sidecars/go.mod does not replace %s with %s", m, staging)
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
	// The chart's default values; deploy/base is rendered from them
	// (internal/chart's test checks that).
	var v struct {
		Images map[string]any
	}
	if err := yaml.Unmarshal(read(t, "charts/podvol/values.yaml"), &v); err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, i := range v.Images {
		img, ok := i.(map[string]any)
		if !ok {
			continue // registry, pullPolicy, pullSecrets
		}
		repo, _ := img["repository"].(string)
		tag, _ := img["tag"].(string)
		name := repo[strings.LastIndex(repo, "/")+1:]
		want, ok := Sidecars[name]
		if !ok {
			continue
		}
		seen++
		if tag != want {
			t.Errorf("charts/podvol/values.yaml deploys %s %s, want %s", name, tag, want)
		}
	}
	if seen != len(Sidecars) {
		t.Errorf("charts/podvol/values.yaml names %d of the %d sidecars", seen, len(Sidecars))
	}
}

// Comments and docs that name a version say this one.
func TestDocsNameTheseVersions(t *testing.T) {
	files := []string{"README.md", "CONTRIBUTING.md"}
	for _, pattern := range []string{"../../docs/*.md", "../../deploy/base/*.yaml", "../../charts/podvol/*.yaml", "../../charts/podvol/templates/*.yaml"} {
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
