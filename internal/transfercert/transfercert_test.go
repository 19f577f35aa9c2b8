package transfercert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/utils/ptr"

	"github.com/podvol/podvol/internal/names"
	"github.com/podvol/podvol/internal/transfer"
)

const nodeUser = "system:serviceaccount:podvol-system:podvol-node"

func request(t *testing.T, tmpl *x509.CertificateRequest) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

func csrFor(t *testing.T, user, extraNode string, tmpl *x509.CertificateRequest) *certificatesv1.CertificateSigningRequest {
	csr := &certificatesv1.CertificateSigningRequest{Spec: certificatesv1.CertificateSigningRequestSpec{
		SignerName: names.TransferSigner, Username: user, Usages: Usages, Request: request(t, tmpl),
		ExpirationSeconds: ptr.To(int32(Lifetime / time.Second)),
	}}
	if extraNode != "" {
		csr.Spec.Extra = map[string]certificatesv1.ExtraValue{names.NodeNameExtra: {extraNode}}
	}
	return csr
}

func TestCheck(t *testing.T) {
	good := func() *x509.CertificateRequest {
		return &x509.CertificateRequest{Subject: pkix.Name{CommonName: transfer.CommonName("node-a")}}
	}
	if node, err := Check(csrFor(t, nodeUser, "node-a", good()), nodeUser); err != nil || node != "node-a" {
		t.Fatalf("a good request: %q, %v", node, err)
	}
	for name, c := range map[string]struct {
		csr  *certificatesv1.CertificateSigningRequest
		want string
	}{
		"other user":       {csrFor(t, "system:serviceaccount:tenant:default", "node-a", good()), "only " + nodeUser},
		"no node":          {csrFor(t, nodeUser, "", good()), "bound to no pod"},
		"another node":     {csrFor(t, nodeUser, "node-b", good()), "from node node-b must ask"},
		"organization":     {csrFor(t, nodeUser, "node-a", &x509.CertificateRequest{Subject: pkix.Name{CommonName: transfer.CommonName("node-a"), Organization: []string{"system:masters"}}}), "must ask for exactly"},
		"alternative name": {csrFor(t, nodeUser, "node-a", &x509.CertificateRequest{Subject: good().Subject, DNSNames: []string{"kubernetes.default"}}), "alternative names"},
		"usages": {func() *certificatesv1.CertificateSigningRequest {
			c := csrFor(t, nodeUser, "node-a", good())
			c.Spec.Usages = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth, certificatesv1.UsageCodeSigning}
			return c
		}(), "usages"},
		"signer": {func() *certificatesv1.CertificateSigningRequest {
			c := csrFor(t, nodeUser, "node-a", good())
			c.Spec.SignerName = "kubernetes.io/kube-apiserver-client"
			return c
		}(), "signer"},
		"two nodes": {func() *certificatesv1.CertificateSigningRequest {
			c := csrFor(t, nodeUser, "node-a", good())
			c.Spec.Extra[names.NodeNameExtra] = certificatesv1.ExtraValue{"node-a", "node-b"}
			return c
		}(), "bound to no pod"},
		"not PEM": {func() *certificatesv1.CertificateSigningRequest {
			c := csrFor(t, nodeUser, "node-a", good())
			c.Spec.Request = []byte("node-a, please")
			return c
		}(), "not a PEM"},
	} {
		if _, err := Check(c.csr, nodeUser); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", name, err, c.want)
		}
	}
}

// A signed certificate names the node, lasts what was asked up to
// Lifetime, and chains to the CA.
func TestSign(t *testing.T) {
	now := time.Now()
	certPEM, keyPEM, err := NewCA(now)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := ParseCA(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	csr := csrFor(t, nodeUser, "node-a", &x509.CertificateRequest{Subject: pkix.Name{CommonName: transfer.CommonName("node-a")}})
	for _, c := range []struct {
		asked *int32
		want  time.Duration
	}{{nil, Lifetime}, {ptr.To(int32(3600)), time.Hour}, {ptr.To(int32(7 * 24 * 3600)), Lifetime}} {
		csr.Spec.ExpirationSeconds = c.asked
		out, err := ca.Sign(csr, "node-a", now)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := pem.Decode(out)
		cert, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if got := cert.NotAfter.Sub(now); got < c.want-time.Second || got > c.want+time.Second {
			t.Errorf("asked %v: lasts %s, want %s", c.asked, got, c.want)
		}
		if node, err := transfer.NodeOf(cert); err != nil || node != "node-a" {
			t.Errorf("names %q (%v)", node, err)
		}
		pool := x509.NewCertPool()
		pool.AddCert(ca.Cert)
		if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Error(err)
		}
	}
}

// A node's metrics serving certificate: asked with exactly the node's
// server name, server auth only; signed, it verifies for that name against
// its CA, and not as a client.
func TestMetricsProfile(t *testing.T) {
	good := func() *x509.CertificateRequest {
		return &x509.CertificateRequest{Subject: pkix.Name{CommonName: Metrics.CommonName("node-a")}, DNSNames: []string{names.MetricsNodeServerName}}
	}
	csr := func(tmpl *x509.CertificateRequest, usages ...certificatesv1.KeyUsage) *certificatesv1.CertificateSigningRequest {
		c := csrFor(t, nodeUser, "node-a", tmpl)
		c.Spec.SignerName, c.Spec.Usages = names.MetricsSigner, Metrics.Usages
		if usages != nil {
			c.Spec.Usages = usages
		}
		return c
	}
	if node, err := Metrics.Check(csr(good()), nodeUser); err != nil || node != "node-a" {
		t.Fatalf("a good request: %q, %v", node, err)
	}
	for name, c := range map[string]struct {
		csr  *certificatesv1.CertificateSigningRequest
		want string
	}{
		"controller's name": {csr(&x509.CertificateRequest{Subject: good().Subject, DNSNames: []string{names.MetricsControllerServerName}}), "exactly the DNS names"},
		"another name too":  {csr(&x509.CertificateRequest{Subject: good().Subject, DNSNames: []string{names.MetricsNodeServerName, "kubernetes.default"}}), "exactly the DNS names"},
		"no name":           {csr(&x509.CertificateRequest{Subject: good().Subject}), "exactly the DNS names"},
		"client auth":       {csr(good(), certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth, certificatesv1.UsageClientAuth), "usages"},
		"transfer signer": {func() *certificatesv1.CertificateSigningRequest {
			c := csr(good())
			c.Spec.SignerName = names.TransferSigner
			return c
		}(), "signer"},
		"another node": {csr(&x509.CertificateRequest{Subject: pkix.Name{CommonName: Metrics.CommonName("node-b")}, DNSNames: good().DNSNames}), "must ask for exactly"},
	} {
		if _, err := Metrics.Check(c.csr, nodeUser); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", name, err, c.want)
		}
	}
	// A transfer request is no metrics request, nor the other way round.
	if _, err := Transfer.Check(csr(good()), nodeUser); err == nil {
		t.Error("the transfer signer passed a metrics request")
	}

	now := time.Now()
	certPEM, keyPEM, err := Metrics.NewCA(now)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := ParseCA(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	out, err := ca.SignFor(Metrics, csr(good()), "node-a", now)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(out)
	cert, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: names.MetricsNodeServerName}); err != nil {
		t.Errorf("as %s: %v", names.MetricsNodeServerName, err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: names.MetricsControllerServerName}); err == nil {
		t.Errorf("a node's certificate verifies as %s", names.MetricsControllerServerName)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Error("a metrics certificate verifies as a client's")
	}
	if _, err := transfer.NodeOf(cert); err == nil {
		t.Error("a metrics certificate names a node for transfers")
	}
}
