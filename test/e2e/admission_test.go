package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/podvol/podvol/internal/devcluster"
)

// users gives noRights the right to create pods (and the extra resources) in
// namespace n, and withRights the same plus PersistentVolumeClaims.
func users(t *testing.T, n, noRights, withRights string, extra ...string) {
	t.Helper()
	res := strings.Join(append([]string{"pods"}, extra...), ", ")
	applyFile(t, "users.yaml", map[string]string{"NS": n, "RESOURCES": res, "NO_RIGHTS": noRights, "WITH_RIGHTS": withRights})
}

// asUser creates manifest with a server-side dry run as user.
func asUser(t *testing.T, user, manifest string) (string, error) {
	t.Helper()
	f := t.TempDir() + "/obj.yaml"
	must(t, "write", writeString(f, manifest))
	return cluster.RunKubectl(ctx(t), "--as", user, "create", "--dry-run=server", "-f", f)
}

// testAdmissionPolicyGaps: the ways around the PVC-rights policy are closed
// for a user without PVC rights (a ReplicationController, a StatefulSet's
// volumeClaimTemplates, a template that names no class while podvol's is the
// default, one naming podvol's class by the beta annotation, a podvol
// StorageClass the policy was not shipped with), and stay open for a user
// with them; a CSI
// inline podvol volume is capped in size for everyone, by a cap an admin can
// raise per namespace.
func testAdmissionPolicyGaps(t *testing.T) {
	n := ns(t)
	users(t, n, "carol", "dave", "replicationcontrollers")
	podWith := func(name, volume string) string {
		return "apiVersion: v1\nkind: Pod\nmetadata: {name: " + name + ", namespace: " + n + "}\nspec:\n" + podSpecYAML(volume)
	}
	ephemeralOf := func(class string) string {
		c := ""
		if class != "" {
			c = "\n      storageClassName: " + class
		}
		return "ephemeral:\n  volumeClaimTemplate:\n    spec:\n      accessModes: [ReadWriteOnce]" + c + "\n      resources: {requests: {storage: 64Mi}}"
	}
	admitted := func(what, user, manifest string) {
		t.Helper()
		eventually(t, time.Minute, func() string {
			if out, err := asUser(t, user, manifest); err != nil {
				return fmt.Sprintf("%s: %s was refused: %v\n%s", what, user, err, out)
			}
			return ""
		})
	}
	refused := func(what, user, manifest, why string) {
		t.Helper()
		eventually(t, 2*time.Minute, func() string {
			if out, err := asUser(t, user, manifest); err == nil || !strings.Contains(out, why) {
				return fmt.Sprintf("%s: %s was not refused with %q: %v\n%s", what, user, why, err, out)
			}
			return ""
		})
	}
	const noRights = "may not create PersistentVolumeClaims"

	// A ReplicationController's pods are created by a kube-system service
	// account, which the policy exempts: the RC itself is checked.
	rc := "apiVersion: v1\nkind: ReplicationController\nmetadata: {name: rc, namespace: " + n + "}\nspec:\n  replicas: 1\n  selector: {app: rc}\n  template:\n    metadata: {labels: {app: rc}}\n    spec:\n" +
		devcluster.PodSpec(6, "true", "vol", "/vol", ephemeralOf("podvol"))
	admitted("ReplicationController", "dave", rc)
	refused("ReplicationController", "carol", rc, noRights)

	// A StatefulSet's claim templates: the StatefulSet controller creates
	// data-sts-0 with its own rights. Another driver's class is let
	// through.
	sts := func(class string) string {
		return "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: sts, namespace: " + n + "}\nspec:\n  replicas: 1\n  serviceName: sts\n" +
			"  selector: {matchLabels: {app: sts}}\n  template:\n    metadata: {labels: {app: sts}}\n    spec:\n" +
			devcluster.PodSpec(6, "true", "data", "/data", "") +
			"  volumeClaimTemplates:\n  - metadata: {name: data}\n    spec:\n      accessModes: [ReadWriteOnce]\n      storageClassName: " + class +
			"\n      resources: {requests: {storage: 64Mi}}\n"
	}
	admitted("StatefulSet", "dave", sts("podvol"))
	refused("StatefulSet", "carol", sts("podvol"), "StatefulSet volumeClaimTemplates entry data asks for a podvol StorageClass")
	admitted("StatefulSet of another class", "carol", sts("not-podvol"))

	// A podvol StorageClass added after install is podvol's by its
	// provisioner.
	apply(t, "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {name: %s-extra}\nprovisioner: podvol.io\nvolumeBindingMode: WaitForFirstConsumer\n", n)
	t.Cleanup(func() { _, _ = cluster.RunKubectl(ctx(t), "delete", "storageclass", n+"-extra", "--ignore-not-found") })
	admitted("new podvol class", "dave", podWith("extra", ephemeralOf(n+"-extra")))
	refused("new podvol class", "carol", podWith("extra", ephemeralOf(n+"-extra")), noRights)

	// No class named, and podvol's is the cluster default.
	_, err := cluster.RunKubectl(ctx(t), "annotate", "storageclass", "podvol", "storageclass.kubernetes.io/is-default-class=true", "--overwrite")
	must(t, "make podvol the default class", err)
	t.Cleanup(func() {
		_, _ = cluster.RunKubectl(ctx(t), "annotate", "storageclass", "podvol", "storageclass.kubernetes.io/is-default-class-")
	})
	admitted("default class", "dave", podWith("default", ephemeralOf("")))
	refused("default class", "carol", podWith("default", ephemeralOf("")), "the default class is podvol's")

	// The beta annotation names the class before spec.storageClassName does.
	beta := podWith("beta", "ephemeral:\n  volumeClaimTemplate:\n    metadata:\n      annotations: {volume.beta.kubernetes.io/storage-class: podvol}\n    spec:\n      accessModes: [ReadWriteOnce]\n      storageClassName: other\n      resources: {requests: {storage: 64Mi}}")
	admitted("class by the beta annotation", "dave", beta)
	refused("class by the beta annotation", "carol", beta, noRights)

	// Inline volumes: capped for everyone, raised per namespace.
	inline := func(size string) string {
		return podWith("inline", "csi:\n  driver: podvol.io\n  volumeAttributes: {size: "+size+"}")
	}
	admitted("inline 1Gi", "dave", inline("1Gi"))
	refused("inline 20Gi", "dave", inline("20Gi"), "asks for more than 10Gi")
	_, err = cluster.RunKubectl(ctx(t), "annotate", "namespace", n, "podvol.io/inline-max-size=50Gi")
	must(t, "raise the namespace's inline cap", err)
	admitted("inline 20Gi under a raised cap", "carol", inline("20Gi"))
}
