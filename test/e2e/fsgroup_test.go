package e2e

import (
	"strings"
	"testing"

	"github.com/podvol/podvol/internal/devcluster"
)

// TestNonRootPodWritesWithFsGroup: podvol advertises VOLUME_MOUNT_GROUP, so
// kubelet leaves the pod's fsGroup to podvol for every kind of podvol
// volume; a pod running as a non-root user writes to its generic ephemeral,
// inline and persistent volumes, and its files carry the fsGroup.
func TestNonRootPodWritesWithFsGroup(t *testing.T) {
	n := ns(t)
	pvc(t, n, "data", "podvol", "64Mi", "")
	apply(t, `apiVersion: v1
kind: Pod
metadata: {name: nonroot, namespace: %s}
spec:
  terminationGracePeriodSeconds: 1
  securityContext: {runAsUser: 1000, runAsGroup: 1000, fsGroup: 2000}
  containers:
  - name: main
    image: %s
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "for d in /eph /inl /pvc; do echo ok > $d/f || exit 1; done; touch /eph/ready; exec sleep 36000"]
    readinessProbe: {exec: {command: [test, -e, /eph/ready]}, periodSeconds: 1}
    volumeMounts: [{name: eph, mountPath: /eph}, {name: inl, mountPath: /inl}, {name: pvc, mountPath: /pvc}]
  volumes:
  - name: eph
%s
  - name: inl
    csi: {driver: podvol.io, volumeAttributes: {size: 64Mi}}
  - name: pvc
    persistentVolumeClaim: {claimName: data}
`, n, devcluster.Image, indentLines(ephemeralVolume, 4))
	waitPod(t, n, "nonroot")
	if got := exec(t, n, "nonroot", "id -u; stat -c %g /eph/f /inl/f /pvc/f"); got != "1000\n2000\n2000\n2000" {
		t.Fatalf("uid and the files' groups: %q, want uid 1000 and group 2000 on each", got)
	}
}

func indentLines(s string, n int) string {
	pad := strings.Repeat(" ", n)
	return pad + strings.ReplaceAll(s, "\n", "\n"+pad)
}
