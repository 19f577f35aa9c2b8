package devcluster

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
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

func (p pki) ensure(nodeName string) error {
	if _, err := os.Stat(p.path("ca.crt")); err == nil {
		return nil
	}
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		return err
	}
	caKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "podvol-dev-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().AddDate(10, 0, 0),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, _ := x509.ParseCertificate(caDER)
	if err := p.write("ca", caDER, caKey); err != nil {
		return err
	}
	certs := []struct {
		name, cn string
		orgs     []string
		dns      []string
		ips      []string
	}{
		{"apiserver", "kube-apiserver", nil, []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}, []string{"127.0.0.1", "10.0.0.1"}},
		{"admin", "admin", []string{"system:masters"}, nil, nil},
		{"kubelet", "system:node:" + nodeName, []string{"system:nodes"}, []string{"localhost", nodeName}, []string{"127.0.0.1"}},
	}
	for i, c := range certs {
		key, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			return err
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(int64(i + 2)), Subject: pkix.Name{CommonName: c.cn, Organization: c.orgs},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().AddDate(10, 0, 0),
			KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
			DNSNames:    c.dns,
		}
		for _, ip := range c.ips {
			tmpl.IPAddresses = append(tmpl.IPAddresses, net.ParseIP(ip))
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return err
		}
		if err := p.write(c.name, der, key); err != nil {
			return err
		}
	}
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
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

func (p pki) write(name string, der []byte, key *rsa.PrivateKey) error {
	if err := os.WriteFile(p.path(name+".crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(p.path(name+".key"), pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600)
}

// kubeconfig writes a kubeconfig for the user whose certificate is certName.
func (p pki) kubeconfig(path, certName string) error {
	return os.WriteFile(path, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: podvol-dev
  cluster: {server: "https://127.0.0.1:6443", certificate-authority: %q}
users:
- name: %s
  user: {client-certificate: %q, client-key: %q}
contexts:
- name: podvol-dev
  context: {cluster: podvol-dev, user: %s}
current-context: podvol-dev
`, p.path("ca.crt"), certName, p.path(certName+".crt"), p.path(certName+".key"), certName)), 0o600)
}
