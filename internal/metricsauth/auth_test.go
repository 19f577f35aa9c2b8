package metricsauth

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"sigs.k8s.io/yaml"

	"github.com/podvol/podvol/internal/names"
	"github.com/podvol/podvol/test/kubetest"
)

// counting counts the reviews that reach the API server.
type counting struct {
	Reviewer
	authn, authz atomic.Int32
}

func (c *counting) Authenticate(ctx context.Context, token string) (authnv1.UserInfo, bool, error) {
	c.authn.Add(1)
	return c.Reviewer.Authenticate(ctx, token)
}

func (c *counting) Authorize(ctx context.Context, u authnv1.UserInfo, path string) (bool, error) {
	c.authz.Add(1)
	return c.Reviewer.Authorize(ctx, u, path)
}

// clock is a settable time for the caches.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// TestFilterAgainstAPIServer: real ServiceAccount tokens (TokenRequest),
// reviewed by a real kube-apiserver under deploy/base's ClusterRole: a bound
// account's token for names.MetricsAudience reads /metrics and a sidecar's,
// its token for the API server or another audience gets 401, an unbound
// account 403, no token or a made-up one 401, /healthz needs none; answers are cached for the TTL
// and no longer.
func TestFilterAgainstAPIServer(t *testing.T) {
	api := kubetest.Start(t)
	kc, err := kubernetes.NewForConfig(api.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ns := "monitoring"
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The ClusterRole as shipped.
	b, err := os.ReadFile("../../deploy/base/rbac-metrics.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// The file's first object (make generate heads it with a comment and a
	// document separator).
	var role rbacv1.ClusterRole
	for _, doc := range strings.Split(string(b), "\n---") {
		if err := yaml.Unmarshal([]byte(doc), &role); err == nil && role.Kind != "" {
			break
		}
	}
	if role.Kind != "ClusterRole" || role.Name != names.MetricsReaderRole {
		t.Fatalf("the first object of rbac-metrics.yaml is not ClusterRole %s: %s %s", names.MetricsReaderRole, role.Kind, role.Name)
	}
	if _, err := kc.RbacV1().ClusterRoles().Create(ctx, &role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var tokenOf func(sa string, audiences ...string) string
	token := func(sa string) string {
		if _, err := kc.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		return tokenOf(sa, names.MetricsAudience)
	}
	tokenOf = func(sa string, audiences ...string) string {
		tr, err := kc.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{Audiences: audiences}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	reader, stranger := token("prometheus"), token("stranger")
	// The bound account's tokens for the API server (what a pod's default
	// token is, and kubectl create token without --audience) and for
	// another audience.
	readerForAPI, readerForOther := tokenOf("prometheus"), tokenOf("prometheus", "vault")
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "prometheus-podvol"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "prometheus", Namespace: ns}},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: names.MetricsReaderRole}}
	if _, err := kc.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// A sidecar's endpoint on loopback; it records the headers it gets.
	var sidecarAuth atomic.Value
	sidecarAuth.Store("")
	sidecar := serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sidecarAuth.Store(r.Header.Get("Authorization"))
		fmt.Fprintln(w, "csi_sidecar_operations_seconds_count{method_name=\"/csi.v1.Controller/CreateVolume\"} 1")
	}))
	rev := &counting{Reviewer: APIReviewer{Client: kc, Audience: names.MetricsAudience}}
	clk := &clock{t: time.Now()}
	f := &Filter{Reviewer: rev, Audience: names.MetricsAudience, Now: clk.now}
	addr := serve(t, Config{Filter: f,
		Metrics:  http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "podvol_pool_capacity_bytes 1") }),
		Healthz:  http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") }),
		Sidecars: []Sidecar{{Name: "csi-provisioner", Address: sidecar}}})

	for _, c := range []struct {
		name, method, path, token string
		code                      int
		body                      string
	}{
		{"no token", "GET", "/metrics", "", 401, "Bearer"},
		{"made-up token", "GET", "/metrics", "not-a-token", 401, "does not accept"},
		{"bound account, the API server's token", "GET", "/metrics", readerForAPI, 401, "audience " + names.MetricsAudience},
		{"bound account, another audience's token", "GET", "/metrics", readerForOther, 401, "audience " + names.MetricsAudience},
		{"unbound account", "GET", "/metrics", stranger, 403, "podvol-metrics-reader"},
		{"unbound account, sidecar", "GET", "/metrics/csi-provisioner", stranger, 403, ""},
		{"bound account", "GET", "/metrics", reader, 200, "podvol_pool_capacity_bytes 1"},
		{"bound account, sidecar", "GET", "/metrics/csi-provisioner", reader, 200, "csi_sidecar_operations_seconds_count"},
		{"bound account, unknown path", "GET", "/metrics/nothing", reader, 404, ""},
		{"bound account, not a metrics path", "GET", "/debug/pprof/", reader, 403, ""},
		{"bound account writes", "POST", "/metrics", reader, 405, ""},
		{"kubelet probe", "GET", "/healthz", "", 200, "ok"},
	} {
		code, body := request(t, c.method, addr, c.path, c.token)
		if code != c.code || !strings.Contains(body, c.body) {
			t.Errorf("%s: %s %s: %d %q, want %d with %q", c.name, c.method, c.path, code, body, c.code, c.body)
		}
	}
	if got := sidecarAuth.Load().(string); got != "" {
		t.Errorf("the sidecar got the caller's Authorization header %q", got)
	}

	// Cached: more scrapes within the TTL cost no review.
	n, z := rev.authn.Load(), rev.authz.Load()
	for range 3 {
		if code, _ := request(t, "GET", addr, "/metrics", reader); code != 200 {
			t.Fatalf("bound account: %d", code)
		}
		if code, _ := request(t, "GET", addr, "/metrics", stranger); code != 403 {
			t.Fatalf("unbound account: %d", code)
		}
	}
	if rev.authn.Load() != n || rev.authz.Load() != z {
		t.Errorf("cached answers were reviewed again: TokenReviews %d -> %d, SubjectAccessReviews %d -> %d", n, rev.authn.Load(), z, rev.authz.Load())
	}
	// A revoked binding holds for the TTL, and no longer.
	if err := kc.RbacV1().ClusterRoleBindings().Delete(ctx, binding.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if code, _ := request(t, "GET", addr, "/metrics", reader); code != 200 {
		t.Errorf("within the TTL, a cached grant: %d, want 200", code)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		clk.add(DefaultTTL)
		code, _ := request(t, "GET", addr, "/metrics", reader)
		if code == 403 {
			break
		}
		// The API server's authorizer learns of the deletion through
		// its own watch.
		if time.Now().After(deadline) {
			t.Fatalf("a revoked binding past the TTL: %d, want 403", code)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if rev.authz.Load() == z {
		t.Error("no SubjectAccessReview after the TTL")
	}
}

// TestPlainOnlyOnLoopback: metrics without authentication are refused
// anywhere but on loopback.
func TestPlainOnlyOnLoopback(t *testing.T) {
	lis, err := net.Listen("tcp", "0.0.0.0:0") //nolint:gosec // G102: what is tested is that all interfaces are refused
	if err != nil {
		t.Fatal(err)
	}
	err = ServeListener(context.Background(), lis, Config{Metrics: http.NotFoundHandler()})
	if err == nil || !strings.Contains(err.Error(), "without authentication") {
		t.Fatalf("plain metrics on all addresses: %v", err)
	}
}

func TestParseSidecars(t *testing.T) {
	got, err := ParseSidecars("csi-provisioner=127.0.0.1:9811, csi-resizer=[::1]:9812")
	if err != nil || len(got) != 2 || got[1] != (Sidecar{"csi-resizer", "[::1]:9812"}) {
		t.Fatalf("got %v, %v", got, err)
	}
	for _, bad := range []string{"x=10.0.0.1:80", "x=localhost:80", "X=127.0.0.1:1", "x", "x=127.0.0.1", "a=127.0.0.1:1,a=127.0.0.1:2"} {
		if _, err := ParseSidecars(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestCacheBounded: however many answers are put, the cache holds at most
// its size, and the newest answer is kept.
func TestCacheBounded(t *testing.T) {
	c := newCache[bool](50)
	now := time.Now()
	for i := range 1000 {
		c.put(fmt.Sprint(i), true, now.Add(time.Duration(i)*time.Millisecond), time.Hour)
		if len(c.entries) > 50 {
			t.Fatalf("%d entries after %d puts", len(c.entries), i+1)
		}
	}
	if _, ok := c.get("999", now); !ok {
		t.Fatal("the newest answer was evicted")
	}
	if _, ok := c.get("1", now); ok {
		t.Fatal("the oldest answer was kept over newer ones")
	}
	if _, ok := c.get("999", now.Add(2*time.Hour)); ok {
		t.Fatal("an answer outlived its TTL")
	}
}

func serve(t *testing.T, c Config) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ServeListener(ctx, lis, c) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return lis.Addr().String()
}

func serveHTTP(t *testing.T, h http.Handler) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: time.Second}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() { _ = srv.Close() })
	return lis.Addr().String()
}

var insecure = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
	// The server's certificate is self-signed.
	TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // G402: the server's certificate is self-signed

func request(t *testing.T, method, addr, path, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, "https://"+addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := insecure.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestAuthenticateNamesTheAudience: the TokenReview asks for the metrics
// audience, and a token is accepted only if the API server says it holds
// it (an authenticator that ignores audiences answers none).
func TestAuthenticateNamesTheAudience(t *testing.T) {
	for _, c := range []struct {
		name     string
		answered []string
		ok       bool
	}{
		{"the audience", []string{"podvol.io/metrics"}, true},
		{"no audience", nil, false},
		{"another audience", []string{"https://kubernetes.default.svc"}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			kc := fake.NewClientset()
			var asked []string
			kc.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
				tr := a.(k8stesting.CreateAction).GetObject().(*authnv1.TokenReview)
				asked = tr.Spec.Audiences
				tr = tr.DeepCopy()
				tr.Status = authnv1.TokenReviewStatus{Authenticated: true, User: authnv1.UserInfo{Username: "system:serviceaccount:monitoring:prometheus"}, Audiences: c.answered}
				return true, tr, nil
			})
			_, ok, err := APIReviewer{Client: kc, Audience: "podvol.io/metrics"}.Authenticate(context.Background(), "t")
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(asked, []string{"podvol.io/metrics"}) {
				t.Errorf("the TokenReview asked for audiences %q, want [podvol.io/metrics]", asked)
			}
			if ok != c.ok {
				t.Errorf("a token the API server says has audiences %q: accepted %v, want %v", c.answered, ok, c.ok)
			}
		})
	}
}
