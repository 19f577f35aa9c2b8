package transfer

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"k8s.io/klog/v2"
)

// Credentials are a node's: its certificate (both ends of a transfer show
// one) and the roots a peer's must chain to. Both are read at every
// handshake, so a renewed certificate or a rotated CA takes effect at once.
type Credentials interface {
	Certificate() (*tls.Certificate, error)
	Roots() (*x509.CertPool, error)
}

// ServerTLS is the source's configuration: TLS 1.3, a client certificate
// required and verified against the current roots.
func ServerTLS(c Credentials) *tls.Config {
	base := &tls.Config{
		MinVersion: tls.VersionTLS13,
		NextProtos: []string{"http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return c.Certificate()
		},
	}
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		roots, err := c.Roots()
		if err != nil {
			return nil, err
		}
		cfg := base.Clone()
		cfg.GetConfigForClient = nil
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		cfg.ClientCAs = roots
		return cfg, nil
	}
	return base
}

// ClientTLS is the target's configuration for pulling from node: TLS 1.3,
// its own certificate, and the server's verified against the current roots
// and required to name node. Host names are not checked (a node's address
// is not in its certificate); the node name is.
func ClientTLS(c Credentials, node string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		NextProtos: []string{"http/1.1"},
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return c.Certificate()
		},
		// Verification is done below, against the roots of the moment and
		// the node's name instead of a host name.
		InsecureSkipVerify: true, //nolint:gosec // VerifyConnection verifies the chain.
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the source showed no certificate")
			}
			roots, err := c.Roots()
			if err != nil {
				return err
			}
			inter := x509.NewCertPool()
			for _, ic := range cs.PeerCertificates[1:] {
				inter.AddCert(ic)
			}
			leaf := cs.PeerCertificates[0]
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
				return fmt.Errorf("the source's certificate: %w", err)
			}
			got, err := NodeOf(leaf)
			if err != nil {
				return err
			}
			if got != node {
				return fmt.Errorf("the source's certificate names node %s, not %s", got, node)
			}
			return nil
		},
	}
}

// Client is an HTTP client for pulls from node. Its connections are not
// kept idle: one pull is one long GET.
func Client(c Credentials, node string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:       ClientTLS(c, node),
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: time.Minute,
		DisableKeepAlives:     true,
		ForceAttemptHTTP2:     false,
	}}
}

// Serve serves pulls on lis with TLS until ctx ends; it closes lis.
func Serve(ctx context.Context, lis net.Listener, c Credentials, h http.Handler) error {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       time.Minute,
		TLSConfig:         ServerTLS(c),
		// HTTP/1.1 only: a pull is one stream, which HTTP/2's flow control
		// windows would only slow.
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
		ErrorLog:     nil,
	}
	klog.InfoS("Serving transfers", "address", lis.Addr().String())
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
		case <-done:
			return
		}
		_ = srv.Close() // pulls in progress resume from their checkpoints
	}()
	if err := srv.Serve(tls.NewListener(lis, srv.TLSConfig)); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
