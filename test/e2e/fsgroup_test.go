package e2e

import (
	"testing"
)

// testNonRootPodWritesWithFsGroup: podvol advertises VOLUME_MOUNT_GROUP, so
// kubelet leaves the pod's fsGroup to podvol for every kind of podvol
// volume; a pod running as a non-root user writes to its generic ephemeral,
// inline and persistent volumes, and its files carry the fsGroup.
func testNonRootPodWritesWithFsGroup(t *testing.T) {
	n := ns(t)
	applyFile(t, "nonroot.yaml", map[string]string{"NS": n})
	waitPod(t, n, "nonroot")
	if got := exec(t, n, "nonroot", "id -u; stat -c %g /eph/f /inl/f /pvc/f"); got != "1000\n2000\n2000\n2000" {
		t.Fatalf("uid and the files' groups: %q, want uid 1000 and group 2000 on each", got)
	}
}
