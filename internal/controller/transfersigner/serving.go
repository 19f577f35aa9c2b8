package transfersigner

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"sync"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/podvol/podvol/internal/names"
)

// Serving keeps podvol-controller's own metrics serving certificate,
// for names.MetricsControllerServerName, issued with the CA of its Signer
// (a Reconciler with transfercert.Metrics) directly, as this process holds
// the CA's key: no CSR. Every replica runs it, leader or not (each serves
// its metrics); the first to start makes the CA if there is none. It
// renews at two thirds of a certificate's life.
type Serving struct {
	Signer *Reconciler
	// Retry is the pause after a failure (30 s if 0).
	Retry time.Duration

	mu   sync.Mutex
	cert *tls.Certificate
}

// Certificate is the current one, or an error before the first.
func (s *Serving) Certificate() (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cert == nil {
		return nil, errors.New("podvol-controller's metrics certificate is not issued yet")
	}
	return s.cert, nil
}

// Start keeps the certificate until ctx ends.
func (s *Serving) Start(ctx context.Context) error {
	retry := s.Retry
	if retry <= 0 {
		retry = 30 * time.Second
	}
	if s.Signer.Now == nil {
		s.Signer.Now = time.Now
	}
	lg := log.FromContext(ctx).WithValues("ca", s.Signer.Profile.CA)
	for {
		next := retry
		cert, err := s.issue(ctx)
		if err != nil {
			lg.Error(err, "Cannot issue podvol-controller's metrics certificate: its metrics are served with a self-signed one until then; retrying", "retryIn", retry)
		} else {
			s.mu.Lock()
			s.cert = cert
			s.mu.Unlock()
			next = time.Until(cert.Leaf.NotBefore.Add(cert.Leaf.NotAfter.Sub(cert.Leaf.NotBefore) * 2 / 3))
			lg.Info("Issued podvol-controller's metrics certificate", "serverName", names.MetricsControllerServerName, "notAfter", cert.Leaf.NotAfter)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(max(next, time.Second)):
		}
	}
}

// NeedLeaderElection: every replica serves metrics.
func (s *Serving) NeedLeaderElection() bool { return false }

func (s *Serving) issue(ctx context.Context) (*tls.Certificate, error) {
	ca, err := s.Signer.ca(ctx)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	certPEM, err := ca.Serving("podvol-controller metrics", names.MetricsControllerServerName, &key.PublicKey, s.Signer.Now())
	if err != nil {
		return nil, err
	}
	b, _ := pem.Decode(certPEM)
	leaf, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return nil, err
	}
	return &tls.Certificate{Certificate: [][]byte{b.Bytes}, PrivateKey: key, Leaf: leaf}, nil
}
