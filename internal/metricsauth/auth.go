// Package metricsauth serves podvol's metrics (and its sidecars', re-served
// from their loopback endpoints) over HTTPS to callers Kubernetes
// authorizes: the bearer token is checked with a TokenReview, the request
// path with a SubjectAccessReview on a non-resource URL, verb get. Both the
// plugin and podvol-controller serve through it.
package metricsauth

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// Reviewer answers the two questions the filter asks the API server.
type Reviewer interface {
	// Authenticate returns the user a bearer token belongs to; ok is
	// false when the API server does not accept the token.
	Authenticate(ctx context.Context, token string) (user authnv1.UserInfo, ok bool, err error)
	// Authorize says whether user may get the non-resource URL path.
	Authorize(ctx context.Context, user authnv1.UserInfo, path string) (allowed bool, err error)
}

// APIReviewer asks the API server (TokenReview, SubjectAccessReview). Its
// ServiceAccount needs create on both: the system:auth-delegator
// ClusterRole, or deploy/base's rules for podvol-node and podvol-controller.
type APIReviewer struct {
	Client kubernetes.Interface
	// Audience a token must have (names.MetricsAudience by default).
	Audience string
}

// Authenticate is a TokenReview for r.Audience: a token for the API server
// (a pod's default token, `kubectl create token` without --audience) is
// not accepted, so that a scraper's token, which every scraped server sees,
// is no use against the API server. The API server answers the audiences
// the token holds of those asked; one that answers none ignores audiences,
// and its word is not taken.
func (r APIReviewer) Authenticate(ctx context.Context, token string) (authnv1.UserInfo, bool, error) {
	tr, err := r.Client.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{
		Token: token, Audiences: []string{r.Audience}}}, metav1.CreateOptions{})
	if err != nil {
		return authnv1.UserInfo{}, false, fmt.Errorf("TokenReview: %w", err)
	}
	ok := tr.Status.Authenticated && tr.Status.Error == "" && slices.Contains(tr.Status.Audiences, r.Audience)
	return tr.Status.User, ok, nil
}

// Authorize is a SubjectAccessReview of get on the non-resource URL path,
// for the user with its groups, UID and extra attributes as authenticated.
func (r APIReviewer) Authorize(ctx context.Context, user authnv1.UserInfo, path string) (bool, error) {
	extra := make(map[string]authzv1.ExtraValue, len(user.Extra))
	for k, v := range user.Extra {
		extra[k] = authzv1.ExtraValue(v)
	}
	sar, err := r.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User: user.Username, Groups: user.Groups, UID: user.UID, Extra: extra,
		NonResourceAttributes: &authzv1.NonResourceAttributes{Path: path, Verb: "get"},
	}}, metav1.CreateOptions{})
	if err != nil {
		return false, fmt.Errorf("SubjectAccessReview: %w", err)
	}
	return sar.Status.Allowed, nil
}

// DefaultTTL is how long a review's answer is reused: a Prometheus scraping
// every 15 s costs the API server at most two reviews per scrape and path,
// and a revoked binding or token stops working within this long.
const DefaultTTL = 10 * time.Second

// DefaultCacheSize bounds the answers kept: a flood of made-up tokens
// evicts answers (costing reviews) but cannot grow the memory.
const DefaultCacheSize = 1024

// Filter lets a request through to its handler only if its bearer token is
// authenticated (else 401) and its user may get the request's path (else
// 403). Answers, refusals included, are cached for TTL; errors talking to
// the API server are not (500, and the next request asks again).
type Filter struct {
	Reviewer Reviewer
	// Audience the Reviewer asks for, named in refusals.
	Audience string
	TTL      time.Duration
	// Size bounds each of the two caches (entries).
	Size int
	// Now is the clock (tests).
	Now func() time.Time

	once  sync.Once
	authn *cache[authnAnswer]
	authz *cache[bool]
}

type authnAnswer struct {
	user authnv1.UserInfo
	ok   bool
}

// NewFilter is a Filter asking the API server through client for tokens
// of audience, with the default TTL and size.
func NewFilter(client kubernetes.Interface, audience string) *Filter {
	return &Filter{Reviewer: APIReviewer{Client: client, Audience: audience}, Audience: audience}
}

func (f *Filter) init() {
	f.once.Do(func() {
		if f.TTL <= 0 {
			f.TTL = DefaultTTL
		}
		if f.Size <= 0 {
			f.Size = DefaultCacheSize
		}
		if f.Now == nil {
			f.Now = time.Now
		}
		f.authn = newCache[authnAnswer](f.Size)
		f.authz = newCache[bool](f.Size)
	})
}

// Wrap returns next behind the filter. Only GET and HEAD get through:
// scraping reads, and the review is for verb get.
func (f *Filter) Wrap(next http.Handler) http.Handler {
	f.init()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := bearer(r)
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="podvol metrics"`)
			http.Error(w, "Unauthorized: send a ServiceAccount token as Authorization: Bearer <token>", http.StatusUnauthorized)
			return
		}
		// The token only ever lives in memory as its hash.
		sum := sha256.Sum256([]byte(token))
		key := string(sum[:])
		now := f.Now()
		a, hit := f.authn.get(key, now)
		if !hit {
			user, ok, err := f.Reviewer.Authenticate(r.Context(), token)
			if err != nil {
				klog.ErrorS(err, "Cannot authenticate a metrics request", "path", r.URL.Path, "remote", r.RemoteAddr)
				http.Error(w, "Internal Server Error: the API server could not review the token", http.StatusInternalServerError)
				return
			}
			a = authnAnswer{user: user, ok: ok}
			f.authn.put(key, a, now, f.TTL)
		}
		if !a.ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="podvol metrics", error="invalid_token"`)
			http.Error(w, fmt.Sprintf("Unauthorized: the API server does not accept this token for audience %s: send a ServiceAccount token requested for it (a projected serviceAccountToken volume with that audience, or kubectl create token --audience %[1]s)", f.Audience), http.StatusUnauthorized)
			return
		}
		// The decision depends on the token's user and the path only.
		zkey := key + "\x00" + r.URL.Path
		allowed, hit := f.authz.get(zkey, now)
		if !hit {
			var err error
			allowed, err = f.Reviewer.Authorize(r.Context(), a.user, r.URL.Path)
			if err != nil {
				klog.ErrorS(err, "Cannot authorize a metrics request", "path", r.URL.Path, "user", a.user.Username)
				http.Error(w, "Internal Server Error: the API server could not review the access", http.StatusInternalServerError)
				return
			}
			f.authz.put(zkey, allowed, now, f.TTL)
		}
		if !allowed {
			klog.V(2).InfoS("Metrics request refused", "path", r.URL.Path, "user", a.user.Username)
			http.Error(w, fmt.Sprintf("Forbidden: user %q may not get %s (bind ClusterRole podvol-metrics-reader)", a.user.Username, r.URL.Path), http.StatusForbidden)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "Method Not Allowed", http.StatusMethodNotAllowed)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// bearer is the request's bearer token (RFC 6750: the scheme is
// case-insensitive).
func bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(h, " ")
	token = strings.TrimSpace(token)
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return "", false
	}
	return token, true
}

// cache is a map of answers that expire, of at most size entries.
type cache[V any] struct {
	mu      sync.Mutex
	size    int
	entries map[string]entry[V]
}

type entry[V any] struct {
	v       V
	expires time.Time
}

func newCache[V any](size int) *cache[V] {
	return &cache[V]{size: size, entries: make(map[string]entry[V])}
}

func (c *cache[V]) get(k string, now time.Time) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[k]
	if !ok || !now.Before(e.expires) {
		var zero V
		return zero, false
	}
	return e.v, true
}

func (c *cache[V]) put(k string, v V, now time.Time, ttl time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.entries[k]; !ok && len(c.entries) >= c.size {
		for key, e := range c.entries {
			if !now.Before(e.expires) {
				delete(c.entries, key)
			}
		}
		// Still full: drop the entries expiring first, a tenth of the
		// cache, so that a full cache is not swept at every put.
		if len(c.entries) >= c.size {
			keys := make([]string, 0, len(c.entries))
			for key := range c.entries {
				keys = append(keys, key)
			}
			slices.SortFunc(keys, func(a, b string) int { return c.entries[a].expires.Compare(c.entries[b].expires) })
			for _, key := range keys[:max(1, c.size/10)] {
				delete(c.entries, key)
			}
		}
	}
	c.entries[k] = entry[V]{v: v, expires: now.Add(ttl)}
}
