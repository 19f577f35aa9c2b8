package e2e

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/podvol/podvol/internal/names"
)

// scrapeTarget is one podvol endpoint and a series it must serve.
type scrapeTarget struct {
	url, want string
	// node is where the endpoint's process runs: the scraper must be
	// elsewhere, so that the request crosses the network.
	node string
	// serverName is the name the scraper verifies the certificate for.
	serverName string
}

// testMetricsNeedAuthorizedToken: from a pod on another node, every podvol
// endpoint (each node's plugin, the controller, each sidecar's path behind
// them) serves its metrics to a ServiceAccount bound to
// podvol-metrics-reader, with its pod's projected token for podvol's
// metrics audience as Prometheus scrapes; refuses a request without a
// token, with a made-up one or with the same account's token for the API
// server (401) and one with the token of an account not bound (403).
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
	stranger, err := cluster.RunKubectl(ctx(t), "-n", n, "create", "token", "stranger", "--audience="+names.MetricsAudience)
	must(t, "token of stranger", err)
	stranger = strings.TrimSpace(stranger)

	// Two scrapers, running as reader, on two nodes: each endpoint is
	// scraped from the one not on its node. curl (OpenSSL) from this host,
	// not busybox's wget, whose TLS failed the handshake with podvol's
	// server from a pod ("alert code 40") though not from the host.
	must(t, "image "+curlImage, cluster.ImportToolImage(ctx(t), curlImage, "curl"))
	// The scrapers verify the servers against podvol's metrics CA, as the
	// documented scrape configs do: a copy of its ConfigMap here.
	ca, err := cluster.MetricsCA(ctx(t))
	must(t, "podvol's metrics CA", err)
	apply(t, "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: podvol-metrics-ca, namespace: %s}\ndata: {ca.crt: %q}\n", n, ca)
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
    - name: c
      image: %s
      command: [sleep, "3600"]
      volumeMounts:
        - {name: metrics-token, mountPath: /var/run/secrets/podvol}
        - {name: metrics-ca, mountPath: /etc/podvol-metrics}
  # A token for podvol's metrics audience, as the documented scrape
  # config's Prometheus has; the pod's default token is the API server's.
  volumes:
    - name: metrics-token
      projected: {sources: [{serviceAccountToken: {audience: %s, path: token}}]}
    - {name: metrics-ca, configMap: {name: podvol-metrics-ca}}
`, name, n, node.Name, curlImage, names.MetricsAudience)
		scrapers[node.Name] = name
	}
	for _, name := range scrapers {
		waitPod(t, n, name)
	}

	var targets []scrapeTarget
	for _, node := range cluster.Nodes {
		base := "https://" + node.IP() + ":9808" + names.MetricsPath
		targets = append(targets,
			scrapeTarget{base, `podvol_pool_capacity_bytes{node="` + node.Name + `",pool="default"}`, node.Name, names.MetricsNodeServerName},
			scrapeTarget{base + "/csi-provisioner", "csi_sidecar_operations_seconds_count{", node.Name, names.MetricsNodeServerName},
			scrapeTarget{base + "/csi-resizer", "csi_sidecar_operations_seconds_count{", node.Name, names.MetricsNodeServerName},
			scrapeTarget{base + "/csi-snapshotter", "csi_sidecar_operations_seconds_count{", node.Name, names.MetricsNodeServerName},
			scrapeTarget{base + "/podvol-group-snapshotter", "csi_sidecar_operations_seconds_count{", node.Name, names.MetricsNodeServerName})
	}
	ctrl := get(t, "podvol-system", "pods", `{.items[?(@.metadata.labels.app\.kubernetes\.io/component=="controller")].metadata.name}`)
	ip := get(t, "podvol-system", "pod/"+ctrl, "{.status.podIP}")
	ctrlNode := get(t, "podvol-system", "pod/"+ctrl, "{.spec.nodeName}")
	base := "https://" + ip + ":9809" + names.MetricsPath
	targets = append(targets,
		scrapeTarget{base, `workqueue_depth{controller="ephemeral-volume"`, ctrlNode, names.MetricsControllerServerName},
		scrapeTarget{base + "/snapshot-controller", "snapshot_controller_operations_in_flight", ctrlNode, names.MetricsControllerServerName})

	for _, tg := range targets {
		from := scrapers[cluster.Nodes[0].Name]
		if tg.node == cluster.Nodes[0].Name {
			from = scrapers[cluster.Nodes[1].Name]
		}
		// The pod's token for the metrics audience, as Prometheus's. A
		// sidecar's first figures may take a moment after the cluster
		// came up.
		var code int
		var body string
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(2 * time.Second) {
			code, body = scrape(t, n, from, tg.url, tg.serverName, "$(cat /var/run/secrets/podvol/token)")
			if (code == 200 && strings.Contains(body, tg.want)) || time.Now().After(deadline) {
				break
			}
		}
		if code != 200 || !strings.Contains(body, tg.want) {
			t.Errorf("%s from pod %s with reader's token: %d, want 200 with %s; got:\n%s", tg.url, from, code, tg.want, head(body, 20))
			logsOf(t, tg.node)
		}
		for _, c := range []struct {
			who, token string
			code       int
		}{
			{"no token", "", 401}, {"a made-up token", "not-a-token", 401}, {"stranger's token", stranger, 403},
			{"reader's token for the API server", "$(cat /var/run/secrets/kubernetes.io/serviceaccount/token)", 401},
		} {
			if code, body := scrape(t, n, from, tg.url, tg.serverName, c.token); code != c.code {
				t.Errorf("%s from pod %s with %s: %d, want %d; got:\n%s", tg.url, from, c.who, code, c.code, head(body, 5))
			}
		}
		// The certificate is for its component's name only: one that
		// verifies another name gets no answer.
		other := names.MetricsControllerServerName
		if tg.serverName == other {
			other = names.MetricsNodeServerName
		}
		if code, _ := scrape(t, n, from, tg.url, other, "$(cat /var/run/secrets/podvol/token)"); code != 0 {
			t.Errorf("%s from pod %s verified as %s: %d, want no answer (the certificate is not for that name)", tg.url, from, other, code)
		}
	}
}

// curlImage is the host's curl with its libraries (devcluster.ImportToolImage).
const curlImage = "localhost/curl:podvol-e2e"

// scrape GETs url from the pod with curl, verifying the server's
// certificate against podvol's metrics CA (mounted at /etc/podvol-metrics)
// for serverName at url's address, and returns the status (0: no answer,
// a certificate that does not verify included) and the body. token is
// shell text ("" for no Authorization header).
func scrape(t *testing.T, ns, pod, rawURL, serverName, token string) (int, string) {
	t.Helper()
	header := ""
	if token != "" {
		header = `-H "Authorization: Bearer ` + token + `"`
	}
	u, err := url.Parse(rawURL)
	must(t, "url", err)
	resolve := serverName + ":" + u.Port() + ":" + u.Hostname()
	u.Host = serverName + ":" + u.Port()
	out := exec(t, ns, pod, `rm -f /tmp/b; curl -sS -m 30 --cacert /etc/podvol-metrics/ca.crt --resolve '`+resolve+`' -o /tmp/b -w '%{http_code}\n' `+header+` '`+u.String()+`' 2>&1; echo ---; cat /tmp/b 2>/dev/null; true`)
	status, body, _ := strings.Cut(out, "\n---")
	body = strings.TrimPrefix(body, "\n")
	lines := strings.Split(strings.TrimSpace(status), "\n")
	code, err := strconv.Atoi(lines[len(lines)-1])
	if err != nil || code == 0 {
		t.Logf("%s (%s) from pod %s: no answer: %s", rawURL, serverName, pod, status)
	}
	return code, body
}

// logsOf logs the end of the logs of podvol's containers on node (the
// controller's pod if it is there).
func logsOf(t *testing.T, node string) {
	pods, _ := cluster.Get(ctx(t), "podvol-system", "pods", `{range .items[?(@.spec.nodeName=="`+node+`")]}{.metadata.name} {end}`)
	for _, p := range strings.Fields(pods) {
		out, _ := cluster.RunKubectl(ctx(t), "-n", "podvol-system", "logs", p, "--all-containers", "--prefix", "--tail=15")
		t.Logf("logs of %s:\n%s", p, out)
	}
}

func head(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[:min(n, len(lines))], "\n")
}
