package migration

import (
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/podvol/podvol/internal/names"
)

// What the copy's node says on the copy's claim when the source's node is
// lost during a migration (internal/mobility; node-loss marks the PV).

// copyCondition is the copy's claim's DataCopied condition, nil if none.
func copyCondition(clone *corev1.PersistentVolumeClaim) *corev1.PersistentVolumeClaimCondition {
	for i := range clone.Status.Conditions {
		if clone.Status.Conditions[i].Type == names.DataCopied {
			return &clone.Status.Conditions[i]
		}
	}
	return nil
}

// sourceLostCopy is why the copy was given up because its source's node
// is lost and it held no instant of the volume; "" if it was not.
func sourceLostCopy(clone *corev1.PersistentVolumeClaim) string {
	if c := copyCondition(clone); c != nil && c.Status == corev1.ConditionFalse && c.Reason == names.ReasonSourceLost {
		return c.Message
	}
	return ""
}

// preCopyOnly is what the copy holds when its source's node was lost after
// the pre-copy (the copy's node's word: which instant); "" if the copy is
// whole.
func preCopyOnly(clone *corev1.PersistentVolumeClaim) string {
	if c := copyCondition(clone); c != nil && c.Status == corev1.ConditionTrue && c.Reason == names.ReasonPreCopyOnly {
		return c.Message
	}
	return ""
}

// brief is a message cut to fit in an event with more words around it
// (the API limits an event's message to 1 kB).
func brief(msg string) string {
	const most = 500
	if len(msg) > most {
		return strings.ToValidUTF8(msg[:most], "") + "..."
	}
	return msg
}
