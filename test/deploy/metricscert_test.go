package deploy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/podvol/podvol/internal/controller/transfersigner"
	"github.com/podvol/podvol/internal/metricsauth"
	"github.com/podvol/podvol/internal/names"
	"github.com/podvol/podvol/internal/transfercert"
)

// TestMetricsCertificates: podvol-controller's metrics-signer, with the
// token and the RBAC of podvol-controller, signs node-a's metrics serving
// certificate for names.MetricsNodeServerName from the pod's own token and
// refuses anyone else; the controller issues its own from the same CA. A
// scraper that trusts only ConfigMap podvol-metrics-ca and verifies the
// name reads node-a's metrics (served as the plugin serves them, reviewed
// with node-a's token) with a token for names.MetricsAudience, and gets
// 401 with the same account's token for the API server.
func TestMetricsCertificates(t *testing.T) {
	e := start(t)
	ctrlToken, err := e.admin.kc.CoreV1().ServiceAccounts(namespace).CreateToken(bg, "podvol-controller",
		&authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(e.api.Config)
	cfg.BearerToken = ctrlToken.Status.Token
	serving := &transfersigner.Serving{Retry: time.Second}
	runController(t, "metrics-signer", cfg, func(mgr ctrl.Manager) error {
		serving.Signer = &transfersigner.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Namespace: namespace, Profile: transfercert.Metrics}
		if err := mgr.Add(serving); err != nil {
			return err
		}
		return (&transfersigner.Reconciler{Client: mgr.GetClient(), Namespace: namespace, NodeUser: saUser, Profile: transfercert.Metrics}).SetupWithManager(mgr)
	})

	var roots *x509.CertPool
	if err := eventually(30*time.Second, func() error {
		cm, err := e.admin.kc.CoreV1().ConfigMaps(namespace).Get(bg, names.MetricsCA, metav1.GetOptions{})
		if err != nil {
			return err
		}
		roots = x509.NewCertPool()
		if !roots.AppendCertsFromPEM([]byte(cm.Data[names.TransferCAKey])) {
			return fmt.Errorf("ConfigMap %s has no certificate", names.MetricsCA)
		}
		return nil
	}); err != nil {
		t.Fatalf("ConfigMap %s after the signer started: %v", names.MetricsCA, err)
	}
	requester := func(id *identity, node string) *transfercert.Requester {
		return &transfercert.Requester{Client: id.kc, Node: node, Namespace: namespace, Wait: 30 * time.Second, Profile: transfercert.Metrics}
	}
	nodeA := requester(e.nodeA, "node-a")
	cert, err := nodeA.Request(bg)
	if err != nil {
		t.Fatalf("node-a asking for its metrics certificate: %v", err)
	}
	if _, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: names.MetricsNodeServerName}); err != nil {
		t.Errorf("node-a's metrics certificate does not verify for %s against ConfigMap %s: %v", names.MetricsNodeServerName, names.MetricsCA, err)
	}
	for _, c := range []struct {
		id         *identity
		node, want string
	}{
		{e.nodeA, "node-b", `must ask for exactly "CN=system:podvol-metrics:node-a"`},
		{e.unbound, "node-a", "no user extra " + names.NodeNameExtra},
		{e.admin, "node-a", "only " + saUser + " may ask"},
	} {
		if _, err := requester(c.id, c.node).Request(bg); err == nil || !strings.Contains(err.Error(), "Denied") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s asking for %s's metrics certificate: %v, want denied saying %q", c.id.name, c.node, err, c.want)
		}
	}
	if err := eventually(30*time.Second, func() error {
		own, err := serving.Certificate()
		if err != nil {
			return err
		}
		_, err = own.Leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: names.MetricsControllerServerName})
		return err
	}); err != nil {
		t.Errorf("podvol-controller's own metrics certificate: %v", err)
	}

	// A scraper: a ServiceAccount bound to the metrics reader role.
	ctx := context.Background()
	if _, err := e.admin.kc.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "scraper"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.admin.kc.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "scraper"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "scraper", Namespace: namespace}},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: names.MetricsReaderRole}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	token := func(audiences ...string) string {
		tr, err := e.admin.kc.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, "scraper", &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: audiences}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(bg)
	served := make(chan error, 1)
	go func() {
		served <- metricsauth.ServeListener(sctx, lis, metricsauth.Config{Filter: metricsauth.NewFilter(e.nodeA.kc, names.MetricsAudience),
			Certificate: nodeA.Certificate,
			Metrics:     http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "podvol_pool_capacity_bytes 1") })})
	}()
	t.Cleanup(func() {
		stop()
		if err := <-served; err != nil {
			t.Error(err)
		}
	})
	scrape := func(serverName, token string) (int, error) {
		c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: serverName, MinVersion: tls.VersionTLS12}}}
		req, err := http.NewRequest(http.MethodGet, "https://"+lis.Addr().String()+names.MetricsPath, nil)
		if err != nil {
			return 0, err
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := c.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil
	}
	// The authorizer learns of the new binding through its own watch.
	if err := eventually(time.Minute, func() error {
		code, err := scrape(names.MetricsNodeServerName, token(names.MetricsAudience))
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("status %d", code)
		}
		return err
	}); err != nil {
		t.Errorf("a verifying scraper with a token for %s: %v, want 200", names.MetricsAudience, err)
	}
	if code, err := scrape(names.MetricsNodeServerName, token()); err != nil || code != http.StatusUnauthorized {
		t.Errorf("the scraper's token for the API server: %d %v, want 401", code, err)
	}
	if _, err := scrape(names.MetricsControllerServerName, token(names.MetricsAudience)); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("node-a's server verified as %s: %v, want a certificate error", names.MetricsControllerServerName, err)
	}
}
