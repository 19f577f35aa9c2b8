package metricsauth

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"
)

// Sidecar is a container of the same pod whose metrics endpoint
// (--http-endpoint) listens on loopback, re-served at /metrics/<Name>.
type Sidecar struct {
	Name    string
	Address string // host:port on a loopback address
}

var sidecarName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`)

// ParseSidecars reads a flag's value: comma-separated name=host:port, each
// address on loopback so that the proxy reaches only this pod (or, with the
// host network, this host's own loopback) and nothing on the network.
func ParseSidecars(v string) ([]Sidecar, error) {
	var out []Sidecar
	seen := map[string]bool{}
	for _, item := range strings.Split(v, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, addr, ok := strings.Cut(item, "=")
		if !ok || !sidecarName.MatchString(name) {
			return nil, fmt.Errorf("sidecar %q: want name=host:port, the name in lower-case letters, digits and dashes", item)
		}
		if seen[name] {
			return nil, fmt.Errorf("sidecar %s named twice", name)
		}
		seen[name] = true
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, fmt.Errorf("sidecar %s: address %q: %w", name, addr, err)
		}
		if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
			return nil, fmt.Errorf("sidecar %s: address %q is not a loopback IP address: only the sidecar's own unauthenticated endpoint on loopback may be re-served", name, addr)
		}
		out = append(out, Sidecar{Name: name, Address: addr})
	}
	return out, nil
}

// Config is what Serve serves.
type Config struct {
	// Address to listen on, e.g. :9808.
	Address string
	// CertFile and KeyFile are the serving certificate (PEM), read again
	// when they change (a rotated Secret): an admin's own.
	CertFile, KeyFile string
	// Certificate, with neither file given, is the serving certificate
	// podvol's metrics CA issued (transfercert.Requester with the Metrics
	// profile, or podvol-controller's own), asked for at each handshake;
	// while it returns an error (not issued yet), and with no files and no
	// Certificate at all, a self-signed certificate made at start.
	Certificate func() (*tls.Certificate, error)
	// Filter authenticates and authorizes every path but /healthz. Nil
	// serves plain HTTP with no authentication, which Serve allows only
	// on a loopback address (running the plugin by hand, tests).
	Filter *Filter
	// Metrics is served at /metrics.
	Metrics http.Handler
	// Sidecars are re-served at /metrics/<name>.
	Sidecars []Sidecar
	// Healthz, if not nil, is served at /healthz without authentication,
	// for the kubelet's probes.
	Healthz http.Handler
}

// Serve serves until ctx ends. It logs "Serving metrics" with the address
// it listens on (tests find a port 0's there).
func Serve(ctx context.Context, c Config) error {
	lis, err := net.Listen("tcp", c.Address)
	if err != nil {
		return fmt.Errorf("listen on %s for metrics: %w", c.Address, err)
	}
	return ServeListener(ctx, lis, c)
}

// ServeListener is Serve on a listener it closes.
func ServeListener(ctx context.Context, lis net.Listener, c Config) (err error) {
	defer func() {
		// srv.Serve closes it; this is for the returns before.
		if cerr := lis.Close(); cerr != nil && !errors.Is(cerr, net.ErrClosed) && err == nil {
			err = cerr
		}
	}()
	if c.Filter == nil {
		if ip := lis.Addr().(*net.TCPAddr).IP; !ip.IsLoopback() {
			return fmt.Errorf("metrics on %s without authentication: only a loopback address may serve them so; give the plugin API access (in-cluster or --kubeconfig)", lis.Addr())
		}
	}
	handler, err := c.handler()
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	scheme := "http"
	if c.Filter != nil {
		scheme = "https"
		tc, err := c.tlsConfig(lis.Addr())
		if err != nil {
			return err
		}
		srv.TLSConfig = tc
		lis = tls.NewListener(lis, tc)
	}
	klog.InfoS("Serving metrics", "address", lis.Addr().String(), "scheme", scheme, "authenticated", c.Filter != nil, "sidecars", len(c.Sidecars))
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
		case <-done:
			return
		}
		// ctx is done: the shutdown gets a few seconds of its own.
		shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(shutdown); err != nil {
			klog.ErrorS(err, "Shutting down the metrics server")
		}
	}()
	if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func (c Config) handler() (http.Handler, error) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", c.Metrics)
	for _, s := range c.Sidecars {
		mux.Handle("/metrics/"+s.Name, sidecarProxy(s))
	}
	var h http.Handler = mux
	if c.Filter != nil {
		h = c.Filter.Wrap(mux)
	}
	if c.Healthz == nil {
		return h, nil
	}
	// /healthz goes around the filter: the kubelet's probe has no token.
	outer := http.NewServeMux()
	outer.Handle("/healthz", c.Healthz)
	outer.Handle("/", h)
	return outer, nil
}

// sidecarProxy re-serves a sidecar's /metrics. The caller's token stays
// here: the sidecar needs none and should not see it.
func sidecarProxy(s Sidecar) http.Handler {
	target := &url.URL{Scheme: "http", Host: s.Address, Path: "/metrics"}
	return &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.Out.URL = target
			r.Out.Host = s.Address
			r.Out.Header.Del("Authorization")
			r.Out.Header.Del("Cookie")
		},
		Transport: &http.Transport{Proxy: nil, DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
			ResponseHeaderTimeout: 30 * time.Second, MaxIdleConns: 2},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			klog.ErrorS(err, "Cannot reach a sidecar's metrics", "sidecar", s.Name, "address", s.Address)
			http.Error(w, fmt.Sprintf("Bad Gateway: sidecar %s's metrics at %s: %v", s.Name, s.Address, err), http.StatusBadGateway)
		},
	}
}

func (c Config) tlsConfig(addr net.Addr) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.CertFile == "" && c.KeyFile == "" {
		cert, err := selfSigned(addr)
		if err != nil {
			return nil, err
		}
		if c.Certificate == nil {
			klog.InfoS("Metrics are served with a self-signed certificate made at start: scrape with insecure_skip_verify, or give a certificate (--metrics-cert-file, --metrics-key-file)")
			tc.Certificates = []tls.Certificate{cert}
			return tc, nil
		}
		// The kubelet's probe of /healthz needs a handshake before the
		// CA's certificate comes: a scraper that verifies fails until then.
		var warned atomic.Bool
		tc.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			issued, err := c.Certificate()
			if err == nil {
				return issued, nil
			}
			if !warned.Swap(true) {
				klog.InfoS("Metrics are served with a self-signed certificate until podvol's metrics CA issues one", "reason", err.Error())
			}
			return &cert, nil
		}
		return tc, nil
	}
	if c.CertFile == "" || c.KeyFile == "" {
		return nil, fmt.Errorf("metrics certificate: give both the certificate file and the key file, or neither for a self-signed one")
	}
	r := &reloader{cert: c.CertFile, key: c.KeyFile}
	if _, err := r.get(); err != nil {
		return nil, err
	}
	tc.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return r.get() }
	return tc, nil
}

// reloader reads the key pair again when either file changes, so that a
// renewed certificate (a Secret updated by cert-manager) needs no restart.
type reloader struct {
	cert, key string
	mu        sync.Mutex
	stamp     string
	pair      *tls.Certificate
}

func (r *reloader) get() (*tls.Certificate, error) {
	stamp := ""
	for _, f := range []string{r.cert, r.key} {
		st, err := os.Stat(f)
		if err != nil {
			return nil, fmt.Errorf("metrics certificate: %w", err)
		}
		stamp += fmt.Sprintf("%d/%d;", st.ModTime().UnixNano(), st.Size())
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pair != nil && stamp == r.stamp {
		return r.pair, nil
	}
	pair, err := tls.LoadX509KeyPair(r.cert, r.key)
	if err != nil {
		if r.pair != nil {
			// Half-written during a rotation: keep serving the old pair.
			klog.ErrorS(err, "Cannot load the new metrics certificate; serving the previous one", "cert", r.cert, "key", r.key)
			return r.pair, nil
		}
		return nil, fmt.Errorf("metrics certificate %s, key %s: %w", r.cert, r.key, err)
	}
	r.pair, r.stamp = &pair, stamp
	return r.pair, nil
}

// selfSigned is a certificate for the host's name and the listening
// address, valid for a year (the process restarts long before).
func selfSigned(addr net.Addr) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		return tls.Certificate{}, err
	}
	host, _ := os.Hostname()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "podvol metrics " + host},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	if host != "" {
		tmpl.DNSNames = append(tmpl.DNSNames, host)
	}
	if a, ok := addr.(*net.TCPAddr); ok && !a.IP.IsUnspecified() && !a.IP.IsLoopback() {
		tmpl.IPAddresses = append(tmpl.IPAddresses, a.IP)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("self-signed metrics certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
