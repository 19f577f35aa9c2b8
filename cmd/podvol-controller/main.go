// Command podvol-controller is podvol's cluster-wide half: the ephemeral
// volume controller, the ephemeral-clone lifecycle and the release of local
// volumes of lost nodes (internal/controller/...).
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/podvol/podvol/internal/controller/clonelifecycle"
	"github.com/podvol/podvol/internal/controller/ephemeral"
	"github.com/podvol/podvol/internal/controller/nodeloss"
)

var version = "dev"

func main() {
	var (
		metricsAddr = flag.String("metrics-address", "127.0.0.1:9809", "address of /metrics")
		healthAddr  = flag.String("health-address", "127.0.0.1:9810", "address of /healthz and /readyz")
		leaderElect = flag.Bool("leader-elect", true, "run one active instance (a Lease in --leader-election-namespace)")
		leaseNS     = flag.String("leader-election-namespace", os.Getenv("POD_NAMESPACE"), "namespace of the leader election Lease")
		controllers = flag.String("controllers", "ephemeral-volume,clone-lifecycle,node-loss", "controllers to run")
		driver      = flag.String("driver", "podvol.io", "CSI driver whose volumes node-loss releases")
	)
	klog.InitFlags(nil)
	flag.Parse()
	ctrl.SetLogger(klog.NewKlogr())
	if err := run(*metricsAddr, *healthAddr, *leaderElect, *leaseNS, *controllers, *driver); err != nil {
		klog.ErrorS(err, "podvol-controller failed")
		os.Exit(1)
	}
}

func run(metricsAddr, healthAddr string, leaderElect bool, leaseNS, controllers, driver string) error {
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("kubernetes API access (in-cluster config or --kubeconfig): %w", err)
	}
	mgr, err := ctrl.NewManager(cfg, manager.Options{
		Metrics:                 metricsserver.Options{BindAddress: metricsAddr},
		HealthProbeBindAddress:  healthAddr,
		LeaderElection:          leaderElect,
		LeaderElectionID:        "podvol-controller",
		LeaderElectionNamespace: leaseNS,
	})
	if err != nil {
		return err
	}
	for _, name := range strings.Split(controllers, ",") {
		rec := mgr.GetEventRecorder("podvol-controller")
		switch strings.TrimSpace(name) {
		case "ephemeral-volume":
			err = (&ephemeral.Reconciler{Client: mgr.GetClient(), Recorder: rec}).SetupWithManager(mgr)
		case "clone-lifecycle":
			err = (&clonelifecycle.Reconciler{Client: mgr.GetClient(), Recorder: rec}).SetupWithManager(mgr)
		case "node-loss":
			err = (&nodeloss.Reconciler{Client: mgr.GetClient(), Recorder: rec, Driver: driver}).SetupWithManager(mgr)
		case "":
		default:
			return fmt.Errorf("--controllers: unknown controller %q (known: ephemeral-volume, clone-lifecycle, node-loss)", name)
		}
		if err != nil {
			return fmt.Errorf("set up %s: %w", name, err)
		}
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	klog.InfoS("Starting podvol-controller", "version", version, "controllers", controllers)
	return mgr.Start(ctrl.SetupSignalHandler())
}
