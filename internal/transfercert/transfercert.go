// Package transfercert gives each node's plugin the certificate it shows in
// transfers (internal/transfer), issued through the Kubernetes
// CertificateSigningRequest API: the plugin asks (Requester), podvol-
// controller's transfer-signer checks and signs (Check, CA.Sign). What makes
// a certificate name a node is the API server's own word: a CSR's requester
// as authenticated, which for a pod-bound ServiceAccount token includes the
// node the pod runs on (user extra names.NodeNameExtra). Only podvol-node on
// node N gets a certificate for node N.
package transfercert

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"

	"github.com/podvol/podvol/internal/names"
	"github.com/podvol/podvol/internal/transfer"
)

// Lifetime is the longest a node certificate lasts; the requester renews
// at two thirds of it.
const Lifetime = 24 * time.Hour

// caLifetime: the CA outlives every certificate it signs by far; rotating
// it is replacing Secret names.TransferCA (docs/operations.md).
const caLifetime = 10 * 365 * 24 * time.Hour

// Usages a node certificate is requested and signed with: the same key
// serves and pulls.
var Usages = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth, certificatesv1.UsageClientAuth}

// Profile is what one of podvol's signers signs for nodes, each with a CA
// of its own.
type Profile struct {
	// Name says which in logs, errors and CSR names: "transfer", "metrics".
	Name string
	// Signer is the CSRs' signer name.
	Signer string
	// CA names the Secret that holds the CA's key pair and the ConfigMap
	// that publishes its certificate (under names.TransferCAKey).
	CA string
	// CommonName is the subject of node's certificate, and all of it.
	CommonName func(node string) string
	// DNSNames a node's certificate holds, exactly (and no other
	// alternative name).
	DNSNames []string
	// Usages are requested and checked; ExtKeyUsages are signed.
	Usages       []certificatesv1.KeyUsage
	ExtKeyUsages []x509.ExtKeyUsage
}

// Transfer is the transfer certificate: the node in the subject, for both
// ends of a transfer, no alternative names.
var Transfer = Profile{Name: "transfer", Signer: names.TransferSigner, CA: names.TransferCA, CommonName: transfer.CommonName,
	Usages: Usages, ExtKeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}

// Metrics is a node's metrics serving certificate: what its plugin shows a
// scraper, who verifies names.MetricsNodeServerName against the CA of
// ConfigMap names.MetricsCA. Server auth only: no use as a client, and a
// transfer peer does not accept it (another CA).
var Metrics = Profile{Name: "metrics", Signer: names.MetricsSigner, CA: names.MetricsCA,
	CommonName:   func(node string) string { return "system:podvol-metrics:" + node },
	DNSNames:     []string{names.MetricsNodeServerName},
	Usages:       []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth},
	ExtKeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}

// Check is Transfer.Check.
func Check(csr *certificatesv1.CertificateSigningRequest, nodeUser string) (string, error) {
	return Transfer.Check(csr, nodeUser)
}

// Check says which node a CSR of p.Signer may be signed for, or why it must
// not: its requester must be nodeUser (podvol-node's ServiceAccount) with a
// token bound to a pod on one node; its request a signed PKCS#10 whose
// subject is that node's common name and nothing else, with exactly
// p.DNSNames as alternative names; its usages exactly p.Usages.
func (p Profile) Check(csr *certificatesv1.CertificateSigningRequest, nodeUser string) (string, error) {
	if csr.Spec.SignerName != p.Signer {
		return "", fmt.Errorf("signer %s is not %s", csr.Spec.SignerName, p.Signer)
	}
	if csr.Spec.Username != nodeUser {
		return "", fmt.Errorf("requested by %s: only %s may ask for a %s certificate", csr.Spec.Username, nodeUser, p.Name)
	}
	nodes := csr.Spec.Extra[names.NodeNameExtra]
	if len(nodes) != 1 || nodes[0] == "" {
		return "", fmt.Errorf("requested with a token bound to no pod on a node (no user extra %s): use the pod's projected ServiceAccount token", names.NodeNameExtra)
	}
	node := nodes[0]
	block, _ := pem.Decode(csr.Spec.Request)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return "", errors.New("the request is not a PEM CERTIFICATE REQUEST")
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return "", fmt.Errorf("the request: %w", err)
	}
	if err := req.CheckSignature(); err != nil {
		return "", fmt.Errorf("the request's signature: %w", err)
	}
	want := pkix.Name{CommonName: p.CommonName(node)}
	if req.Subject.String() != want.String() {
		return "", fmt.Errorf("subject %q: a request from node %s must ask for exactly %q", req.Subject.String(), node, want.String())
	}
	if len(req.IPAddresses)+len(req.EmailAddresses)+len(req.URIs) > 0 || !sameSet(req.DNSNames, p.DNSNames) {
		if len(p.DNSNames) == 0 {
			return "", fmt.Errorf("the request names alternative names: a %s certificate has none", p.Name)
		}
		return "", fmt.Errorf("the request names alternative names %q %v: a %s certificate has exactly the DNS names %q", req.DNSNames, req.IPAddresses, p.Name, p.DNSNames)
	}
	if !sameSet(csr.Spec.Usages, p.Usages) {
		return "", fmt.Errorf("usages %v, want %v", csr.Spec.Usages, p.Usages)
	}
	return node, nil
}

func sameSet[T comparable](got, want []T) bool {
	if len(got) != len(want) {
		return false
	}
	for _, w := range want {
		if !slices.Contains(got, w) {
			return false
		}
	}
	return true
}

// CA is the signer's key pair.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
	// CertPEM is what nodes trust (ConfigMap names.TransferCA).
	CertPEM []byte
}

// NewCA makes a CA for Transfer, returned as PEM (certificate, PKCS#8
// key).
func NewCA(now time.Time) (certPEM, keyPEM []byte, err error) { return Transfer.NewCA(now) }

// NewCA makes p's CA, returned as PEM (certificate, PKCS#8 key).
func (p Profile) NewCA(now time.Time) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: p.Signer + " CA"},
		NotBefore: now.Add(-5 * time.Minute), NotAfter: now.Add(caLifetime),
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), nil
}

// ParseCA reads a CA made by NewCA (a Secret's tls.crt and tls.key).
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	cb, _ := pem.Decode(certPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, errors.New("the CA certificate is not PEM")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("the CA certificate: %w", err)
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return nil, errors.New("the CA key is not PEM")
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("the CA key: %w", err)
	}
	key, ok := k.(crypto.Signer)
	if !ok {
		return nil, errors.New("the CA key cannot sign")
	}
	if !cert.IsCA {
		return nil, errors.New("the CA certificate is not a CA's")
	}
	return &CA{Cert: cert, Key: key, CertPEM: certPEM}, nil
}

// Sign is SignFor(Transfer, ...).
func (ca *CA) Sign(csr *certificatesv1.CertificateSigningRequest, node string, now time.Time) ([]byte, error) {
	return ca.SignFor(Transfer, csr, node, now)
}

// SignFor issues the certificate of a CSR that p.Check passed for node: for
// the CSR's requested duration (at most Lifetime) and never beyond the CA's.
func (ca *CA) SignFor(p Profile, csr *certificatesv1.CertificateSigningRequest, node string, now time.Time) ([]byte, error) {
	block, _ := pem.Decode(csr.Spec.Request)
	if block == nil {
		return nil, errors.New("the request is not PEM")
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, err
	}
	life := Lifetime
	if s := csr.Spec.ExpirationSeconds; s != nil && time.Duration(*s)*time.Second < life {
		life = max(time.Duration(*s)*time.Second, 10*time.Minute)
	}
	return ca.issue(&x509.Certificate{Subject: pkix.Name{CommonName: p.CommonName(node)}, DNSNames: p.DNSNames, ExtKeyUsage: p.ExtKeyUsages},
		req.PublicKey, now, life)
}

// Serving issues a server certificate for the DNS name dnsName to key, for
// Lifetime: podvol-controller's own metrics certificate, issued with the
// CA it holds rather than through a CSR.
func (ca *CA) Serving(commonName, dnsName string, key crypto.PublicKey, now time.Time) ([]byte, error) {
	return ca.issue(&x509.Certificate{Subject: pkix.Name{CommonName: commonName}, DNSNames: []string{dnsName},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, key, now, Lifetime)
}

// issue signs tmpl's subject, names and extended usages for key, from now
// for life and never beyond the CA.
func (ca *CA) issue(tmpl *x509.Certificate, key crypto.PublicKey, now time.Time, life time.Duration) ([]byte, error) {
	notAfter := now.Add(life)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, err
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore, tmpl.NotAfter = now.Add(-5*time.Minute), notAfter
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key, ca.Key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

func serialNumber() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}
