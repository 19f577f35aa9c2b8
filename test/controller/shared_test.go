package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/podvol/podvol/internal/versions"
	"github.com/podvol/podvol/test/kubetest"
)

// api is the package's one kube-apiserver (and etcd): starting one costs
// seconds, so the tests share it, each running its own manager, and each
// leaves it as it found it (wipe).
var api *kubetest.Env

func TestMain(m *testing.M) {
	ctrl.SetLogger(klog.NewKlogr())
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var crds []string
	for _, d := range []struct{ module, dir string }{
		{versions.GatewayAPIModule, "config/crd/standard"},
		{versions.SnapshotterClient, "config/crd"},
	} {
		dir, err := moduleDir(d.module)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		crds = append(crds, filepath.Join(dir, d.dir))
	}
	var stop func() error
	var err error
	api, stop, err = kubetest.Shared(kubetest.Options{CRDDirs: crds, FeatureGates: "CrossNamespaceVolumeDataSource=true",
		// The protection finalizers are removed by kube-controller-manager,
		// which does not run here.
		Flags: map[string]string{"disable-admission-plugins": "StorageObjectInUseProtection"}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := m.Run()
	if err := stop(); err != nil {
		fmt.Fprintf(os.Stderr, "stop kube-apiserver and etcd: %v\n", err)
		code = 1
	}
	return code
}

func moduleDir(module string) (string, error) {
	out, err := exec.Command("go", "mod", "download", "-json", module).Output()
	if err != nil {
		return "", fmt.Errorf("download %s for its CRDs: %w", module, err)
	}
	var m struct{ Dir string }
	if err := json.Unmarshal(out, &m); err != nil {
		return "", fmt.Errorf("go mod download %s: %w", module, err)
	}
	return m.Dir, nil
}

// shared makes sure that what the test leaves on the package's API server
// is removed when it ends, after its manager stopped (cleanups run last
// registered first, and the manager's is registered after this one).
func shared(t *testing.T) {
	t.Cleanup(func() {
		if err := wipe(context.Background()); err != nil {
			t.Errorf("clean the shared API server up after %s: %v", t.Name(), err)
		}
	})
}

// wipe removes every object a test may have made: cluster-scoped ones, and
// namespaced ones in every namespace (the namespaces themselves stay: none
// is ever deleted here). Finalizers go first: no controller runs now.
func wipe(ctx context.Context) error {
	c, err := client.New(api.Config, client.Options{})
	if err != nil {
		return err
	}
	content := func(kind string) *unstructured.UnstructuredList {
		l := &unstructured.UnstructuredList{}
		l.SetGroupVersionKind(schema.GroupVersionKind{Group: "snapshot.storage.k8s.io", Version: "v1", Kind: kind + "List"})
		return l
	}
	grants := &unstructured.UnstructuredList{}
	grants.SetGroupVersionKind(schema.GroupVersionKind{Group: "gateway.networking.k8s.io", Version: "v1beta1", Kind: "ReferenceGrantList"})
	lists := []client.ObjectList{
		&corev1.PodList{}, &corev1.PersistentVolumeClaimList{}, &corev1.ConfigMapList{}, &corev1.EventList{}, &policyv1.PodDisruptionBudgetList{},
		&coordinationv1.LeaseList{}, content("VolumeSnapshot"), grants,
		&corev1.NodeList{}, &corev1.PersistentVolumeList{}, &storagev1.CSINodeList{}, &storagev1.StorageClassList{},
		content("VolumeSnapshotContent"),
	}
	for _, l := range lists {
		if err := c.List(ctx, l); err != nil {
			return fmt.Errorf("list %T: %w", l, err)
		}
		var objs []client.Object
		switch l := l.(type) {
		case *unstructured.UnstructuredList:
			for i := range l.Items {
				objs = append(objs, &l.Items[i])
			}
		default:
			items, err := metaItems(l)
			if err != nil {
				return err
			}
			objs = items
		}
		for _, o := range objs {
			if o.GetNamespace() == "kube-system" || o.GetName() == "kube-root-ca.crt" {
				continue
			}
			if len(o.GetFinalizers()) > 0 {
				patch := client.MergeFrom(o.DeepCopyObject().(client.Object))
				o.SetFinalizers(nil)
				if err := c.Patch(ctx, o, patch); client.IgnoreNotFound(err) != nil {
					return fmt.Errorf("drop the finalizers of %T %s: %w", o, o.GetName(), err)
				}
			}
			if err := c.Delete(ctx, o, client.GracePeriodSeconds(0)); client.IgnoreNotFound(err) != nil {
				return fmt.Errorf("delete %T %s/%s: %w", o, o.GetNamespace(), o.GetName(), err)
			}
		}
	}
	return nil
}

func metaItems(l client.ObjectList) ([]client.Object, error) {
	items, err := meta.ExtractList(l)
	if err != nil {
		return nil, err
	}
	objs := make([]client.Object, 0, len(items))
	for _, i := range items {
		objs = append(objs, i.(client.Object))
	}
	return objs, nil
}
