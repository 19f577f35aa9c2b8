package mobility

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/podvol/podvol/internal/transfer"
)

// ReasonVersionMismatch is the reason of the Warning a pull refused for
// its transfer protocol's version leaves on its claims.
const ReasonVersionMismatch = "TransferVersionMismatch"

// Warnings posts Warning events where a claim's user looks: on the claim a
// pull is for and on the claim that one clones (a migration's copy clones
// the claim that moves, which is the one its user watches).
type Warnings struct {
	Client   kubernetes.Interface
	Recorder record.EventRecorder
}

// Warn posts reason and msg on claim c (if it is still that claim) and on
// the claim it clones. Best effort: what cannot be read is logged.
func (w *Warnings) Warn(ctx context.Context, c transfer.Claim, reason, msg string) {
	if w == nil || w.Client == nil || w.Recorder == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	pvc, err := w.Client.CoreV1().PersistentVolumeClaims(c.Namespace).Get(ctx, c.Name, metav1.GetOptions{})
	if err != nil || string(pvc.UID) != c.UID {
		klog.FromContext(ctx).V(2).Info("Cannot post a warning on a claim", "claim", c.String(), "reason", reason, "err", err)
		return
	}
	w.Recorder.Event(pvc, corev1.EventTypeWarning, reason, msg)
	ref := dataSource(pvc)
	if ref == nil || ref.Kind != "PersistentVolumeClaim" || (ref.APIGroup != nil && *ref.APIGroup != "") {
		return
	}
	src, err := w.Client.CoreV1().PersistentVolumeClaims(pvc.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if err != nil {
		klog.FromContext(ctx).V(2).Info("Cannot post a warning on the claim a claim clones", "claim", c.String(), "source", ref.Name, "reason", reason, "err", err)
		return
	}
	w.Recorder.Event(src, corev1.EventTypeWarning, reason, msg)
}

// Mismatch is transfer.Server's Mismatch: the caller may be a plugin too
// old to say why its pull fails, so the source says it on the claims. It
// does not hold up the answer.
func (w *Warnings) Mismatch(ctx context.Context, r transfer.Request, err error) {
	go w.Warn(context.WithoutCancel(ctx), r.Claim, ReasonVersionMismatch, err.Error())
}
