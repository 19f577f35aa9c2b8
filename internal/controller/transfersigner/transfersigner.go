// Package transfersigner is the signer names.TransferSigner: it approves
// and signs the CertificateSigningRequests that podvol-node's pods make for
// their transfer certificates (internal/transfercert), and denies any other
// request for the signer, saying why on the CSR. It keeps the CA's key pair
// in Secret names.TransferCA of podvol's namespace, made on first start, and
// publishes the CA's certificate, the only part nodes need, in the
// ConfigMap of the same name. With Profile transfercert.Metrics the same
// code is the metrics-signer, of names.MetricsSigner and CA
// names.MetricsCA; Serving keeps podvol-controller's own metrics
// certificate from that CA.
package transfersigner

import (
	"context"
	"fmt"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/podvol/podvol/internal/names"
	"github.com/podvol/podvol/internal/transfercert"
)

// Condition reasons it writes on CSRs.
const (
	ReasonApproved = "PodvolNodeCertificate"
	ReasonDenied   = "NotAPodvolNode"
)

// Reconciler signs the CSRs of its Profile's signer (Transfer's if zero).
type Reconciler struct {
	Client  client.Client
	Profile transfercert.Profile
	// APIReader reads the CA's Secret and ConfigMap (neither is cached:
	// caching Secrets would cache every Secret of the cluster).
	APIReader client.Reader
	// Namespace is podvol's; NodeUser the node pods' ServiceAccount user
	// (system:serviceaccount:<namespace>:podvol-node).
	Namespace, NodeUser string
	Now                 func() time.Time
}

// SetupWithManager watches the signer's CSRs, and makes the CA when the
// manager starts (leader only), so that nodes can trust it before any of
// them asks.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	if r.Now == nil {
		r.Now = time.Now
	}
	if r.Profile.Signer == "" {
		r.Profile = transfercert.Transfer
	}
	if err := mgr.Add(caRunnable{r}); err != nil {
		return err
	}
	signer := r.Profile.Signer
	return ctrl.NewControllerManagedBy(mgr).
		Named(r.Profile.Name+"-signer").
		For(&certificatesv1.CertificateSigningRequest{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			csr, ok := o.(*certificatesv1.CertificateSigningRequest)
			return ok && csr.Spec.SignerName == signer
		}))).
		Complete(r)
}

// caRunnable makes the CA at start, on the leader.
type caRunnable struct{ r *Reconciler }

func (c caRunnable) Start(ctx context.Context) error {
	if _, err := c.r.ca(ctx); err != nil {
		// Not fatal: the first CSR tries again, and says so.
		log.FromContext(ctx).Error(err, "Cannot make or publish the CA", "signer", c.r.Profile.Signer, "namespace", c.r.Namespace, "name", c.r.Profile.CA)
	}
	return nil
}

func (caRunnable) NeedLeaderElection() bool { return true }

// Reconcile approves and signs one CSR, or denies it.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var csr certificatesv1.CertificateSigningRequest
	if err := r.Client.Get(ctx, req.NamespacedName, &csr); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if csr.Spec.SignerName != r.Profile.Signer || len(csr.Status.Certificate) > 0 ||
		condition(&csr, certificatesv1.CertificateDenied) || condition(&csr, certificatesv1.CertificateFailed) {
		return reconcile.Result{}, nil
	}
	lg := log.FromContext(ctx).WithValues("csr", csr.Name, "requester", csr.Spec.Username)
	node, err := r.Profile.Check(&csr, r.NodeUser)
	if err != nil {
		lg.Info("Refusing a certificate request", "signer", r.Profile.Signer, "reason", err.Error())
		msg := "podvol's " + r.Profile.Name + " signer: " + err.Error()
		if condition(&csr, certificatesv1.CertificateApproved) {
			// Approved by someone else: a CSR cannot be both approved and
			// denied, so the refusal to sign is a failure.
			csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
				Type: certificatesv1.CertificateFailed, Status: corev1.ConditionTrue, Reason: ReasonDenied,
				Message: msg, LastUpdateTime: metav1.NewTime(r.Now())})
			return reconcile.Result{}, r.Client.Status().Update(ctx, &csr)
		}
		csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
			Type: certificatesv1.CertificateDenied, Status: corev1.ConditionTrue, Reason: ReasonDenied,
			Message: msg, LastUpdateTime: metav1.NewTime(r.Now())})
		return reconcile.Result{}, r.Client.SubResource("approval").Update(ctx, &csr)
	}
	if !condition(&csr, certificatesv1.CertificateApproved) {
		csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
			Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: ReasonApproved,
			Message: "podvol-node on node " + node, LastUpdateTime: metav1.NewTime(r.Now())})
		// The update's event brings the CSR back, approved, to be signed.
		return reconcile.Result{}, r.Client.SubResource("approval").Update(ctx, &csr)
	}
	ca, err := r.ca(ctx)
	if err != nil {
		return reconcile.Result{}, err
	}
	pemCert, err := ca.SignFor(r.Profile, &csr, node, r.Now())
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("sign CSR %s for node %s: %w", csr.Name, node, err)
	}
	csr.Status.Certificate = pemCert
	if err := r.Client.Status().Update(ctx, &csr); err != nil {
		return reconcile.Result{}, err
	}
	lg.Info("Signed a certificate", "signer", r.Profile.Signer, "node", node)
	return reconcile.Result{}, nil
}

func condition(csr *certificatesv1.CertificateSigningRequest, t certificatesv1.RequestConditionType) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == t && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// ca reads the CA's Secret, making it if missing, and makes sure the
// ConfigMap publishes its certificate.
func (r *Reconciler) ca(ctx context.Context) (*transfercert.CA, error) {
	key := types.NamespacedName{Namespace: r.Namespace, Name: r.Profile.CA}
	var sec corev1.Secret
	err := r.APIReader.Get(ctx, key, &sec)
	if apierrors.IsNotFound(err) {
		var certPEM, keyPEM []byte
		if certPEM, keyPEM, err = r.Profile.NewCA(r.Now()); err != nil {
			return nil, err
		}
		sec = corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: r.Namespace, Name: r.Profile.CA,
			Labels: map[string]string{"app.kubernetes.io/part-of": "podvol"}},
			Type: corev1.SecretTypeTLS, Data: map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM}}
		err = r.Client.Create(ctx, &sec)
		if apierrors.IsAlreadyExists(err) {
			err = r.APIReader.Get(ctx, key, &sec)
		} else if err == nil {
			log.FromContext(ctx).Info("Made the CA", "signer", r.Profile.Signer, "secret", key.String())
		}
	}
	if err != nil {
		return nil, fmt.Errorf("the %s CA's Secret %s: %w", r.Profile.Name, key, err)
	}
	ca, err := transfercert.ParseCA(sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return nil, fmt.Errorf("the %s CA's Secret %s: %w (delete it to make a new CA; every node then asks for a new certificate)", r.Profile.Name, key, err)
	}
	var cm corev1.ConfigMap
	err = r.APIReader.Get(ctx, key, &cm)
	switch {
	case apierrors.IsNotFound(err):
		cm = corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: r.Namespace, Name: r.Profile.CA,
			Labels: map[string]string{"app.kubernetes.io/part-of": "podvol"}},
			Data: map[string]string{names.TransferCAKey: string(ca.CertPEM)}}
		err = client.IgnoreAlreadyExists(r.Client.Create(ctx, &cm))
	case err == nil && cm.Data[names.TransferCAKey] != string(ca.CertPEM):
		patch := client.MergeFrom(cm.DeepCopy())
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data[names.TransferCAKey] = string(ca.CertPEM)
		err = r.Client.Patch(ctx, &cm, patch)
	}
	if err != nil {
		return nil, fmt.Errorf("publish the %s CA in ConfigMap %s: %w", r.Profile.Name, key, err)
	}
	return ca, nil
}
