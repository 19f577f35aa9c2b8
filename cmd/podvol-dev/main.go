// Command podvol-dev runs podvol's dev cluster: a real Kubernetes of several
// nodes on this machine with podvol deployed (see internal/devcluster).
//
//	podvol-dev up      build what is missing, start the cluster, deploy podvol
//	podvol-dev demo    up, then walk through every volume lifecycle
//	podvol-dev down    stop everything and leave the machine as it was
//	podvol-dev running exit 0 if the cluster runs, 1 if not (make test
//	                   takes down only a cluster it brought up)
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/podvol/podvol/internal/devcluster"
)

// version is set at build time (-ldflags "-X main.version=...").
var version = "dev"

func main() {
	dir := flag.String("dir", devcluster.DefaultDir(), "directory holding all of the cluster's state (PODVOL_DEV_DIR)")
	pool := flag.String("pool-size", "20Gi", "size of the XFS image backing the first node's pool (each next node's is smaller)")
	nodes := flag.Int("nodes", devcluster.DefaultNodes, "how many nodes a new cluster has")
	grace := flag.Duration("node-loss-grace", 0, "podvol-controller's --node-loss-grace-period, set over the chart's default (0: the default, 5m)")
	prom := flag.Bool("prometheus", false, "up: also start a Prometheus on the host scraping podvol with the documented scrape configs and alert rules (docs/operations.md)")
	kustomize := flag.Bool("kustomize", false, "deploy podvol with kustomize (deploy/base under an overlay) instead of installing charts/podvol with Helm")
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: podvol-dev [flags] up|demo|down|running\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *showVersion {
		fmt.Println("podvol-dev", version)
		return
	}
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	q, err := resource.ParseQuantity(*pool)
	if err != nil {
		fmt.Fprintf(os.Stderr, "--pool-size %q: %v\n", *pool, err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	c := devcluster.New(devcluster.Config{Dir: *dir, PoolSize: q.Value(), Nodes: *nodes, NodeLossGrace: *grace, Kustomize: *kustomize})
	switch flag.Arg(0) {
	case "up":
		if err = c.Up(ctx); err == nil && *prom {
			var url string
			if url, err = c.StartPrometheus(ctx); err == nil {
				fmt.Printf("Prometheus: %s (its HTTP API: %s/api/v1/targets, %s/api/v1/alerts; no web UI)\n", url, url, url)
			}
		}
	case "demo":
		if err = c.Up(ctx); err == nil {
			err = c.Demo(ctx)
		}
	case "down":
		err = c.Down(context.Background())
	case "running":
		if !c.Running() {
			fmt.Println("the dev cluster is not running")
			os.Exit(1)
		}
		fmt.Println("the dev cluster is running")
	default:
		flag.Usage()
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "\npodvol-dev %s failed: %v\nLogs of every component are in %s/logs.\n", flag.Arg(0), err, *dir)
		os.Exit(1)
	}
}
