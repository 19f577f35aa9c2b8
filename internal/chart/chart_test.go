package chart

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/podvol/podvol/internal/names"
)

var repo = filepath.Join("..", "..")

// helm is the Helm binary tools/helm/build.sh builds (once per test binary).
func helm(t *testing.T) string {
	t.Helper()
	h, err := Helm(context.Background(), repo, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func run(t *testing.T, name string, args ...string) (string, error) {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	return string(out), err
}

const everyOption = "testdata/every-option.yaml"

// deploy/base is the chart rendered with its default values: a change to
// one without the other fails here.
func TestDeployBaseIsTheChartRendered(t *testing.T) {
	files, err := Base(context.Background(), helm(t), repo)
	if err != nil {
		t.Fatal(err)
	}
	diff, err := Diff(repo, files)
	if err != nil {
		t.Fatal(err)
	}
	if len(diff) > 0 {
		t.Fatalf("deploy/base differs from charts/podvol rendered with its default values in %s: run make generate", strings.Join(diff, ", "))
	}
}

func TestLint(t *testing.T) {
	h := helm(t)
	for _, args := range [][]string{nil, {"--values", everyOption}} {
		a := append([]string{"lint", "--strict", filepath.Join(repo, Dir), "--namespace", Namespace}, args...)
		if out, err := run(t, h, a...); err != nil {
			t.Errorf("helm %s: %v\n%s", strings.Join(a, " "), err, out)
		}
	}
}

// leaves returns the paths of values' leaves (maps are walked; a list is
// one leaf).
func leaves(prefix string, v any, out *[]string) {
	if m, ok := v.(map[string]any); ok && len(m) > 0 {
		for k, c := range m {
			leaves(prefix+"."+k, c, out)
		}
		return
	}
	*out = append(*out, prefix)
}

func lookup(v any, path string) (any, bool) {
	for _, k := range strings.Split(strings.TrimPrefix(path, "."), ".") {
		m, ok := v.(map[string]any)
		if !ok {
			return nil, false
		}
		if v, ok = m[k]; !ok {
			return nil, false
		}
	}
	return v, true
}

func readYAML(t *testing.T, path string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := yaml.Unmarshal(b, &v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return v
}

// The every-option values set every value the chart has, each to something
// else than its default, and the chart renders each.
func TestEveryOption(t *testing.T) {
	defaults := readYAML(t, filepath.Join(repo, Dir, "values.yaml"))
	every := readYAML(t, everyOption)
	var keys []string
	leaves("", defaults, &keys)
	sort.Strings(keys)
	for _, k := range keys {
		got, ok := lookup(every, k)
		if !ok {
			t.Errorf("%s does not set %s", everyOption, k)
			continue
		}
		def, _ := lookup(defaults, k)
		if dj, gj := mustJSON(def), mustJSON(got); dj == gj && k != ".images.csiResizer.registry" && !strings.HasSuffix(k, ".enabled") && !strings.HasSuffix(k, ".create") && !strings.HasSuffix(k, ".digest") {
			t.Errorf("%s sets %s to its default %s", everyOption, k, dj)
		}
	}
	out, err := Template(context.Background(), helm(t), repo, "--values", everyOption)
	if err != nil {
		t.Fatal(err)
	}
	s := string(out)
	for _, want := range []string{
		// images: registry, repository, digest over tag, the global registry
		"mirror.example.invalid/team/podvol-plugin@sha256:0123456789abcdef",
		"mirror.example.invalid/team/podvol-controller@sha256:fedcba98",
		"mirror.example.invalid/sig/csi-provisioner@sha256:1111",
		"mirror.example.invalid/sig/csi-snapshotter@sha256:2222",
		`"registry.example.invalid/podvol/sig/csi-resizer:v0.0.3"`,
		`"mirror.example.invalid/sig/snapshot-controller:v0.0.4"`,
		"imagePullPolicy: Always", "- name: podvol-pull",
		// node
		"--pool=default=/mnt/fast/podvol\n", "path: /mnt/fast/podvol,", "mountPath: /mnt/fast/podvol}",
		"--pool=bulk=/mnt/hdd/podvol,capacity=2Ti", "{name: pool-bulk, hostPath: {path: /mnt/hdd/podvol,",
		"--pool=fast=/mnt/nvme/podvol,capacity=300Gi,node-label=example.com/nvme=true", "{name: pool-fast, mountPath: /mnt/nvme/podvol}",
		"--inline-pools=default,bulk", `resources: ["nodes"]` + "\n    verbs: [\"get\"]", "pool: \"fast\"",
		"value: \"/var/lib/k0s/kubelet\"", "path: /var/lib/k0s/kubelet/plugins_registry,", "mountPath: /var/lib/k0s/kubelet,",
		"--metrics-address=:19808", "port: 19808,",
		"--transfer-max-serving=16\n", "--transfer-max-serving-per-node=2\n", "--transfer-max-pulling=6\n",
		"priorityClassName: system-cluster-critical", "key: storage", "podvol.io/storage-node: \"true\"", "kubernetes.io/os",
		"example.invalid/scrape: \"true\"", "maxUnavailable: 10%",
		// controller
		"replicas: 2", "--node-loss-grace-period=90s", "--metrics-address=:19809", "--health-address=:19810",
		"containerPort: 19810", "node-role.kubernetes.io/control-plane: \"\"", "podAntiAffinity",
		// resources, extra args
		"memory: 1Gi", "memory: 256Mi", `"--trim-interval=30m"`, `"--max-volumes=100"`, `"--worker-threads=20"`, `"--workers=5"`, `"--kube-api-qps=30"`,
		// classes
		"name: fast\n", "storageclass.kubernetes.io/is-default-class: \"true\"", "reclaimPolicy: Retain", "allowVolumeExpansion: false",
		"- noatime", "fsGroupChangePolicy: \"OnRootMismatch\"", "releaseOnNodeLoss: \"false\"", "directAssign: \"always\"",
		"name: fast-snapshots", "snapshot.storage.kubernetes.io/is-default-class: \"true\"", "deletionPolicy: Retain",
		// admission
		`validationActions: ["Warn","Audit"]`, `validationActions: ["Warn"]`, `validationActions: ["Audit"]`,
		`inlineMaxSize: "2Gi"`, `inlineDefaultSize: "512Mi"`, "--inline-default-size=512Mi", "['fast', 'fast-vm']", "kind: Namespace",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("helm template --values %s renders no %q", everyOption, want)
		}
	}
	if strings.Contains(s, "podvol-direct-assign-rwop") {
		t.Errorf("admission.directAssignRWOP.enabled=false still renders policy podvol-direct-assign-rwop")
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// Turning policies off renders none of them.
func TestPoliciesOff(t *testing.T) {
	out, err := Template(context.Background(), helm(t), repo, "--set", "nodePolicy.enabled=false",
		"--set", "admission.ephemeralVolumeRights.enabled=false", "--set", "admission.directAssignRWOP.enabled=false", "--set", "admission.inlineSize.enabled=false")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(out), "kind: ValidatingAdmissionPolicy"); n != 0 {
		t.Errorf("with every policy off the chart renders %d ValidatingAdmissionPolicy(Binding)s", n)
	}
}

// Bad values are refused, with a message that names what is wrong.
func TestSchemaRefusesBadValues(t *testing.T) {
	h := helm(t)
	for _, c := range []struct {
		name string
		set  []string
		file string
		want []string
	}{
		{name: "typo", set: []string{"node.poolDri=/data"}, want: []string{"poolDri", "/node"}},
		{name: "top-level typo", set: []string{"storageClass=x"}, want: []string{"storageClass"}},
		{name: "wrong type", set: []string{"controller.replicas=two"}, want: []string{"/controller/replicas", "integer"}},
		{name: "relative pool dir", set: []string{"node.poolDir=data"}, want: []string{"/node/poolDir"}},
		{name: "bad pool name", file: "node:\n  pools: [{name: Fast, dir: /x}]\n", want: []string{"/node/pools/0/name"}},
		{name: "pool without dir", file: "node:\n  pools: [{name: fast}]\n", want: []string{"/node/pools/0", "dir"}},
		{name: "bad pool capacity", file: "node:\n  pools: [{name: fast, dir: /x, capacity: lots}]\n", want: []string{"/node/pools/0/capacity"}},
		{name: "bad node labels", file: "node:\n  pools: [{name: fast, dir: /x, nodeLabels: {a: 1}}]\n", want: []string{"/node/pools/0/nodeLabels/a"}},
		{name: "bad inline pool", set: []string{"node.inlinePools={Fast}"}, want: []string{"/node/inlinePools/0"}},
		{name: "bad class pool", file: "storageClasses:\n  - name: x\n    parameters: {pool: NVMe}\n", want: []string{"/storageClasses/0/parameters/pool"}},
		{name: "unknown class parameter", file: "storageClasses:\n  - name: x\n    parameters: {fstype: xfs}\n", want: []string{"fstype", "/storageClasses/0/parameters"}},
		{name: "bad class parameter value", file: "storageClasses:\n  - name: x\n    parameters: {directAssign: sometimes}\n", want: []string{"/storageClasses/0/parameters/directAssign"}},
		{name: "bad grace", set: []string{"controller.nodeLossGracePeriod=5 minutes"}, want: []string{"/controller/nodeLossGracePeriod"}},
		{name: "bad validation action", set: []string{"nodePolicy.validationActions={Block}"}, want: []string{"/nodePolicy/validationActions"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var args []string
			for _, s := range c.set {
				args = append(args, "--set", s)
			}
			if c.file != "" {
				f := filepath.Join(t.TempDir(), "values.yaml")
				if err := os.WriteFile(f, []byte(c.file), 0o644); err != nil {
					t.Fatal(err)
				}
				args = append(args, "--values", f)
			}
			_, err := Template(context.Background(), h, repo, args...)
			if err == nil {
				t.Fatalf("helm template %s: no error", strings.Join(args, " "))
			}
			for _, w := range append(c.want, "schema") {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the error does not name %q:\n%v", w, err)
				}
			}
		})
	}
}

// The StorageClass parameters the schema lets through are the ones podvol
// reads (internal/names), or the sidecars' csi.storage.k8s.io/ ones.
func TestSchemaClassParametersAreNames(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repo, Dir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s struct {
		Properties struct {
			StorageClasses struct {
				Items struct {
					Properties struct {
						Parameters struct{ Properties map[string]any }
					}
				}
			}
		}
	}
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	params := s.Properties.StorageClasses.Items.Properties.Parameters.Properties
	if len(params) == 0 {
		t.Fatal("values.schema.json lists no StorageClass parameter")
	}
	known := []string{names.ParamDirectAssign, names.ParamFsGroupChangePolicy, names.ParamReleaseOnNodeLoss, names.ParamPool}
	for k := range params {
		if !strings.HasPrefix(k, "csi.storage.k8s.io/") && !slices.Contains(known, k) {
			t.Errorf("values.schema.json allows StorageClass parameter %s, which podvol does not read", k)
		}
	}
	for _, k := range known {
		if _, ok := params[k]; !ok {
			t.Errorf("values.schema.json does not allow StorageClass parameter %s", k)
		}
	}
}

// Pools the plugin would refuse at start are refused by the chart first,
// naming them: a name given twice.
func TestChartRefusesDuplicatePools(t *testing.T) {
	h := helm(t)
	for _, c := range []struct{ file, want string }{
		{"node:\n  pools: [{name: default, dir: /x}]\n", "node.pools: two pools have one name (default, default)"},
		{"node:\n  pools: [{name: a, dir: /x}, {name: a, dir: /z}]\n", "node.pools: two pools have one name (default, a, a)"},
	} {
		f := filepath.Join(t.TempDir(), "values.yaml")
		if err := os.WriteFile(f, []byte(c.file), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := Template(context.Background(), h, repo, "--values", f)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("helm template with %q: %v, want an error naming %q", c.file, err, c.want)
		}
	}
}
