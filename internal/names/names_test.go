package names

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// The manifests an admin applies spell the names out: they must be these.
func TestManifestsUseTheseNames(t *testing.T) {
	files, err := filepath.Glob("../../deploy/base/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("deploy/base manifests: %v", err)
	}
	params := []string{ParamFsType, ParamDirectAssign, ParamFsGroupChangePolicy, ParamReleaseOnNodeLoss, ParamPool}
	topology := regexp.MustCompile(`topology\.[a-z0-9.-]+/[a-z0-9.-]+`)
	seen := map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range topology.FindAllString(string(b), -1) {
			// A sentence may end right after the key.
			if k = strings.TrimRight(k, "."); k != TopologyKey {
				t.Errorf("%s names topology key %s, not %s", f, k, TopologyKey)
			}
		}
		for _, doc := range strings.Split(string(b), "\n---") {
			var o struct {
				Kind        string
				Metadata    struct{ Name string }
				Provisioner string
				Driver      string
				Parameters  map[string]string
			}
			if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			switch o.Kind {
			case "CSIDriver":
				seen[o.Kind] = true
				if o.Metadata.Name != Driver {
					t.Errorf("%s: CSIDriver %s, want %s", f, o.Metadata.Name, Driver)
				}
			case "StorageClass", "VolumeSnapshotClass":
				seen[o.Kind] = true
				if d := o.Provisioner + o.Driver; d != Driver {
					t.Errorf("%s: %s %s is for driver %s, want %s", f, o.Kind, o.Metadata.Name, d, Driver)
				}
				for k := range o.Parameters {
					if o.Kind == "StorageClass" && !strings.HasPrefix(k, "csi.storage.k8s.io/") && !slices.Contains(params, k) {
						t.Errorf("%s: StorageClass %s sets parameter %s, which podvol does not read", f, o.Metadata.Name, k)
					}
				}
			}
		}
	}
	for _, k := range []string{"CSIDriver", "StorageClass", "VolumeSnapshotClass"} {
		if !seen[k] {
			t.Errorf("no %s in deploy/base", k)
		}
	}
}

// The ClusterRole the docs tell admins to bind grants exactly the paths the
// plugin and the controller serve metrics at.
func TestManifestsGrantMetricsReader(t *testing.T) {
	b, err := os.ReadFile("../../deploy/base/rbac-metrics.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(string(b), "\n---") {
		var o struct {
			Kind     string
			Metadata struct{ Name string }
			Rules    []struct {
				NonResourceURLs []string `json:"nonResourceURLs"`
				Verbs           []string
			}
		}
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatal(err)
		}
		if o.Kind != "ClusterRole" || o.Metadata.Name != MetricsReaderRole {
			continue
		}
		if len(o.Rules) != 1 || !slices.Equal(o.Rules[0].NonResourceURLs, []string{MetricsPath, MetricsPath + "/*"}) || !slices.Equal(o.Rules[0].Verbs, []string{"get"}) {
			t.Fatalf("ClusterRole %s grants %+v, want get on %s and %s/*", MetricsReaderRole, o.Rules, MetricsPath, MetricsPath)
		}
		return
	}
	t.Fatalf("no ClusterRole %s in deploy/base/rbac-metrics.yaml", MetricsReaderRole)
}
