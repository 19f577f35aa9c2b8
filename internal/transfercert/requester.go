package transfercert

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"sync"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/podvol/podvol/internal/names"
	"github.com/podvol/podvol/internal/transfer"
)

// Requester keeps a node's transfer certificate (or another Profile's):
// it asks for one at start, and for the next at two thirds of each one's
// life. It is the plugin's transfer.Credentials.
type Requester struct {
	Client kubernetes.Interface
	// Profile is what is asked for: Transfer if zero.
	Profile Profile
	// Node is this node; Namespace is podvol's (ConfigMap names.TransferCA).
	Node, Namespace string
	// Wait bounds how long one request waits for its certificate; Retry is
	// the pause after a failed one. Defaults: 2 minutes, 30 seconds.
	Wait, Retry time.Duration

	mu       sync.Mutex
	cert     *tls.Certificate
	roots    *x509.CertPool
	rootsAt  time.Time
	rootsErr error
}

var _ transfer.Credentials = (*Requester)(nil)

// rootsTTL: how long a read of the CA ConfigMap is used; a rotated CA is
// trusted by every node within it.
const rootsTTL = time.Minute

// ErrNoCertificate: a transfer (or a metrics handshake) before the node has
// its first certificate.
var ErrNoCertificate = errors.New("this node has no certificate of podvol's signer yet")

// Certificate is the current one.
func (r *Requester) Certificate() (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cert == nil {
		return nil, fmt.Errorf("%w: podvol-controller's %s-signer signs it (kubectl get csr)", ErrNoCertificate, r.profile().Name)
	}
	return r.cert, nil
}

// Roots are the CA certificates of ConfigMap names.TransferCA, read again
// after rootsTTL.
func (r *Requester) Roots() (*x509.CertPool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if time.Since(r.rootsAt) < rootsTTL && (r.roots != nil || r.rootsErr != nil) {
		return r.roots, r.rootsErr
	}
	r.rootsAt = time.Now()
	r.roots, r.rootsErr = r.readRoots()
	return r.roots, r.rootsErr
}

func (r *Requester) readRoots() (*x509.CertPool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cm, err := r.Client.CoreV1().ConfigMaps(r.Namespace).Get(ctx, names.TransferCA, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("the transfer CA (ConfigMap %s/%s, made by podvol-controller's transfer-signer): %w", r.Namespace, names.TransferCA, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(cm.Data[names.TransferCAKey])) {
		return nil, fmt.Errorf("ConfigMap %s/%s has no PEM certificate under %s", r.Namespace, names.TransferCA, names.TransferCAKey)
	}
	return pool, nil
}

func (r *Requester) profile() Profile {
	if r.Profile.Signer == "" {
		return Transfer
	}
	return r.Profile
}

// Run keeps the certificate until ctx ends.
func (r *Requester) Run(ctx context.Context) {
	retry := r.Retry
	if retry <= 0 {
		retry = 30 * time.Second
	}
	p := r.profile()
	log := klog.FromContext(ctx).WithValues("node", r.Node, "certificate", p.Name)
	for {
		cert, err := r.Request(ctx)
		next := retry
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			log.Error(err, "Cannot get this node's certificate: what needs it fails until it is signed (transfers from and to this node; a scraper's verification of its metrics server); retrying", "retryIn", retry)
		} else {
			leaf := cert.Leaf
			next = time.Until(leaf.NotBefore.Add(leaf.NotAfter.Sub(leaf.NotBefore) * 2 / 3))
			log.Info("Got this node's certificate", "notAfter", leaf.NotAfter, "renewIn", next.Round(time.Second))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(max(next, time.Second)):
		}
	}
}

// Request asks for a certificate and waits until it is signed (it is then
// the one Certificate returns), denied or Wait passes.
func (r *Requester) Request(ctx context.Context) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	p := r.profile()
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: p.CommonName(r.Node)}, DNSNames: p.DNSNames}, key)
	if err != nil {
		return nil, err
	}
	csr, err := r.Client.CertificatesV1().CertificateSigningRequests().Create(ctx, &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "podvol-" + p.Name + "-" + r.Node + "-"},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request:           pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName:        p.Signer,
			ExpirationSeconds: ptr.To(int32(Lifetime / time.Second)),
			Usages:            p.Usages,
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create a CertificateSigningRequest: %w", err)
	}
	wait := r.Wait
	if wait <= 0 {
		wait = 2 * time.Minute
	}
	log := klog.FromContext(ctx).WithValues("csr", csr.Name)
	log.Info("Asked for this node's certificate", "certificate", p.Name)
	deadline := time.Now().Add(wait)
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
		got, err := r.Client.CertificatesV1().CertificateSigningRequests().Get(ctx, csr.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return nil, fmt.Errorf("CertificateSigningRequest %s was deleted before it was signed", csr.Name)
		case err != nil:
			log.Info("Cannot read the CertificateSigningRequest", "err", err)
		default:
			for _, c := range got.Status.Conditions {
				if (c.Type == certificatesv1.CertificateDenied || c.Type == certificatesv1.CertificateFailed) && c.Status == corev1.ConditionTrue {
					return nil, fmt.Errorf("CertificateSigningRequest %s %s: %s: %s", csr.Name, c.Type, c.Reason, c.Message)
				}
			}
			if len(got.Status.Certificate) > 0 {
				cert, err := keyPair(got.Status.Certificate, key)
				if err != nil {
					return nil, fmt.Errorf("CertificateSigningRequest %s: %w", csr.Name, err)
				}
				r.mu.Lock()
				r.cert = cert
				r.mu.Unlock()
				return cert, nil
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("CertificateSigningRequest %s not signed after %s: is podvol-controller running with the %s-signer controller?", csr.Name, wait, p.Name)
		}
	}
}

func keyPair(certPEM []byte, key *ecdsa.PrivateKey) (*tls.Certificate, error) {
	var chain [][]byte
	for rest := certPEM; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type == "CERTIFICATE" {
			chain = append(chain, b.Bytes)
		}
	}
	if len(chain) == 0 {
		return nil, errors.New("the signed certificate is not PEM")
	}
	leaf, err := x509.ParseCertificate(chain[0])
	if err != nil {
		return nil, err
	}
	if pub, ok := leaf.PublicKey.(*ecdsa.PublicKey); !ok || !pub.Equal(&key.PublicKey) {
		return nil, errors.New("the signed certificate is not for this request's key")
	}
	return &tls.Certificate{Certificate: chain, PrivateKey: key, Leaf: leaf}, nil
}
