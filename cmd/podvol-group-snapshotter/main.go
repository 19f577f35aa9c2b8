// Command podvol-group-snapshotter takes the VolumeGroupSnapshots of one
// node's podvol volumes to that node's plugin. It runs beside the plugin in
// each node pod, as csi-snapshotter --node-deployment does for single
// snapshots, and is that sidecar's own controller (external-snapshotter's
// pkg/sidecar-controller, the version internal/versions pins) given other
// informers:
//
//   - VolumeGroupSnapshotContents labelled with this node (podvol-controller's
//     snapshot-import labels each with the node of its members' volumes, as
//     snapshot-controller does for single contents);
//   - every VolumeGroupSnapshotClass: csi-snapshotter --node-deployment sees
//     only classes labelled with its node, and a class is cluster-wide (its
//     label can name one node), so no node would ever find one;
//   - no VolumeSnapshotContent: the node's csi-snapshotter takes those (it
//     runs with --feature-gates=CSIVolumeGroupSnapshot=false), and two
//     sidecars must never race on one content.
//
// docs/proposals/snapshotter-node-group-snapshots.md is the upstream change
// that would make this command unnecessary.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-lib-utils/connection"
	"github.com/kubernetes-csi/csi-lib-utils/metrics"
	csirpc "github.com/kubernetes-csi/csi-lib-utils/rpc"
	clientset "github.com/kubernetes-csi/external-snapshotter/client/v8/clientset/versioned"
	snapshotscheme "github.com/kubernetes-csi/external-snapshotter/client/v8/clientset/versioned/scheme"
	informers "github.com/kubernetes-csi/external-snapshotter/client/v8/informers/externalversions"
	"github.com/kubernetes-csi/external-snapshotter/v8/pkg/group_snapshotter"
	sidecar "github.com/kubernetes-csi/external-snapshotter/v8/pkg/sidecar-controller"
	"github.com/kubernetes-csi/external-snapshotter/v8/pkg/snapshotter"
	"github.com/kubernetes-csi/external-snapshotter/v8/pkg/utils"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/component-base/metrics/legacyregistry"
	_ "k8s.io/component-base/metrics/prometheus/workqueue" // the work queues' metrics
	"k8s.io/klog/v2"
)

// version is set at build time (-ldflags "-X main.version=...").
var version = "dev"

func main() {
	var (
		csiAddress   = flag.String("csi-address", "/csi/csi.sock", "the plugin's CSI socket")
		kubeconfig   = flag.String("kubeconfig", "", "kubeconfig; empty: in-cluster")
		timeout      = flag.Duration("timeout", time.Minute, "timeout of each CSI call")
		resync       = flag.Duration("resync-period", 15*time.Minute, "resync interval of the informers")
		workers      = flag.Int("worker-threads", 4, "group snapshot contents processed at once")
		prefix       = flag.String("groupsnapshot-name-prefix", "groupsnapshot", "prefix of the names of the group snapshots asked of the plugin")
		uuidLength   = flag.Int("groupsnapshot-name-uuid-length", -1, "length of the UID in those names (-1: whole)")
		retryStart   = flag.Duration("retry-interval-start", time.Second, "first retry interval of a failed group snapshot creation or deletion, doubled at each failure")
		retryMax     = flag.Duration("retry-interval-max", 5*time.Minute, "longest retry interval")
		httpEndpoint = flag.String("http-endpoint", "", "address of /metrics (csi_sidecar_operations_seconds), on a loopback address for the plugin to re-serve; empty: off")
		showVersion  = flag.Bool("version", false, "print the version and exit")
	)
	klog.InitFlags(nil)
	flag.Parse()
	if *showVersion {
		fmt.Println("podvol-group-snapshotter", version)
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, options{
		csiAddress: *csiAddress, kubeconfig: *kubeconfig, node: os.Getenv("NODE_NAME"), timeout: *timeout, resync: *resync,
		workers: *workers, prefix: *prefix, uuidLength: *uuidLength, retryStart: *retryStart, retryMax: *retryMax,
		httpEndpoint: *httpEndpoint,
	}); err != nil {
		klog.ErrorS(err, "podvol-group-snapshotter stopped")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
}

type options struct {
	csiAddress, kubeconfig, node string
	timeout, resync              time.Duration
	workers                      int
	prefix                       string
	uuidLength                   int
	retryStart, retryMax         time.Duration
	httpEndpoint                 string
}

// noContents selects no object: "labelled with the node and not labelled".
// The sidecar controller needs a VolumeSnapshotContent informer; this one
// keeps it away from the single snapshots the node's csi-snapshotter takes.
func noContents(node string) string {
	with, _ := labels.NewRequirement(utils.VolumeSnapshotContentManagedByLabel, selection.Equals, []string{node})
	without, _ := labels.NewRequirement(utils.VolumeSnapshotContentManagedByLabel, selection.DoesNotExist, nil)
	return labels.NewSelector().Add(*with, *without).String()
}

func run(ctx context.Context, o options) error {
	if o.node == "" {
		return errors.New("NODE_NAME is not set: give the container the node's name (fieldRef spec.nodeName), the label value that routes group snapshot contents to this node")
	}
	if o.prefix == "" {
		return errors.New("--groupsnapshot-name-prefix must not be empty")
	}
	klog.InfoS("Starting", "version", version, "node", o.node)
	config, err := restConfig(o.kubeconfig)
	if err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	snap, err := clientset.NewForConfig(config)
	if err != nil {
		return err
	}
	// Events name snapshot kinds.
	if err := snapshotscheme.AddToScheme(scheme.Scheme); err != nil {
		return err
	}

	mm := metrics.NewCSIMetricsManagerForSidecar("")
	conn, err := connection.Connect(ctx, o.csiAddress, mm, connection.OnConnectionLoss(connection.ExitOnConnectionLoss()))
	if err != nil {
		return fmt.Errorf("connect to the plugin at %s: %w", o.csiAddress, err)
	}
	defer func() { _ = conn.Close() }()
	if err := csirpc.ProbeForever(ctx, conn, o.timeout); err != nil {
		return fmt.Errorf("wait for the plugin to be ready: %w", err)
	}
	cctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	driver, err := csirpc.GetDriverName(cctx, conn)
	if err != nil {
		return fmt.Errorf("ask the plugin its name: %w", err)
	}
	caps, err := csirpc.GetGroupControllerCapabilities(cctx, conn)
	if err != nil {
		return fmt.Errorf("ask the plugin its group controller capabilities: %w", err)
	}
	if !caps[csi.GroupControllerServiceCapability_RPC_CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT] {
		return fmt.Errorf("the plugin (%s) does not offer CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT: it is older than group snapshots; upgrade it, or turn groupSnapshots off in the chart's values", driver)
	}
	// Served at once, while the CRDs are waited for too: the plugin
	// re-serves them, and a scraper sees the process up.
	if o.httpEndpoint != "" {
		mm.SetDriverName(driver)
		mm.WithAdditionalRegistry(legacyregistry.DefaultGatherer)
		mux := http.NewServeMux()
		mm.RegisterToServer(mux, "/metrics")
		ln, err := net.Listen("tcp", o.httpEndpoint)
		if err != nil {
			return fmt.Errorf("serve metrics: %w", err)
		}
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer func() { _ = srv.Close() }()
	}

	// Informers of kinds the API does not serve never sync: wait for the
	// CRDs (an admin may install them after podvol), saying why, rather
	// than crash-loop the node's pod.
	if !waitForCRDs(ctx, snap) {
		return nil // stopped while waiting
	}
	all := informers.NewSharedInformerFactory(snap, o.resync)
	mine := informers.NewSharedInformerFactoryWithOptions(snap, o.resync, informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
		lo.LabelSelector = labels.Set{utils.VolumeSnapshotContentManagedByLabel: o.node}.String()
	}))
	none := informers.NewSharedInformerFactoryWithOptions(snap, o.resync, informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
		lo.LabelSelector = noContents(o.node)
	}))
	c := sidecar.NewCSISnapshotSideCarController(
		snap, kube, driver,
		none.Snapshot().V1().VolumeSnapshotContents(),
		all.Snapshot().V1().VolumeSnapshotClasses(),
		snapshotter.NewSnapshotter(conn),
		group_snapshotter.NewGroupSnapshotter(conn),
		o.timeout, o.resync,
		"snapshot", -1, // single snapshots never reach this controller
		o.prefix, o.uuidLength,
		false,
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](o.retryStart, o.retryMax),
		true,
		mine.Groupsnapshot().V1().VolumeGroupSnapshotContents(),
		all.Groupsnapshot().V1().VolumeGroupSnapshotClasses(),
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](o.retryStart, o.retryMax),
	)
	all.Start(ctx.Done())
	mine.Start(ctx.Done())
	none.Start(ctx.Done())
	klog.InfoS("Taking group snapshots", "driver", driver, "node", o.node)
	c.Run(o.workers, ctx.Done(), nil)
	return nil
}

// crdWait is how often the group snapshot CRDs are looked for.
const crdWait = time.Minute

// waitForCRDs returns when the CRDs are served, true, or when ctx ends.
func waitForCRDs(ctx context.Context, snap clientset.Interface) bool {
	for said := false; ; said = true {
		_, err := snap.GroupsnapshotV1().VolumeGroupSnapshotClasses().List(ctx, metav1.ListOptions{Limit: 1})
		if err == nil {
			_, err = snap.GroupsnapshotV1().VolumeGroupSnapshotContents().List(ctx, metav1.ListOptions{Limit: 1})
		}
		if err == nil {
			return true
		}
		if !said {
			klog.InfoS("Waiting for the group snapshot CRDs (external-snapshotter's client/config/crd) and the right to list them; looking again every minute", "err", err)
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(crdWait):
		}
	}
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	return rest.InClusterConfig()
}
