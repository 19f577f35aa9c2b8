package devcluster

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki makes the cluster's CA and the certificates its components use. Keys
// and certificates are written once and reused by later runs.
type pki struct{ dir string }

func (p pki) path(name string) string { return filepath.Join(p.dir, name) }

func newKey() (*rsa.PrivateKey, error) { return rsa.GenerateKey(rand.Reader, 2048) }

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	return n
}

// ensure makes the CA, the API server's serving certificate, the admin's
// client certificate and the service account key pair.
func (p pki) ensure() error {
	if _, err := os.Stat(p.path("ca.crt")); err == nil {
		return nil
	}
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		return err
	}
	caKey, err := newKey()
	if err != nil {
		return err
	}
	caTmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "podvol-dev-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().AddDate(10, 0, 0),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	if err := p.write("ca", caDER, caKey); err != nil {
		return err
	}
	if err := p.issue("apiserver", "kube-apiserver", nil, []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}, []string{"127.0.0.1", apiServiceIP}); err != nil {
		return err
	}
	if err := p.issue("admin", "admin", []string{"system:masters"}, nil, nil); err != nil {
		return err
	}
	saKey, err := newKey()
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return err
	}
	if err := os.WriteFile(p.path("sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(p.path("sa.key"), pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(saKey)}), 0o600)
}

// kubelet issues the kubelet's certificate for a node name (the Node
// authorizer wants system:node:<name>) and returns its base name.
func (p pki) kubelet(node, ip string) (string, error) {
	name := "kubelet-" + node
	if _, err := os.Stat(p.path(name + ".crt")); err == nil {
		return name, nil
	}
	return name, p.issue(name, "system:node:"+node, []string{"system:nodes"}, []string{node}, []string{ip, "127.0.0.1"})
}

// issue signs a certificate with the CA.
func (p pki) issue(name, cn string, orgs, dns, ips []string) error {
	ca, caKey, err := p.ca()
	if err != nil {
		return err
	}
	key, err := newKey()
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().AddDate(10, 0, 0),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:    dns,
	}
	for _, ip := range ips {
		tmpl.IPAddresses = append(tmpl.IPAddresses, net.ParseIP(ip))
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	return p.write(name, der, key)
}

func (p pki) ca() (*x509.Certificate, *rsa.PrivateKey, error) {
	certPEM, err := os.ReadFile(p.path("ca.crt"))
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err := os.ReadFile(p.path("ca.key"))
	if err != nil {
		return nil, nil, err
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, nil, errors.New("the CA files in " + p.dir + " are damaged: run make down, then make demo")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, err
	}
	key, err := x509.ParsePKCS1PrivateKey(kb.Bytes)
	return cert, key, err
}

func (p pki) write(name string, der []byte, key *rsa.PrivateKey) error {
	if err := os.WriteFile(p.path(name+".crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(p.path(name+".key"), pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600)
}

// kubeconfig writes a kubeconfig for the user whose certificate is certName,
// for use on the host.
func (p pki) kubeconfig(path, certName string) error {
	return p.kubeconfigFor(path, certName, "https://127.0.0.1:6443")
}

// kubeconfigFor writes a kubeconfig for the user whose certificate is
// certName that reaches the API server at server.
func (p pki) kubeconfigFor(path, certName, server string) error {
	return os.WriteFile(path, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: podvol-dev
  cluster: {server: %q, certificate-authority: %q}
users:
- name: %s
  user: {client-certificate: %q, client-key: %q}
contexts:
- name: podvol-dev
  context: {cluster: podvol-dev, user: %s}
current-context: podvol-dev
`, server, p.path("ca.crt"), certName, p.path(certName+".crt"), p.path(certName+".key"), certName)), 0o600)
}
