// Command podvol-plugin is the podvol CSI driver for one node: flags, then
// recovery of whatever a previous run left, then serving.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/klog/v2"

	"github.com/podvol/podvol/internal/csi"
	"github.com/podvol/podvol/internal/metrics"
	"github.com/podvol/podvol/internal/node"
	"github.com/podvol/podvol/internal/pool"
)

// version is set at build time (-ldflags "-X main.version=...").
var version = "dev"

func main() {
	var (
		endpoint    = flag.String("endpoint", "unix:///run/podvol/csi.sock", "CSI endpoint: unix:///path/to/csi.sock")
		nodeID      = flag.String("node-id", "", "name of this node (required); volumes carry it as topology "+csi.TopologyKey)
		poolDir     = flag.String("pool-dir", "/var/lib/podvol", "directory holding volume images and the metadata store")
		capacity    = flag.String("capacity", "", "pool capacity, e.g. 20Gi; default: the size of the filesystem holding --pool-dir")
		metricsAddr = flag.String("metrics-address", "", "address for /metrics and /healthz, e.g. 127.0.0.1:9808; empty: off")
		maxVolumes  = flag.Int64("max-volumes", 0, "volumes this node can hold, reported to the scheduler; 0: no limit")
		showVersion = flag.Bool("version", false, "print the version and exit")
	)
	klog.InitFlags(nil)
	flag.Parse()
	if *showVersion {
		fmt.Println(csi.DriverName, version)
		return
	}
	if err := run(*endpoint, *nodeID, *poolDir, *capacity, *metricsAddr, *maxVolumes); err != nil {
		klog.ErrorS(err, "podvol-plugin failed")
		klog.Flush()
		os.Exit(1)
	}
}

func run(endpoint, nodeID, poolDir, capacity, metricsAddr string, maxVolumes int64) error {
	if nodeID == "" {
		return fmt.Errorf("--node-id is required: pass the Kubernetes node name (spec.nodeName)")
	}
	var capBytes int64
	if capacity != "" {
		q, err := resource.ParseQuantity(capacity)
		if err != nil || q.Value() <= 0 {
			return fmt.Errorf("--capacity %q: want a positive quantity such as 20Gi", capacity)
		}
		capBytes = q.Value()
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	p, err := pool.Open(pool.Config{Dir: poolDir, Capacity: capBytes})
	if err != nil {
		return err
	}
	defer p.Close()
	n := node.New(p)
	// Node first: its rollbacks release loop devices the pool's recovery
	// then needs to be free.
	if err := n.Recover(ctx); err != nil {
		klog.ErrorS(err, "Recovery of staged volumes was incomplete; serving anyway, kubelet's retries will finish it")
	}
	if err := p.Recover(ctx); err != nil {
		klog.ErrorS(err, "Recovery of the pool was incomplete; serving anyway")
	}
	total, allocated, _ := p.Capacity()
	klog.InfoS("Pool ready", "dir", p.Dir(), "capacityBytes", total, "allocatedBytes", allocated)

	d := csi.New(csi.Config{Version: version, NodeID: nodeID, MaxVolumes: maxVolumes, Pool: p, Node: n})
	var observe csi.Observer
	if metricsAddr != "" {
		m := metrics.New(func() (metrics.PoolStats, error) {
			vols, err := p.Store().Volumes()
			if err != nil {
				return metrics.PoolStats{}, err
			}
			snaps, err := p.Store().Snapshots()
			if err != nil {
				return metrics.PoolStats{}, err
			}
			total, allocated, err := p.Capacity()
			return metrics.PoolStats{CapacityBytes: total, AllocatedBytes: allocated, Volumes: len(vols), Snapshots: len(snaps)}, err
		})
		observe = m.ObserveRPC
		go func() {
			if err := m.Serve(ctx, metricsAddr, p.Check); err != nil {
				klog.ErrorS(err, "Metrics server failed")
				stop()
			}
		}()
	}
	return csi.Serve(ctx, endpoint, d, observe)
}
