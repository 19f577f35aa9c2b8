// Package metrics serves the plugin's Prometheus metrics and its /healthz.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/klog/v2"
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
	rpc *prometheus.HistogramVec
}

// New registers the collectors. poolStats is read at each scrape.
func New(poolStats func() (PoolStats, error)) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		rpc: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "podvol_csi_operation_duration_seconds",
			Help:    "Duration of CSI calls, by method and gRPC status code.",
			Buckets: []float64{.001, .005, .01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"method", "code"}),
	}
	m.reg.MustRegister(m.rpc, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.reg.MustRegister(&poolCollector{stats: poolStats})
	return m
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

// Serve serves /metrics and /healthz on addr until ctx ends. healthy is the
// same check as the CSI Probe.
func (m *Metrics) Serve(ctx context.Context, addr string, healthy func() error) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("metrics address %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		klog.InfoS("Metrics address is not a loopback address; make sure the network around it is trusted", "address", addr)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := healthy(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	klog.InfoS("Serving metrics", "address", lis.Addr().String())
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(shutdown); err != nil {
			klog.ErrorS(err, "Shutting down the metrics server")
		}
	}()
	if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
