// Command podvol-plugin is the podvol CSI driver for one node: flags, then
// recovery of whatever a previous run left, then serving.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/podvol/podvol/internal/device"
	"github.com/podvol/podvol/internal/directvolume"
	"github.com/podvol/podvol/internal/driver"
	"github.com/podvol/podvol/internal/inline"
	"github.com/podvol/podvol/internal/keylock"
	"github.com/podvol/podvol/internal/metrics"
	"github.com/podvol/podvol/internal/metricsauth"
	"github.com/podvol/podvol/internal/mobility"
	"github.com/podvol/podvol/internal/names"
	"github.com/podvol/podvol/internal/node"
	"github.com/podvol/podvol/internal/pool"
	"github.com/podvol/podvol/internal/registration"
	"github.com/podvol/podvol/internal/transfer"
	"github.com/podvol/podvol/internal/transfercert"
)

// version is set at build time (-ldflags "-X main.version=...").
var version = "dev"

func main() {
	var (
		endpoint    = flag.String("endpoint", "unix:///run/podvol/csi.sock", "CSI endpoint: unix:///path/to/csi.sock")
		nodeID      = flag.String("node-id", "", "name of this node (required); volumes carry it as topology "+names.TopologyKey)
		poolDir     = flag.String("pool-dir", "/var/lib/podvol", "directory of the pool named default (volume images and the metadata store); with --pool, served only when set")
		capacity    = flag.String("capacity", "", "capacity of --pool-dir's pool, e.g. 20Gi; default: what the filesystem holding it can give its volumes (its free space less its reserves, plus what the pool's images hold, less a margin for their block maps and the metadata store); more is refused at start unless --force-capacity, or, once the node's pools hold volumes, reduced to that figure")
		forceCap    = flag.Bool("force-capacity", false, "start with a pool capacity (--capacity, --pool ...,capacity=) above what the pool's filesystem can give its volumes, and keep it (neither refused nor reduced); writes inside volumes may then fail with ENOSPC although the volume is not full")
		lockWait    = flag.Duration("pool-lock-wait", time.Minute, "how long to wait at start for another podvol-plugin holding a pool to let go (a plugin pod being replaced by another DaemonSet's); past it the start fails")
		inlinePools = flag.String("inline-pools", pool.DefaultName, "comma-separated pools inline ephemeral volumes may name (volumeAttributes pool): no StorageClass, quota or scheduler stands between a pod and them")
		forgetPools = flag.String("forget-pool", "", "comma-separated names of pools served before that are gone for good with their volumes: start without them (refused otherwise)")
		metricsAddr = flag.String("metrics-address", "", "address for /metrics and /healthz, e.g. :9808; empty: off. With API access (in-cluster or --kubeconfig) HTTPS, each request's bearer token reviewed (TokenReview, SubjectAccessReview on the path); without, plain HTTP on a loopback address only")
		metricsCert = flag.String("metrics-cert-file", "", "serving certificate (PEM) for the metrics, read again when it changes; empty, with --metrics-key-file empty: self-signed at start")
		metricsKey  = flag.String("metrics-key-file", "", "key (PEM) of --metrics-cert-file")
		metricsAud  = flag.String("metrics-audience", names.MetricsAudience, "the audience a scraper's token must have (the TokenReview asks for it): a token for the API server is refused")
		sidecars    = flag.String("metrics-sidecars", "", "sidecars' metrics endpoints (their --http-endpoint) re-served at /metrics/<name> behind the same authentication: comma-separated name=host:port, each on a loopback address")
		maxVolumes  = flag.Int64("max-volumes", 0, "volumes this node can hold, reported to the scheduler; 0: no limit")
		kubeletDir  = flag.String("kubelet-dir", "/var/lib/kubelet", "kubelet's root directory: an inline volume whose pod directory is gone from it is collected")
		inlineSize  = flag.String("inline-default-size", "1Gi", "size of an inline ephemeral volume whose volumeAttributes name none")
		gcInterval  = flag.Duration("inline-gc-interval", time.Minute, "how often inline volumes whose pod is gone are looked for")
		kataDir     = flag.String("kata-direct-volumes-dir", directvolume.DefaultRoot, "where the Kata runtime reads the mount information of direct-assigned volumes")
		sandboxDirs = flag.String("kata-sandbox-dirs", strings.Join(directvolume.DefaultSandboxDirs, ","), "comma-separated directories holding Kata sandboxes' shim-monitor.sock")
		kubeconfig  = flag.String("kubeconfig", "", "kubeconfig for directAssign=auto (reading pods and RuntimeClasses); default: in-cluster config when run in a pod, else none")
		regDir      = flag.String("registration-dir", "", "kubelet's plugin registration directory (e.g. /var/lib/kubelet/plugins_registry); empty: do not register")
		regPath     = flag.String("kubelet-registration-path", "", "the CSI socket's path as the kubelet sees it (default: the --endpoint path)")
		unknownImgs = flag.String("unknown-images", pool.UnknownRefuse, "images in the pool that the metadata store has no record of (a lost or old podvol.db): "+strings.Join(pool.UnknownImagePolicies, ", ")+"; refuse stops the plugin with an explanation")
		directIO    = flag.Bool("direct-io", true, "loop devices read and write volume images with direct I/O, so that the host's page cache holds no second copy of the data; false: through the page cache, as before (where the pool's filesystem refuses direct I/O, devices fall back to that on their own)")
		discard     = flag.String("discard", node.DiscardFstrim, "how the space of files deleted in a volume goes back to the pool: "+node.DiscardFstrim+" (trim each volume at unstage and every --trim-interval) or "+node.DiscardMount+" (mount with discard: at once, slower deletes)")
		trimEvery   = flag.Duration("trim-interval", time.Hour, "with --discard="+node.DiscardFstrim+", how often staged volumes are trimmed; 0: only at unstage")
		xferAddr    = flag.String("transfer-address", "", "address to serve transfers of volumes' data to other nodes' plugins on, e.g. :9816 (mutual TLS with node certificates from podvol-controller's transfer-signer); its port is where this plugin reaches other nodes' too; empty: off (a restore from another node's snapshot is then NOT_FOUND)")
		xferRate    = flag.String("transfer-rate-limit", "0", "bytes per second this node serves to all transfers together, e.g. 200Mi; 0: no limit")
		xferServe   = flag.Int("transfer-max-serving", 8, "pulls this node serves to other nodes at once; more are refused as busy and retried later (each holds about 8 MiB of memory while it streams)")
		xferServe1  = flag.Int("transfer-max-serving-per-node", 4, "pulls this node serves to any one node at once (at most --transfer-max-serving)")
		xferPulling = flag.Int("transfer-max-pulling", 4, "pulls this node runs at once for its own restores, clones and migrations; more wait their turn (each holds about 8 MiB of memory while it streams)")
		xferIdle    = flag.Duration("transfer-idle-timeout", transfer.DefaultIdleTimeout, "a pull whose source sends nothing for this long (no answer, no next chunk of at most 1 MiB) fails and is retried; it must exceed a chunk's time at the slowest rate a pull gets")
		namespace   = flag.String("namespace", os.Getenv("POD_NAMESPACE"), "podvol's namespace, where the transfer CA's ConfigMap is (with --transfer-address)")
		showVersion = flag.Bool("version", false, "print the version and exit")
	)
	var pools poolFlags
	flag.Var(&pools, "pool", "a pool: "+poolSyntax+", repeatable. A StorageClass chooses one with the parameter pool (absent: the pool named default); NAME is 1 to 16 lower-case letters and digits; a pool with node-label options is served only on nodes with those labels (read from the API at start)")
	klog.InitFlags(nil)
	flag.Parse()
	poolDirSet := false
	flag.Visit(func(f *flag.Flag) { poolDirSet = poolDirSet || f.Name == "pool-dir" })
	if *showVersion {
		fmt.Println(names.Driver, version)
		return
	}
	specs, err := poolSpecs(pools, *poolDir, poolDirSet, *capacity)
	if err != nil {
		klog.ErrorS(err, "podvol-plugin failed")
		klog.Flush()
		os.Exit(1)
	}
	forget, err := parseForget(*forgetPools)
	if err != nil {
		klog.ErrorS(err, "podvol-plugin failed")
		klog.Flush()
		os.Exit(1)
	}
	var inline []string
	for _, n := range strings.Split(*inlinePools, ",") {
		if n = strings.TrimSpace(n); n != "" {
			inline = append(inline, n)
		}
	}
	cfg := config{inlinePools: inline, endpoint: *endpoint, nodeID: *nodeID, pools: specs, forceCapacity: *forceCap, forget: forget, lockWait: *lockWait, metricsAddr: *metricsAddr,
		metricsCert: *metricsCert, metricsKey: *metricsKey, metricsAudience: *metricsAud, sidecars: *sidecars,
		maxVolumes: *maxVolumes, kubeletDir: *kubeletDir, inlineSize: *inlineSize, gcInterval: *gcInterval,
		kataDir: *kataDir, sandboxDirs: strings.Split(*sandboxDirs, ","), kubeconfig: *kubeconfig, regDir: *regDir, regPath: *regPath, unknownImages: *unknownImgs, directIO: *directIO, discard: *discard, trimInterval: *trimEvery,
		transferAddr: *xferAddr, transferRate: *xferRate, transferIdle: *xferIdle,
		transferMaxServing: *xferServe, transferMaxServingPerNode: *xferServe1, transferMaxPulling: *xferPulling, namespace: *namespace}
	if err := run(cfg); err != nil {
		klog.ErrorS(err, "podvol-plugin failed")
		klog.Flush()
		os.Exit(1)
	}
}

type config struct {
	endpoint, nodeID, metricsAddr     string
	pools                             []poolSpec
	forceCapacity                     bool
	forget                            []string
	lockWait                          time.Duration
	inlinePools                       []string
	metricsCert, metricsKey, sidecars string
	metricsAudience                   string
	maxVolumes                        int64
	kubeletDir, inlineSize            string
	gcInterval                        time.Duration
	kataDir, kubeconfig               string
	sandboxDirs                       []string
	regDir, regPath                   string
	unknownImages                     string
	directIO                          bool
	discard                           string
	trimInterval                      time.Duration
	transferAddr, transferRate        string
	transferIdle                      time.Duration
	transferMaxServing                int
	transferMaxServingPerNode         int
	transferMaxPulling                int
	namespace                         string
}

func quantity(flagName, v string) (int64, error) {
	q, err := resource.ParseQuantity(v)
	if err != nil || q.Value() <= 0 {
		return 0, fmt.Errorf("--%s %q: want a positive quantity such as 20Gi", flagName, v)
	}
	return q.Value(), nil
}

func run(c config) error {
	if c.nodeID == "" {
		return fmt.Errorf("--node-id is required: pass the Kubernetes node name (spec.nodeName)")
	}
	inlineBytes, err := quantity("inline-default-size", c.inlineSize)
	if err != nil {
		return err
	}
	if !slices.Contains(pool.UnknownImagePolicies, c.unknownImages) {
		return fmt.Errorf("--unknown-images %q: want one of %s", c.unknownImages, strings.Join(pool.UnknownImagePolicies, ", "))
	}
	if c.gcInterval <= 0 {
		return fmt.Errorf("--inline-gc-interval must be positive")
	}
	if !slices.Contains(node.DiscardModes, c.discard) {
		return fmt.Errorf("--discard %q: want one of %s", c.discard, strings.Join(node.DiscardModes, ", "))
	}
	if c.trimInterval < 0 {
		return fmt.Errorf("--trim-interval must not be negative")
	}
	sidecars, err := metricsauth.ParseSidecars(c.sidecars)
	if err != nil {
		return fmt.Errorf("--metrics-sidecars: %w", err)
	}
	if strings.TrimSpace(c.metricsAudience) == "" {
		return fmt.Errorf("--metrics-audience must not be empty: a token for the API server would be accepted")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	// The loop devices, mounts and disk tools of this machine (unit tests
	// put internal/device/devicetest in its place).
	host := device.Host{}
	var opened []*pool.Pool
	defer func() {
		for _, p := range opened {
			if err := p.Close(); err != nil {
				klog.ErrorS(err, "Closing the pool", "pool", p.Name())
			}
		}
	}()
	kc, err := kubeClient(c.kubeconfig)
	if err != nil {
		return err
	}
	specs := c.pools
	if needsNodeLabels(specs) {
		if kc == nil {
			return errors.New("a pool is served only on nodes with certain labels (node-label), and the plugin has no API access to read this node's: run it in a pod, or with --kubeconfig")
		}
		nd, err := kc.CoreV1().Nodes().Get(ctx, c.nodeID, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("read node %s's labels for the pools it serves: %w", c.nodeID, err)
		}
		specs = onThisNode(specs, nd.Labels)
	}
	if len(specs) == 0 {
		return fmt.Errorf("node %s has none of the pools given (each names node labels it lacks): give it a pool", c.nodeID)
	}
	// Before anything is written: a directory given under another pool's
	// name, a pool left out, a pool's disk not mounted.
	check := make([]pool.Served, len(specs))
	served := make([]string, len(specs))
	for i, s := range specs {
		check[i], served[i] = pool.Served{Name: s.name, Dir: s.dir}, s.name
	}
	if err := pool.CheckServed(check, c.forget); err != nil {
		return err
	}
	if err := checkFilesystems(specs); err != nil {
		return err
	}
	for _, s := range specs {
		p, err := pool.Open(pool.Config{Name: s.name, Dir: s.dir, Capacity: s.capacity, UnknownImages: c.unknownImages, Device: host, LockWait: c.lockWait})
		if err != nil {
			return fmt.Errorf("pool %s: %w", s.name, err)
		}
		opened = append(opened, p)
	}
	if err := checkOpenedCapacities(specs, opened, c.forceCapacity); err != nil {
		return err
	}
	for _, p := range opened {
		if err := p.RecordServedWith(served); err != nil {
			return err
		}
	}
	var decider *directvolume.Decider
	if kc != nil {
		decider = &directvolume.Decider{Client: kc, TTL: 30 * time.Second}
	} else {
		klog.InfoS("No Kubernetes API access: volumes of StorageClasses with directAssign=auto cannot be published")
	}
	// One lock per volume for the CSI calls and the inline collection
	// of every pool (ids are unique across pools).
	locks := &keylock.Locks{}
	var pools []driver.Pool
	for _, p := range opened {
		n := node.New(p, &directvolume.Shim{Root: c.kataDir, SandboxDirs: c.sandboxDirs}, host)
		n.SetDirectIO(c.directIO)
		n.SetDiscard(c.discard)
		klog.InfoS("Data path", "pool", p.Name(), "directIO", c.directIO, "poolBlockSize", device.PoolBlockSize(p.Dir()), "discard", c.discard, "trimInterval", c.trimInterval)
		// Node first: its rollbacks release loop devices the pool's
		// recovery then needs to be free.
		if err := n.Recover(ctx); err != nil {
			klog.ErrorS(err, "Recovery of staged volumes was incomplete; serving anyway, kubelet's retries will finish it", "pool", p.Name())
		}
		if err := p.Recover(ctx); err != nil {
			klog.ErrorS(err, "Recovery of the pool was incomplete; serving anyway", "pool", p.Name())
		}
		total, allocated := p.Capacity()
		room := p.Room()
		klog.InfoS("Pool ready", "pool", p.Name(), "dir", p.Dir(), "capacityBytes", total, "configuredCapacityBytes", p.ConfiguredCapacity(), "allocatedBytes", allocated,
			"roomBytes", room.Bytes(), "filesystemFreeBytes", room.Free, "imagesBytes", room.Images, "keptBytes", room.Kept())
		if allocated > total {
			klog.ErrorS(nil, "The pool's volumes and snapshots were promised more than its capacity (the filesystem has less room than when they were admitted, or the capacity was lowered): they stay, and the pool admits nothing more until enough of them are deleted",
				"pool", p.Name(), "capacityBytes", total, "allocatedBytes", allocated, "room", room.String())
		}
		inl := &inline.Manager{Pool: p, Node: n, KubeletDir: c.kubeletDir, Device: host, Locks: locks}
		// The first collection runs before serving: a volume leaked
		// while the plugin was down is gone before kubelet's first call.
		if err := inl.Collect(ctx); err != nil {
			klog.ErrorS(err, "Collecting inline volumes at start was incomplete", "pool", p.Name())
		}
		go func() {
			time.Sleep(c.gcInterval)
			inl.Run(ctx, c.gcInterval)
		}()
		if c.discard == node.DiscardFstrim && c.trimInterval > 0 {
			go func() {
				t := time.NewTicker(c.trimInterval)
				defer t.Stop()
				for {
					select {
					case <-ctx.Done():
						return
					case <-t.C:
						n.TrimAll(ctx, locks.Lock)
					}
				}
			}()
		}
		pools = append(pools, driver.Pool{Pool: p, Node: n, Inline: inl})
	}
	dc := driver.Config{Version: version, NodeID: c.nodeID, MaxVolumes: c.maxVolumes, Pools: pools, Locks: locks, InlineDefaultSize: inlineBytes, InlinePools: c.inlinePools, Decider: decider}
	var transfers func() metrics.TransferStats
	var serveTransfers func(mobility.Images, mobility.DeleteFunc)
	if c.transferAddr == "" {
		for _, p := range opened {
			if vols, err := p.Importing(); err == nil && len(vols) > 0 {
				klog.ErrorS(nil, "Volumes are being pulled from other nodes, but transfers are off (no --transfer-address): they wait, their space reserved, until transfers are on again", "pool", p.Name(), "volumes", len(vols))
			}
		}
	}
	if c.transferAddr != "" {
		im, srv, serve, err := startTransfers(ctx, c, kc, opened)
		if err != nil {
			return err
		}
		dc.Importer, serveTransfers = im, serve
		transfers = func() metrics.TransferStats {
			pulled, inProgress, done, givenUp := im.Stats()
			return metrics.TransferStats{PulledBytes: pulled, ServedBytes: srv.SentBytes(), InProgress: inProgress, Done: done, GivenUp: givenUp}
		}
	}
	d := driver.New(dc)
	if serveTransfers != nil {
		serveTransfers(mobility.Images{Cut: d.CutForTransfer, Move: d.CutForMove}, d.DeleteUnclaimed)
	}
	var observe driver.Observer
	if c.metricsAddr != "" {
		m := metrics.New(c.nodeID)
		for _, pl := range pools {
			p, n := pl.Pool, pl.Node
			m.AddPool(p.Name(), func() (metrics.PoolStats, error) {
				// The store's running totals: a scrape costs the same
				// whatever the number of volumes.
				u := p.Store().Usage()
				total, allocated := p.Capacity()
				refused, _ := n.DirectIORefused()
				return metrics.PoolStats{
					CapacityBytes: total, ConfiguredCapacityBytes: p.ConfiguredCapacity(), AllocatedBytes: allocated,
					Volumes: u.Volumes - u.InlineVolumes, InlineVolumes: u.InlineVolumes, Snapshots: u.Snapshots,
					DirectIORefused: refused,
				}, nil
			})
			m.AddHealth(p.Name(), volumeConditions(p, n))
			m.AddFilesystem(p.Name(), func() (metrics.FilesystemStats, error) {
				used, avail, err := p.Written()
				return metrics.FilesystemStats{UsedBytes: used, AvailableBytes: avail}, err
			})
		}
		if transfers != nil {
			m.AddTransfers(transfers)
		}
		observe = m.ObserveRPC
		health := &metrics.Health{Check: func() error {
			for _, p := range opened {
				if err := p.Check(); err != nil {
					return fmt.Errorf("pool %s: %w", p.Name(), err)
				}
			}
			return nil
		}}
		go health.Run(ctx)
		mc := metricsauth.Config{Address: c.metricsAddr, CertFile: c.metricsCert, KeyFile: c.metricsKey,
			Metrics: m.Handler(), Sidecars: sidecars, Healthz: health}
		if kc != nil {
			mc.Filter = metricsauth.NewFilter(kc, c.metricsAudience)
			if c.metricsCert == "" && c.metricsKey == "" {
				// A certificate of podvol's metrics CA, which scrapers
				// verify (names.MetricsNodeServerName).
				req := &transfercert.Requester{Client: kc, Node: c.nodeID, Namespace: c.namespace, Profile: transfercert.Metrics}
				go req.Run(ctx)
				mc.Certificate = req.Certificate
			}
		}
		go func() {
			if err := metricsauth.Serve(ctx, mc); err != nil {
				klog.ErrorS(err, "Metrics server failed")
				stop()
			}
		}()
	}
	if c.regDir != "" {
		path := c.regPath
		if path == "" {
			path = strings.TrimPrefix(c.endpoint, "unix://")
		}
		go func() {
			if err := registration.Serve(ctx, c.regDir, names.Driver, path); err != nil {
				klog.ErrorS(err, "Kubelet plugin registration failed: pods on this node cannot use podvol volumes")
				stop()
			}
		}()
	}
	return driver.Serve(ctx, c.endpoint, d, observe)
}

// kubeClient is a client from --kubeconfig or the in-cluster config; nil
// without either (the plugin run by hand or by tests): directAssign=auto is
// then refused at publish time, and metrics are served only on loopback,
// unauthenticated.
func kubeClient(kubeconfig string) (kubernetes.Interface, error) {
	cfg, err := kubeConfig(kubeconfig)
	if cfg == nil || err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

// kubeConfig is kubeClient's configuration; nil without API access.
func kubeConfig(kubeconfig string) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	switch {
	case kubeconfig != "":
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	case os.Getenv("KUBERNETES_SERVICE_HOST") != "":
		cfg, err = rest.InClusterConfig()
	default:
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes API access: %w", err)
	}
	return cfg, nil
}
