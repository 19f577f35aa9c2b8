package deploy

import (
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/podvol/podvol/internal/controller/transfersigner"
	"github.com/podvol/podvol/internal/errkind"
	"github.com/podvol/podvol/internal/names"
	"github.com/podvol/podvol/internal/transfer"
	"github.com/podvol/podvol/internal/transfercert"
)

// TestTransferCertificates: podvol-controller's transfer-signer, with the
// token and the RBAC of podvol-controller, signs a transfer certificate for
// podvol-node on node-a and on node-b, each naming its own node, from the
// pods' own tokens; refuses, on the CSR, a node asking for another node's
// name, a podvol-node token bound to no pod, and anyone else; and the two
// certificates carry a pull from node-a to node-b, verified against the CA
// the signer published.
func TestTransferCertificates(t *testing.T) {
	e := start(t)
	ctrlToken, err := e.admin.kc.CoreV1().ServiceAccounts(namespace).CreateToken(bg, "podvol-controller",
		&authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(e.api.Config)
	cfg.BearerToken = ctrlToken.Status.Token
	runController(t, "transfer-signer", cfg, func(mgr ctrl.Manager) error {
		return (&transfersigner.Reconciler{Client: mgr.GetClient(), Namespace: namespace, NodeUser: saUser}).SetupWithManager(mgr)
	})

	// The CA is published when the signer starts, before any node asks:
	// nodes serving transfers need it to trust their callers.
	if err := eventually(30*time.Second, func() error {
		_, err := e.admin.kc.CoreV1().ConfigMaps(namespace).Get(bg, names.TransferCA, metav1.GetOptions{})
		return err
	}); err != nil {
		t.Fatalf("ConfigMap %s after the signer started: %v", names.TransferCA, err)
	}

	requester := func(id *identity, node string) *transfercert.Requester {
		return &transfercert.Requester{Client: id.kc, Node: node, Namespace: namespace, Wait: 30 * time.Second}
	}
	issued := map[string]*transfercert.Requester{}
	for _, c := range []struct {
		id   *identity
		node string
	}{{e.nodeA, "node-a"}, {e.nodeB, "node-b"}} {
		r := requester(c.id, c.node)
		start := time.Now()
		cert, err := r.Request(bg)
		if err != nil {
			t.Fatalf("%s asking for its certificate: %v", c.id.name, err)
		}
		if got := cert.Leaf.Subject.CommonName; got != transfer.CommonName(c.node) {
			t.Errorf("%s got a certificate for %q", c.id.name, got)
		}
		if life := cert.Leaf.NotAfter.Sub(start); life > transfercert.Lifetime+time.Minute || life < transfercert.Lifetime-time.Hour {
			t.Errorf("%s's certificate lasts %s, want %s", c.id.name, life, transfercert.Lifetime)
		}
		roots, err := r.Roots()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("%s's certificate does not chain to ConfigMap %s: %v", c.id.name, names.TransferCA, err)
		}
		t.Logf("%s: certificate for %s signed in %s", c.id.name, c.node, time.Since(start).Round(time.Millisecond))
		issued[c.node] = r
	}

	t.Run("Refused", func(t *testing.T) {
		for _, c := range []struct {
			id         *identity
			node, want string
		}{
			{e.nodeA, "node-b", `must ask for exactly "CN=system:podvol-transfer:node-a"`},
			{e.unbound, "node-a", "no user extra " + names.NodeNameExtra},
			{e.admin, "node-a", "only " + saUser + " may ask"},
		} {
			_, err := requester(c.id, c.node).Request(bg)
			if err == nil || !strings.Contains(err.Error(), "Denied") || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s asking for %s's certificate: %v, want denied saying %q", c.id.name, c.node, err, c.want)
			}
		}
		// Nothing denied was signed, whoever asked.
		csrs, err := e.admin.kc.CertificatesV1().CertificateSigningRequests().List(bg, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, csr := range csrs.Items {
			denied := false
			for _, c := range csr.Status.Conditions {
				denied = denied || c.Type == certificatesv1.CertificateDenied
			}
			if denied && len(csr.Status.Certificate) > 0 {
				t.Errorf("CSR %s of %s was denied and signed", csr.Name, csr.Spec.Username)
			}
		}
	})

	t.Run("Pull", func(t *testing.T) {
		dir := t.TempDir()
		img := filepath.Join(dir, "snap-1.img")
		data := []byte(strings.Repeat("podvol moves data between nodes\n", 4096))
		if err := os.WriteFile(img, data, 0o600); err != nil {
			t.Fatal(err)
		}
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		sctx, stop := context.WithCancel(bg)
		served := make(chan error, 1)
		go func() {
			served <- transfer.Serve(sctx, lis, issued["node-a"], &transfer.Server{Images: oneImage(img), Authorizer: allowNode("node-b")})
		}()
		t.Cleanup(func() {
			stop()
			if err := <-served; err != nil {
				t.Error(err)
			}
		})
		dst, err := os.Create(filepath.Join(dir, "copy.img"))
		if err != nil {
			t.Fatal(err)
		}
		defer dst.Close()
		pull := &transfer.Pull{Client: transfer.Client(issued["node-b"], "node-a"), Address: lis.Addr().String(), Source: "snap-1",
			Claim: transfer.Claim{Namespace: "tenant", Name: "data", UID: "u"}, Dst: dst}
		if _, err := pull.Run(bg); err != nil {
			t.Fatalf("node-b pulling from node-a: %v", err)
		}
		got, err := os.ReadFile(dst.Name())
		if err != nil || string(got) != string(data) {
			t.Fatalf("the copy differs (%v)", err)
		}
		// node-a's certificate does not pass for node-b's server.
		pull.Client = transfer.Client(issued["node-b"], "node-b")
		if _, err := pull.Run(bg); err == nil || !strings.Contains(err.Error(), "names node node-a, not node-b") {
			t.Errorf("a pull that expects node-b from node-a's server: %v", err)
		}
	})
}

type oneImage string

func (o oneImage) Open(context.Context, transfer.Request) (transfer.Image, error) {
	f, err := os.Open(string(o))
	if err != nil {
		return transfer.Image{}, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return transfer.Image{}, err
	}
	return transfer.Image{File: f, Size: fi.Size(), Identity: "1"}, nil
}

type allowNode string

func (a allowNode) Authorize(_ context.Context, r *transfer.Request) error {
	if r.Caller != string(a) {
		return fmt.Errorf("only %s may pull: %w", string(a), errkind.ErrDenied)
	}
	return nil
}
