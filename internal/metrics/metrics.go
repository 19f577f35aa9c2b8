// Package metrics holds the plugin's Prometheus collectors and its /healthz
// (internal/metricsauth serves them).
package metrics

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// PoolStats is what the pool gauges report.
type PoolStats struct {
	CapacityBytes, AllocatedBytes int64
	Volumes, InlineVolumes        int
	Snapshots                     int
	// ConfiguredCapacityBytes is the capacity the pool was given (its
	// room at start when none was): above CapacityBytes when the start
	// reduced it to what the pool's filesystem could give.
	ConfiguredCapacityBytes int64
	// DirectIORefused counts loop devices attached buffered since the
	// start because the pool's filesystem refused direct I/O.
	DirectIORefused int64
}

// Metrics holds podvol's collectors.
type Metrics struct {
	reg *prometheus.Registry
	// podvol registers podvol's own collectors: each series gets the
	// label node.
	podvol prometheus.Registerer
	rpc    *prometheus.HistogramVec
}

// New registers the call histogram; AddPool and its kin add each pool's
// collectors. Every podvol_* series carries the label node, and a pool's
// the label pool too: a scrape config need not add them, and a dashboard
// can sum pools and calls by node whatever the targets' labels.
func New(node string) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		rpc: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "podvol_csi_operation_duration_seconds",
			Help:    "Duration of CSI calls, by method and gRPC status code.",
			Buckets: []float64{.001, .005, .01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"method", "code"}),
	}
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.podvol = prometheus.WrapRegistererWith(prometheus.Labels{"node": node}, m.reg)
	m.podvol.MustRegister(m.rpc)
	return m
}

// pool registers a collector of the pool named name: its series carry
// the label pool.
func (m *Metrics) pool(name string, c prometheus.Collector) {
	prometheus.WrapRegistererWith(prometheus.Labels{"pool": name}, m.podvol).MustRegister(c)
}

// AddPool exports the gauges of the pool named name, read from stats at
// each scrape.
func (m *Metrics) AddPool(name string, stats func() (PoolStats, error)) {
	m.pool(name, &poolCollector{stats: stats})
}

// ObserveRPC records one finished CSI call.
func (m *Metrics) ObserveRPC(method, code string, d time.Duration) {
	m.rpc.WithLabelValues(method, code).Observe(d.Seconds())
}

var (
	capacityDesc  = prometheus.NewDesc("podvol_pool_capacity_bytes", "Capacity of the pool.", nil, nil)
	allocatedDesc = prometheus.NewDesc("podvol_pool_allocated_bytes", "Bytes of the pool promised to volumes.", nil, nil)
	freeDesc      = prometheus.NewDesc("podvol_pool_free_bytes", "Bytes of the pool left for new volumes.", nil, nil)
	volumesDesc   = prometheus.NewDesc("podvol_volumes", "Volumes in the pool, by kind: persistent (PVCs, generic ephemeral) or inline (CSI inline ephemeral).", []string{"kind"}, nil)
	snapshotsDesc = prometheus.NewDesc("podvol_snapshots", "Snapshots in the pool.", nil, nil)
	refusedDesc   = prometheus.NewDesc("podvol_loop_direct_io_refused_total", "Loop devices attached through the host's page cache because the pool's filesystem refused direct I/O.", nil, nil)
)

var configuredDesc = prometheus.NewDesc("podvol_pool_configured_capacity_bytes",
	"Capacity the pool was given (--capacity, --pool ...,capacity=; without one, what its filesystem could give at start). Above podvol_pool_capacity_bytes when the plugin's start reduced it to what the filesystem could give (NodeGetStorageHealth: PoolCapacityReduced).", nil, nil)

type poolCollector struct {
	stats func() (PoolStats, error)
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{capacityDesc, configuredDesc, allocatedDesc, freeDesc, volumesDesc, snapshotsDesc, refusedDesc} {
		ch <- d
	}
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	s, err := c.stats()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(capacityDesc, err)
		return
	}
	ch <- prometheus.MustNewConstMetric(capacityDesc, prometheus.GaugeValue, float64(s.CapacityBytes))
	ch <- prometheus.MustNewConstMetric(configuredDesc, prometheus.GaugeValue, float64(s.ConfiguredCapacityBytes))
	ch <- prometheus.MustNewConstMetric(allocatedDesc, prometheus.GaugeValue, float64(s.AllocatedBytes))
	ch <- prometheus.MustNewConstMetric(freeDesc, prometheus.GaugeValue, float64(max(s.CapacityBytes-s.AllocatedBytes, 0)))
	ch <- prometheus.MustNewConstMetric(volumesDesc, prometheus.GaugeValue, float64(s.Volumes), "persistent")
	ch <- prometheus.MustNewConstMetric(volumesDesc, prometheus.GaugeValue, float64(s.InlineVolumes), "inline")
	ch <- prometheus.MustNewConstMetric(snapshotsDesc, prometheus.GaugeValue, float64(s.Snapshots))
	ch <- prometheus.MustNewConstMetric(refusedDesc, prometheus.CounterValue, float64(s.DirectIORefused))
}

// Handler serves the collectors in the Prometheus format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// DefaultHealthEvery is how often Health checks the pools.
const DefaultHealthEvery = 10 * time.Second

// Health is /healthz: the pools' check (the CSI Probe's), run every Every
// by Run and kept, so that a request, which anyone who reaches the port may
// make without a token, reads the last result and never the pools (the
// check reads every volume record of each store: about 1 ms at 400
// volumes, and growing with them). The result is at most Every old; a check
// that has not finished for three periods (a pool's filesystem hung) is
// reported as a failure too, as a request that ran it would have hung.
type Health struct {
	Check func() error
	// Every: DefaultHealthEvery if 0.
	Every time.Duration

	mu      sync.Mutex
	err     error
	checked time.Time // when the last check ended; zero before the first
	since   time.Time // when checks began (Run)
}

func (h *Health) every() time.Duration {
	if h.Every <= 0 {
		return DefaultHealthEvery
	}
	return h.Every
}

// Run checks at once, then every Every until ctx ends.
func (h *Health) Run(ctx context.Context) {
	h.mu.Lock()
	h.since = time.Now()
	h.mu.Unlock()
	t := time.NewTicker(h.every())
	defer t.Stop()
	for {
		h.Refresh()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Refresh runs the check now and keeps its result.
func (h *Health) Refresh() {
	err := h.Check()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.err, h.checked = err, time.Now()
}

func (h *Health) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	h.mu.Lock()
	err, checked, since := h.err, h.checked, h.since
	h.mu.Unlock()
	stale := 3 * h.every()
	switch {
	case checked.IsZero() && (since.IsZero() || time.Since(since) > stale):
		err = fmt.Errorf("the pools have not been checked since the plugin started (%s ago)", time.Since(since).Round(time.Second))
	case checked.IsZero():
		err = fmt.Errorf("the pools' first check has not finished")
	case time.Since(checked) > stale:
		err = fmt.Errorf("the pools' check has not finished for %s (it runs every %s): a pool's filesystem or store does not answer", time.Since(checked).Round(time.Second), h.every())
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintln(w, "ok")
}
