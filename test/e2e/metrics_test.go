package e2e

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/podvol/podvol/internal/devcluster"
	"github.com/podvol/podvol/internal/names"
)

// scrapeTarget is one podvol endpoint and a series it must serve.
type scrapeTarget struct {
	url, want string
	// node is where the endpoint's process runs: the scraper must be
	// elsewhere, so that the request crosses the network.
	node string
}

// testMetricsNeedAuthorizedToken: from a pod on another node, every podvol
// endpoint (each node's plugin, the controller, each sidecar's path behind
// them) serves its metrics to a ServiceAccount bound to
// podvol-metrics-reader, as Prometheus scrapes with its pod's own token;
// refuses a request without a token or with a made-up one (401) and one
// with the token of an account not bound (403).
func testMetricsNeedAuthorizedToken(t *testing.T) {
	n := ns(t)
	binding := "e2e-metrics-reader-" + n
	apply(t, `apiVersion: v1
kind: ServiceAccount
metadata: {name: reader, namespace: %[1]s}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: stranger, namespace: %[1]s}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: %[2]s}
subjects: [{kind: ServiceAccount, name: reader, namespace: %[1]s}]
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: %[3]s}
`, n, binding, names.MetricsReaderRole)
	t.Cleanup(func() {
		_, _ = cluster.RunKubectl(ctx(t), "delete", "clusterrolebinding", binding, "--ignore-not-found")
	})
	stranger, err := cluster.RunKubectl(ctx(t), "-n", n, "create", "token", "stranger")
	must(t, "token of stranger", err)
	stranger = strings.TrimSpace(stranger)

	// Two scrapers, running as reader, on two nodes: each endpoint is
	// scraped from the one not on its node.
	scrapers := map[string]string{}
	for i, node := range cluster.Nodes[:2] {
		name := fmt.Sprintf("scraper-%d", i)
		apply(t, `apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s}
spec:
  nodeName: %s
  serviceAccountName: reader
  terminationGracePeriodSeconds: 0
  containers:
    - {name: c, image: %s, command: [sleep, "3600"]}
`, name, n, node.Name, devcluster.Image)
		scrapers[node.Name] = name
	}
	for _, name := range scrapers {
		waitPod(t, n, name)
	}

	var targets []scrapeTarget
	for _, node := range cluster.Nodes {
		base := "https://" + node.IP() + ":9808" + names.MetricsPath
		targets = append(targets,
			scrapeTarget{base, `podvol_pool_capacity_bytes{node="` + node.Name + `"}`, node.Name},
			scrapeTarget{base + "/csi-provisioner", "csi_sidecar_operations_seconds_count{", node.Name},
			scrapeTarget{base + "/csi-resizer", "csi_sidecar_operations_seconds_count{", node.Name},
			scrapeTarget{base + "/csi-snapshotter", "csi_sidecar_operations_seconds_count{", node.Name})
	}
	ctrl := get(t, "podvol-system", "pods", `{.items[?(@.metadata.labels.app\.kubernetes\.io/component=="controller")].metadata.name}`)
	ip := get(t, "podvol-system", "pod/"+ctrl, "{.status.podIP}")
	ctrlNode := get(t, "podvol-system", "pod/"+ctrl, "{.spec.nodeName}")
	base := "https://" + ip + ":9809" + names.MetricsPath
	targets = append(targets,
		scrapeTarget{base, `workqueue_depth{controller="ephemeral-volume"}`, ctrlNode},
		scrapeTarget{base + "/snapshot-controller", "snapshot_controller_operations_in_flight", ctrlNode})

	for _, tg := range targets {
		from := scrapers[cluster.Nodes[0].Name]
		if tg.node == cluster.Nodes[0].Name {
			from = scrapers[cluster.Nodes[1].Name]
		}
		// The pod's own projected token, as Prometheus's.
		code, body := scrape(t, n, from, tg.url, "$(cat /var/run/secrets/kubernetes.io/serviceaccount/token)")
		if code != 200 || !strings.Contains(body, tg.want) {
			t.Errorf("%s from pod %s with reader's token: %d, want 200 with %s; got:\n%s", tg.url, from, code, tg.want, head(body, 20))
		}
		for _, c := range []struct {
			who, token string
			code       int
		}{{"no token", "", 401}, {"a made-up token", "not-a-token", 401}, {"stranger's token", stranger, 403}} {
			if code, body := scrape(t, n, from, tg.url, c.token); code != c.code {
				t.Errorf("%s from pod %s with %s: %d, want %d; got:\n%s", tg.url, from, c.who, code, c.code, head(body, 5))
			}
		}
	}
}

var httpStatus = regexp.MustCompile(`HTTP/1\.[01] (\d{3})`)

// scrape GETs url from the pod with busybox's wget (the certificate is
// self-signed: not verified) and returns the status and the body. token is
// shell text ("" for no Authorization header).
func scrape(t *testing.T, ns, pod, url, token string) (int, string) {
	t.Helper()
	header := ""
	if token != "" {
		header = `--header "Authorization: Bearer ` + token + `"`
	}
	out := exec(t, ns, pod, `rm -f /tmp/b /tmp/e; wget -S -T 20 -O /tmp/b --no-check-certificate `+header+` '`+url+`' 2>/tmp/e; cat /tmp/e; echo ---; cat /tmp/b 2>/dev/null; true`)
	status, body, _ := strings.Cut(out, "\n---")
	body = strings.TrimPrefix(body, "\n")
	m := httpStatus.FindAllStringSubmatch(status, -1)
	if m == nil {
		t.Fatalf("%s from pod %s: no HTTP status in wget's output:\n%s", url, pod, status)
	}
	code := 0
	fmt.Sscan(m[len(m)-1][1], &code)
	return code, body
}

func head(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[:min(n, len(lines))], "\n")
}
