package metrics

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// VolumeCondition is one health condition of one volume (internal/node's
// Health), as the health gauge reports it.
type VolumeCondition struct {
	Volume   string // the CSI volume ID
	Reason   string // CamelCase, e.g. ImageMissing
	Severity string // Degraded, Inaccessible or DataLoss
}

var conditionDesc = prometheus.NewDesc("podvol_volume_health_condition",
	"1 for each health condition a volume in the pool has now (the reasons of NodeGetVolumeHealth; docs/operations.md says what each means). A healthy volume has none.",
	[]string{"volume", "reason", "severity"}, nil)

// healthTimeout bounds one scrape's health checks: a check that hangs (a
// mount table that cannot be read) must not hold the scrape past its own
// timeout, Prometheus' default 10 s.
const healthTimeout = 5 * time.Second

// AddHealth registers the health gauge of the pool named pool;
// conditions is read at each scrape.
// The checks are what NodeGetVolumeHealth runs, on every volume: a few
// system calls each, so a scrape every 30 s costs little next to the CSI
// calls themselves.
func (m *Metrics) AddHealth(pool string, conditions func(context.Context) ([]VolumeCondition, error)) {
	m.pool(pool, &healthCollector{conditions: conditions})
}

// Gatherer is the registry: the tests read the metric names podvol exports
// from it.
func (m *Metrics) Gatherer() prometheus.Gatherer { return m.reg }

type healthCollector struct {
	conditions func(context.Context) ([]VolumeCondition, error)
}

func (c *healthCollector) Describe(ch chan<- *prometheus.Desc) { ch <- conditionDesc }

func (c *healthCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), healthTimeout)
	defer cancel()
	cs, err := c.conditions(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(conditionDesc, err)
		return
	}
	for _, v := range cs {
		ch <- prometheus.MustNewConstMetric(conditionDesc, prometheus.GaugeValue, 1, v.Volume, v.Reason, v.Severity)
	}
}
