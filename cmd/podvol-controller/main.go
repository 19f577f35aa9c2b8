// Command podvol-controller is podvol's cluster-wide half: the ephemeral
// volume controller, the ephemeral-clone lifecycle, the release of local
// volumes of lost nodes, the admission policies' parameters, the routing of
// imported snapshots to their node and the placement of restores and clones
// on their source's node (internal/controller/...).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/podvol/podvol/internal/controller/admissionparams"
	"github.com/podvol/podvol/internal/controller/clonelifecycle"
	"github.com/podvol/podvol/internal/controller/ephemeral"
	"github.com/podvol/podvol/internal/controller/grouprouting"
	"github.com/podvol/podvol/internal/controller/migration"
	"github.com/podvol/podvol/internal/controller/nodeloss"
	"github.com/podvol/podvol/internal/controller/snapshotimport"
	"github.com/podvol/podvol/internal/controller/sourceplacement"
	"github.com/podvol/podvol/internal/controller/transfersigner"
	"github.com/podvol/podvol/internal/metricsauth"
	"github.com/podvol/podvol/internal/names"
	"github.com/podvol/podvol/internal/transfercert"
)

// version is set at build time (-ldflags "-X main.version=...").
var version = "dev"

// admissionParams is the ConfigMap that deploy/base's admission policies read
// their parameters from.
const admissionParams = "podvol-admission"

func main() {
	var (
		metricsAddr = flag.String("metrics-address", "127.0.0.1:9809", "address of /metrics, over HTTPS, each request's bearer token reviewed (TokenReview, SubjectAccessReview on the path); 0: off")
		metricsCert = flag.String("metrics-cert-file", "", "serving certificate (PEM) for the metrics, read again when it changes; empty, with --metrics-key-file empty: self-signed at start")
		metricsKey  = flag.String("metrics-key-file", "", "key (PEM) of --metrics-cert-file")
		metricsAud  = flag.String("metrics-audience", names.MetricsAudience, "the audience a scraper's token must have (the TokenReview asks for it): a token for the API server is refused")
		sidecars    = flag.String("metrics-sidecars", "", "sidecars' metrics endpoints (their --http-endpoint) re-served at /metrics/<name> behind the same authentication: comma-separated name=host:port, each on a loopback address")
		healthAddr  = flag.String("health-address", "127.0.0.1:9810", "address of /healthz and /readyz")
		leaderElect = flag.Bool("leader-elect", true, "run one active instance (a Lease in --leader-election-namespace)")
		leaseNS     = flag.String("leader-election-namespace", os.Getenv("POD_NAMESPACE"), "namespace of the leader election Lease")
		controllers = flag.String("controllers", "ephemeral-volume,clone-lifecycle,node-loss,admission-params,snapshot-import,group-snapshot-routing,source-placement,transfer-signer,metrics-signer,migration", "controllers to run")
		driver      = flag.String("driver", names.Driver, "CSI driver whose volumes node-loss releases, whose StorageClasses the admission policies check and whose restores and clones source-placement places")
		grace       = flag.Duration("node-loss-grace-period", nodeloss.DefaultGrace,
			"node-loss: how long the kubelet of a deleted Node must have stopped renewing its Lease (kube-node-lease/<node>) before the node's volumes are released (never less than the Lease's own duration, 40s by default); a renewal seen after the deletion means the node lives, and nothing is released")
		ephemeralWorkers = flag.Int("concurrent-ephemeralvolume-syncs", ephemeral.DefaultWorkers, "ephemeral-volume: how many pods get their claims at once (kube-controller-manager's flag of the same name)")
		transfers        = flag.Bool("transfers", false, "source-placement: the plugins pull restores' data from other nodes (their --transfer-address is set), so a restore whose pod cannot run on its snapshot's node, or that the node has no room for, or annotated podvol.io/placement: scheduler, is provisioned where kube-scheduler puts the pod")
		nodeSA           = flag.String("node-service-account", "podvol-node", "ServiceAccount of the node DaemonSet's pods, in podvol's namespace: transfer-signer signs only its requests")
		apiQPS           = flag.Float64("kube-api-qps", 50, "queries per second to the API server, all controllers together")
		apiBurst         = flag.Int("kube-api-burst", 100, "burst of queries to the API server above --kube-api-qps")
		showVersion      = flag.Bool("version", false, "print the version and exit")
		removeFinalizers = flag.Bool("remove-finalizers", false,
			"uninstall: remove node-loss's finalizer from every Node (releasing nothing) and migration's from every pod (podvol.io/migration), delete migration's PodDisruptionBudgets, and exit; scale deployment podvol-controller to 0 first, or it adds them again")
		preCopyWait = flag.Duration("migration-precopy-wait", migration.DefaultPreCopyWait,
			"migration: how long, from a migration's start, evictions of its pod wait for the first copy (pulled while the pod runs); after that the pod may be evicted, and its deletion still waits until the whole volume is copied")
	)
	klog.InitFlags(nil)
	flag.Parse()
	if *showVersion {
		fmt.Println("podvol-controller", version)
		return
	}
	ctrl.SetLogger(klog.NewKlogr())
	var err error
	switch {
	case strings.TrimSpace(*metricsAud) == "":
		err = fmt.Errorf("--metrics-audience must not be empty: a token for the API server would be accepted")
	case *grace <= 0:
		err = fmt.Errorf("--node-loss-grace-period must be positive, not %s", *grace)
	case *preCopyWait <= 0:
		err = fmt.Errorf("--migration-precopy-wait must be positive, not %s", *preCopyWait)
	case *ephemeralWorkers < 1 || *apiQPS <= 0 || *apiBurst < 1:
		err = fmt.Errorf("--concurrent-ephemeralvolume-syncs, --kube-api-qps and --kube-api-burst must be positive")
	case *removeFinalizers:
		err = removeNodeFinalizers()
	default:
		err = run(runConfig{metricsAddr: *metricsAddr, metricsCert: *metricsCert, metricsKey: *metricsKey, metricsAudience: *metricsAud, sidecars: *sidecars, healthAddr: *healthAddr, leaderElect: *leaderElect, leaseNS: *leaseNS,
			controllers: *controllers, driver: *driver, grace: *grace, ephemeralWorkers: *ephemeralWorkers, qps: float32(*apiQPS), burst: *apiBurst, nodeServiceAccount: *nodeSA, transfers: *transfers,
			preCopyWait: *preCopyWait})
	}
	if err != nil {
		klog.ErrorS(err, "podvol-controller failed")
		os.Exit(1)
	}
}

// removeNodeFinalizers is the --remove-finalizers run mode.
func removeNodeFinalizers() error {
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("kubernetes API access (in-cluster config or --kubeconfig): %w", err)
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	ctx := log.IntoContext(ctrl.SetupSignalHandler(), ctrl.Log.WithName("remove-finalizers"))
	// A migration still running adds its finalizer back at the pod's next
	// event, which our own patch is: 10 s is plenty to see it.
	held, err := migration.RemoveHolds(ctx, c, 10*time.Second)
	if err != nil {
		return fmt.Errorf("remove finalizer %s from the pods and migration's PodDisruptionBudgets (%d let go): %w", names.MigrationFinalizer, held, err)
	}
	klog.InfoS("Removed migration's finalizer from every pod and deleted its PodDisruptionBudgets", "finalizer", names.MigrationFinalizer, "podsAndBudgets", held)
	// Likewise node-loss's, at the Node's next event.
	n, err := nodeloss.RemoveFinalizers(ctx, c, 10*time.Second)
	if err != nil {
		return fmt.Errorf("remove finalizer %s from the Nodes (removed from %d): %w", names.NodeLossFinalizer, n, err)
	}
	klog.InfoS("Removed node-loss's finalizer from every Node", "finalizer", names.NodeLossFinalizer, "nodes", n)
	return nil
}

// runConfig is podvol-controller's flags.
type runConfig struct {
	metricsAddr, healthAddr      string
	metricsCert, metricsKey      string
	metricsAudience              string
	sidecars                     string
	leaderElect                  bool
	leaseNS, controllers, driver string
	nodeServiceAccount           string
	transfers                    bool
	grace, preCopyWait           time.Duration
	ephemeralWorkers             int
	qps                          float32
	burst                        int
}

func run(c runConfig) error {
	sidecars, err := metricsauth.ParseSidecars(c.sidecars)
	if err != nil {
		return fmt.Errorf("--metrics-sidecars: %w", err)
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("kubernetes API access (in-cluster config or --kubeconfig): %w", err)
	}
	// controller-runtime's 20 QPS would queue a burst of pods' claims (a
	// claim, its events and status writes each).
	cfg.QPS, cfg.Burst = c.qps, c.burst
	mgr, err := ctrl.NewManager(cfg, manager.Options{
		// Served by internal/metricsauth below, as the plugin's are.
		Metrics:                 metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:  c.healthAddr,
		LeaderElection:          c.leaderElect,
		LeaderElectionID:        "podvol-controller",
		LeaderElectionNamespace: c.leaseNS,
		// Reads of unstructured objects (the snapshot kinds, read by
		// snapshot-import and source-placement) come from the cache too,
		// not the API server: a tenant's claims cannot multiply them.
		Client: client.Options{Cache: &client.CacheOptions{Unstructured: true}},
	})
	if err != nil {
		return err
	}
	for _, name := range strings.Split(c.controllers, ",") {
		rec := mgr.GetEventRecorder("podvol-controller")
		switch strings.TrimSpace(name) {
		case "ephemeral-volume":
			err = (&ephemeral.Reconciler{Client: mgr.GetClient(), Recorder: rec, Workers: c.ephemeralWorkers}).SetupWithManager(mgr)
		case "clone-lifecycle":
			err = (&clonelifecycle.Reconciler{Client: mgr.GetClient(), Recorder: rec, StashNamespace: c.leaseNS}).SetupWithManager(mgr)
		case "node-loss":
			err = (&nodeloss.Reconciler{Client: mgr.GetClient(), Recorder: rec, Driver: c.driver, Grace: c.grace, Namespace: c.leaseNS}).SetupWithManager(mgr)
		case "admission-params":
			if c.leaseNS == "" {
				return fmt.Errorf("admission-params writes ConfigMap %s in podvol's namespace: set POD_NAMESPACE or --leader-election-namespace", admissionParams)
			}
			err = (&admissionparams.Reconciler{Client: mgr.GetClient(), Driver: c.driver, Namespace: c.leaseNS, Name: admissionParams}).SetupWithManager(mgr)
		case "snapshot-import":
			err = (&snapshotimport.Reconciler{Client: mgr.GetClient(), Recorder: rec, Driver: c.driver}).SetupWithManager(mgr)
		case "group-snapshot-routing":
			err = (&grouprouting.Reconciler{Client: mgr.GetClient(), Recorder: rec, Driver: c.driver}).SetupWithManager(mgr)
		case "source-placement":
			err = (&sourceplacement.Reconciler{Client: mgr.GetClient(), Recorder: rec, Driver: c.driver, Transfers: c.transfers}).SetupWithManager(mgr)
		case "transfer-signer":
			if c.leaseNS == "" {
				return fmt.Errorf("transfer-signer keeps its CA in podvol's namespace: set POD_NAMESPACE or --leader-election-namespace")
			}
			err = (&transfersigner.Reconciler{Client: mgr.GetClient(), Namespace: c.leaseNS,
				NodeUser: serviceaccount.MakeUsername(c.leaseNS, c.nodeServiceAccount)}).SetupWithManager(mgr)
		case "metrics-signer":
			if c.leaseNS == "" {
				return fmt.Errorf("metrics-signer keeps its CA in podvol's namespace: set POD_NAMESPACE or --leader-election-namespace")
			}
			err = (&transfersigner.Reconciler{Client: mgr.GetClient(), Namespace: c.leaseNS, Profile: transfercert.Metrics,
				NodeUser: serviceaccount.MakeUsername(c.leaseNS, c.nodeServiceAccount)}).SetupWithManager(mgr)
		case "migration":
			if !c.transfers {
				// Its copies are pulls between the nodes' plugins.
				klog.InfoS("Not running migration: it needs --transfers (the plugins pull volumes from each other)")
				continue
			}
			err = (&migration.Reconciler{Client: mgr.GetClient(), Recorder: rec, Driver: c.driver, StashNamespace: c.leaseNS}).SetupWithManager(mgr)
			if err == nil {
				err = (&migration.Holds{Client: mgr.GetClient(), Recorder: rec, Driver: c.driver, PreCopyWait: c.preCopyWait}).SetupWithManager(mgr)
			}
		case "":
		default:
			return fmt.Errorf("--controllers: unknown controller %q (known: ephemeral-volume, clone-lifecycle, node-loss, admission-params, snapshot-import, group-snapshot-routing, source-placement, transfer-signer, metrics-signer, migration)", name)
		}
		if err != nil {
			return fmt.Errorf("set up %s: %w", name, err)
		}
	}
	if c.metricsAddr != "0" {
		kc, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return fmt.Errorf("kubernetes client: %w", err)
		}
		mc := metricsauth.Config{Address: c.metricsAddr, CertFile: c.metricsCert, KeyFile: c.metricsKey, Filter: metricsauth.NewFilter(kc, c.metricsAudience),
			Metrics: promhttp.HandlerFor(ctrlmetrics.Registry, promhttp.HandlerOpts{}), Sidecars: sidecars}
		if c.metricsCert == "" && c.metricsKey == "" && c.leaseNS != "" {
			// Its own certificate from podvol's metrics CA, which
			// scrapers verify (names.MetricsControllerServerName).
			serving := &transfersigner.Serving{Signer: &transfersigner.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(),
				Namespace: c.leaseNS, Profile: transfercert.Metrics}}
			if err := mgr.Add(serving); err != nil {
				return err
			}
			mc.Certificate = serving.Certificate
		}
		if err := mgr.Add(metricsRunnable{mc}); err != nil {
			return err
		}
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	klog.InfoS("Starting podvol-controller", "version", version, "controllers", c.controllers, "nodeLossGracePeriod", c.grace)
	if c.grace < nodeloss.DefaultLeaseDuration {
		klog.InfoS("--node-loss-grace-period is shorter than the kubelet's default node Lease duration: node-loss waits for each deleted Node's Lease duration instead, so that a live kubelet's next renewal is seen",
			"nodeLossGracePeriod", c.grace, "defaultLeaseDuration", nodeloss.DefaultLeaseDuration)
	}
	return mgr.Start(ctrl.SetupSignalHandler())
}

// metricsRunnable serves the metrics on every replica, the standbys too:
// each is a target of its own.
type metricsRunnable struct{ c metricsauth.Config }

func (m metricsRunnable) Start(ctx context.Context) error { return metricsauth.Serve(ctx, m.c) }
func (metricsRunnable) NeedLeaderElection() bool          { return false }
