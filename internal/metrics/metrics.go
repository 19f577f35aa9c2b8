// Package metrics holds the plugin's Prometheus collectors and its /healthz
// (internal/metricsauth serves them).
package metrics

import (
	"fmt"
	"net/http"
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

type poolCollector struct {
	stats func() (PoolStats, error)
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{capacityDesc, allocatedDesc, freeDesc, volumesDesc, snapshotsDesc, refusedDesc} {
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

// Healthz is /healthz: healthy is the same check as the CSI Probe.
func Healthz(healthy func() error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := healthy(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
}
