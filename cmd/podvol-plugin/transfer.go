package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/podvol/podvol/internal/errkind"
	"github.com/podvol/podvol/internal/mobility"
	"github.com/podvol/podvol/internal/names"
	"github.com/podvol/podvol/internal/pool"
	"github.com/podvol/podvol/internal/store"
	"github.com/podvol/podvol/internal/transfer"
	"github.com/podvol/podvol/internal/transfercert"
)

// startTransfers returns the Importer that pulls restores and clones of
// other nodes' snapshots and volumes (--transfer-address), and serve, which
// serves this node's to other nodes' plugins, their volumes snapshotted by
// the driver's Cut and Move of images (the driver is made with the
// Importer).
func startTransfers(ctx context.Context, c config, kc kubernetes.Interface, pools []*pool.Pool) (im *mobility.Importer, srv *transfer.Server, serve func(mobility.Images, mobility.DeleteFunc), err error) {
	if kc == nil {
		return nil, nil, nil, errors.New("--transfer-address needs API access (in a pod, or --kubeconfig): certificates, claims and node addresses come from it")
	}
	if c.namespace == "" {
		return nil, nil, nil, errors.New("--transfer-address needs podvol's namespace (--namespace or POD_NAMESPACE), where the transfer CA's ConfigMap is")
	}
	_, portStr, err := net.SplitHostPort(c.transferAddr)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("--transfer-address %q: %w", c.transferAddr, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port <= 0 {
		return nil, nil, nil, fmt.Errorf("--transfer-address %q: name a port: other nodes are reached on the same one", c.transferAddr)
	}
	q, err := resource.ParseQuantity(c.transferRate)
	if err != nil || q.Value() < 0 {
		return nil, nil, nil, fmt.Errorf("--transfer-rate-limit %q: want bytes per second such as 200Mi, or 0", c.transferRate)
	}
	if c.transferIdle <= 0 {
		return nil, nil, nil, fmt.Errorf("--transfer-idle-timeout must be positive")
	}
	// Each pull holds its buffers while it streams: the bounds are what
	// the plugin's memory limit is sized for (the chart's resources).
	if c.transferMaxServing < 1 || c.transferMaxServingPerNode < 1 || c.transferMaxPulling < 1 {
		return nil, nil, nil, fmt.Errorf("--transfer-max-serving (%d), --transfer-max-serving-per-node (%d) and --transfer-max-pulling (%d) must be at least 1",
			c.transferMaxServing, c.transferMaxServingPerNode, c.transferMaxPulling)
	}
	var limiter *rate.Limiter
	if q.Value() > 0 {
		limiter = rate.NewLimiter(rate.Limit(q.Value()), max(int(q.Value()), transfer.ChunkSize))
	}
	rc, err := kubeConfig(c.kubeconfig)
	if err != nil {
		return nil, nil, nil, err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, nil, nil, err
	}
	byName := map[string]*pool.Pool{}
	for _, p := range pools {
		byName[p.Name()] = p
	}
	creds := &transfercert.Requester{Client: kc, Node: c.nodeID, Namespace: c.namespace}
	go creds.Run(ctx)
	events := record.NewBroadcaster(record.WithContext(ctx))
	events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: kc.CoreV1().Events("")})
	warnings := &mobility.Warnings{Client: kc, Recorder: events.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "podvol-plugin", Host: c.nodeID})}
	srv = &transfer.Server{
		Authorizer: mobility.ClaimAuthorizer{Client: kc, Dynamic: dyn, Node: c.nodeID, Driver: names.Driver, Snapshot: func(id string) (*store.Snapshot, error) {
			name, _ := pool.PoolOf(id)
			p, ok := byName[name]
			if !ok {
				return nil, fmt.Errorf("snapshot %s is of pool %q, which this node does not serve: %w", id, name, errkind.ErrNotFound)
			}
			return p.ReadySnapshot(id)
		}},
		Limiter:  limiter,
		Mismatch: warnings.Mismatch,
		MaxPulls: c.transferMaxServing, MaxPullsPerCaller: min(c.transferMaxServingPerNode, c.transferMaxServing),
		IdleTimeout: c.transferIdle,
	}
	lis, err := net.Listen("tcp", c.transferAddr)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("listen on %s for transfers: %w", c.transferAddr, err)
	}
	serve = func(images mobility.Images, deleteUnclaimed mobility.DeleteFunc) {
		images.Pool = func(name string) (*pool.Pool, bool) { p, ok := byName[name]; return p, ok }
		srv.Images = images
		go func() {
			if err := transfer.Serve(ctx, lis, creds, srv); err != nil {
				klog.ErrorS(err, "The transfer server failed: other nodes cannot pull from this one")
			}
		}()
		go (&mobility.Sweeper{Client: kc, Pools: pools, Delete: deleteUnclaimed}).Run(ctx)
	}
	im = &mobility.Importer{Credentials: creds, Resolver: mobility.NodeAddresses{Client: kc, Port: port}, Claims: kc, Driver: names.Driver, Warnings: warnings,
		IdleTimeout: c.transferIdle, MaxPulls: c.transferMaxPulling}
	im.Start(ctx, pools)
	klog.InfoS("Transfers on", "address", c.transferAddr, "rateLimitBytesPerSecond", q.Value(),
		"maxServing", c.transferMaxServing, "maxServingPerNode", c.transferMaxServingPerNode, "maxPulling", c.transferMaxPulling, "idleTimeout", c.transferIdle)
	return im, srv, serve, nil
}
