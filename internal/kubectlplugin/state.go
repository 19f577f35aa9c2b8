package kubectlplugin

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/podvol/podvol/internal/names"
)

// What deploy/base names (checked against it by this package's tests).
const (
	// DefaultNamespace is where deploy/base puts podvol.
	DefaultNamespace = "podvol-system"
	// NodePodSelector selects the podvol-node DaemonSet's pods.
	NodePodSelector = "app.kubernetes.io/name=podvol,app.kubernetes.io/component=node"
	// PluginContainer is the plugin's container in those pods.
	PluginContainer = "plugin"
	// inlineSizeFlag is the plugin's flag for the size of an inline volume
	// that names none, and defaultInlineSize its default.
	inlineSizeFlag    = "--inline-default-size="
	defaultInlineSize = "1Gi"
)

// VolumeSnapshotContents are read without the snapshotter's client (not a
// dependency of this module): only a few fields matter.
var contentsGVR = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshotcontents"}

// Content is what is read of a VolumeSnapshotContent.
type Content struct {
	Name string
	// SourceVolume is the handle of the volume it was taken of (empty for
	// a pre-provisioned one).
	SourceVolume string
	// Handle is the snapshot's handle (snap-<id>@<node>), once made.
	Handle string
	// Snapshot is the VolumeSnapshot bound to it, namespace/name.
	Snapshot     string
	RestoreBytes int64
	Ready        bool
}

// State is everything the subcommands read from the API, at one time.
type State struct {
	// Namespace is podvol's.
	Namespace  string
	Nodes      []corev1.Node
	CSINodes   []storagev1.CSINode
	Capacities []storagev1.CSIStorageCapacity
	Classes    []storagev1.StorageClass
	// PVs are podvol's (spec.csi.driver).
	PVs    []corev1.PersistentVolume
	PVCs   []corev1.PersistentVolumeClaim
	Pods   []corev1.Pod
	Plugin []corev1.Pod
	// RuntimeClasses that take direct-assigned volumes (annotation
	// names.DirectAssignAnnotation), for directAssign: auto.
	DirectRuntimes map[string]bool
	// Contents are podvol's VolumeSnapshotContents; ContentsErr says why
	// there are none when they could not be read.
	Contents    []Content
	ContentsErr error
	// Records are node-loss's ConfigMaps of released volumes.
	Records []corev1.ConfigMap
	// Stats are the kubelets' stats summaries by node, and why a node's is
	// missing.
	Stats    map[string]*statsv1alpha1.Summary
	StatsErr map[string]error
}

// Clients are the API clients Gather and Reclaim use.
type Clients struct {
	Kube    kubernetes.Interface
	Dynamic dynamic.Interface
	// Summary fetches a node's kubelet stats summary (through the API
	// server's node proxy); nil: none are read.
	Summary func(ctx context.Context, node string) (*statsv1alpha1.Summary, error)
}

// NodeProxySummary reads a kubelet's /stats/summary through the API server's
// node proxy (RBAC: get nodes/proxy).
func NodeProxySummary(kube kubernetes.Interface) func(ctx context.Context, node string) (*statsv1alpha1.Summary, error) {
	return func(ctx context.Context, node string) (*statsv1alpha1.Summary, error) {
		b, err := kube.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", node, "proxy/stats/summary").DoRaw(ctx)
		if err != nil {
			return nil, fmt.Errorf("the kubelet's stats summary of node %s through the API server's node proxy: %w", node, err)
		}
		s := &statsv1alpha1.Summary{}
		if err := json.Unmarshal(b, s); err != nil {
			return nil, fmt.Errorf("the kubelet's stats summary of node %s: %w", node, err)
		}
		return s, nil
	}
}

// What Gather reads.
type GatherOptions struct {
	// Stats: read the kubelets' stats summaries (volumes' used bytes).
	Stats bool
	// Pods: read every pod (volumes' users, inline volumes).
	Pods bool
}

// Gather reads the state from the API. Snapshot contents and stats are
// optional (CRDs not installed, no nodes/proxy right): their errors are kept
// in the State, not returned.
func Gather(ctx context.Context, c Clients, namespace string, o GatherOptions) (*State, error) {
	st := &State{Namespace: namespace, DirectRuntimes: map[string]bool{}}
	list := func(what string, f func() error) error {
		if err := f(); err != nil {
			return fmt.Errorf("list %s: %w", what, err)
		}
		return nil
	}
	lo := metav1.ListOptions{}
	steps := []struct {
		what string
		f    func() error
	}{
		{"nodes", func() error {
			l, err := c.Kube.CoreV1().Nodes().List(ctx, lo)
			if err == nil {
				st.Nodes = l.Items
			}
			return err
		}},
		{"CSINodes", func() error {
			l, err := c.Kube.StorageV1().CSINodes().List(ctx, lo)
			if err == nil {
				st.CSINodes = l.Items
			}
			return err
		}},
		{"CSIStorageCapacities", func() error {
			l, err := c.Kube.StorageV1().CSIStorageCapacities("").List(ctx, lo)
			if err == nil {
				st.Capacities = l.Items
			}
			return err
		}},
		{"StorageClasses", func() error {
			l, err := c.Kube.StorageV1().StorageClasses().List(ctx, lo)
			if err == nil {
				st.Classes = l.Items
			}
			return err
		}},
		{"PersistentVolumes", func() error {
			l, err := c.Kube.CoreV1().PersistentVolumes().List(ctx, lo)
			if err == nil {
				for _, pv := range l.Items {
					if pv.Spec.CSI != nil && pv.Spec.CSI.Driver == names.Driver {
						st.PVs = append(st.PVs, pv)
					}
				}
			}
			return err
		}},
		{"PersistentVolumeClaims", func() error {
			l, err := c.Kube.CoreV1().PersistentVolumeClaims("").List(ctx, lo)
			if err == nil {
				st.PVCs = l.Items
			}
			return err
		}},
		{"podvol's node pods in " + namespace, func() error {
			l, err := c.Kube.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: NodePodSelector})
			if err == nil {
				st.Plugin = l.Items
			}
			return err
		}},
		{"node-loss's records in " + namespace, func() error {
			l, err := c.Kube.CoreV1().ConfigMaps(namespace).List(ctx, metav1.ListOptions{LabelSelector: names.ReleasedLabel + "=true"})
			if err == nil {
				st.Records = l.Items
			}
			return err
		}},
		{"RuntimeClasses", func() error {
			l, err := c.Kube.NodeV1().RuntimeClasses().List(ctx, lo)
			if err == nil {
				for _, rc := range l.Items {
					if rc.Annotations[names.DirectAssignAnnotation] == "true" {
						st.DirectRuntimes[rc.Name] = true
					}
				}
			}
			return err
		}},
	}
	if o.Pods {
		steps = append(steps, struct {
			what string
			f    func() error
		}{"pods", func() error {
			l, err := c.Kube.CoreV1().Pods("").List(ctx, lo)
			if err == nil {
				st.Pods = l.Items
			}
			return err
		}})
	}
	for _, s := range steps {
		if err := list(s.what, s.f); err != nil {
			return nil, err
		}
	}
	st.Contents, st.ContentsErr = contents(ctx, c.Dynamic)
	if o.Stats && c.Summary != nil {
		st.Stats, st.StatsErr = map[string]*statsv1alpha1.Summary{}, map[string]error{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, n := range st.Nodes {
			wg.Go(func() {
				s, err := c.Summary(ctx, n.Name)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					st.StatsErr[n.Name] = err
					return
				}
				st.Stats[n.Name] = s
			})
		}
		wg.Wait()
	}
	return st, nil
}

// contents lists podvol's VolumeSnapshotContents; none when the snapshot
// CRDs are not installed.
func contents(ctx context.Context, dc dynamic.Interface) ([]Content, error) {
	if dc == nil {
		return nil, fmt.Errorf("no client for VolumeSnapshotContents")
	}
	l, err := dc.Resource(contentsGVR).List(ctx, metav1.ListOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list VolumeSnapshotContents: %w", err)
	}
	var cs []Content
	for _, u := range l.Items {
		if d, _, _ := unstructured.NestedString(u.Object, "spec", "driver"); d != names.Driver {
			continue
		}
		c := Content{Name: u.GetName()}
		c.SourceVolume, _, _ = unstructured.NestedString(u.Object, "spec", "source", "volumeHandle")
		c.Handle, _, _ = unstructured.NestedString(u.Object, "status", "snapshotHandle")
		if c.Handle == "" {
			c.Handle, _, _ = unstructured.NestedString(u.Object, "spec", "source", "snapshotHandle")
		}
		ns, _, _ := unstructured.NestedString(u.Object, "spec", "volumeSnapshotRef", "namespace")
		name, _, _ := unstructured.NestedString(u.Object, "spec", "volumeSnapshotRef", "name")
		if name != "" {
			c.Snapshot = ns + "/" + name
		}
		c.RestoreBytes, _, _ = unstructured.NestedInt64(u.Object, "status", "restoreSize")
		c.Ready, _, _ = unstructured.NestedBool(u.Object, "status", "readyToUse")
		cs = append(cs, c)
	}
	return cs, nil
}
