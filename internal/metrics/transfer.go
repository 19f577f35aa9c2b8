package metrics

import "github.com/prometheus/client_golang/prometheus"

// TransferStats is what the transfer series report (internal/transfer,
// internal/mobility): counters since the plugin started.
type TransferStats struct {
	// PulledBytes of snapshots' data received and checked by this node's
	// pulls; ServedBytes sent by this node to others' (zeros not counted).
	PulledBytes, ServedBytes int64
	// InProgress pulls; Done pulls that made a volume ready, GivenUp pulls
	// refused for good (their volume deleted).
	InProgress    int
	Done, GivenUp int64
}

var (
	pulledDesc   = prometheus.NewDesc("podvol_transfer_pulled_bytes_total", "Bytes of other nodes' snapshots pulled and checked by this node (restores on this node).", nil, nil)
	servedDesc   = prometheus.NewDesc("podvol_transfer_served_bytes_total", "Bytes of this node's snapshots sent to other nodes' pulls.", nil, nil)
	progressDesc = prometheus.NewDesc("podvol_transfer_pulls_in_progress", "Pulls of other nodes' snapshots under way on this node.", nil, nil)
	pullsDesc    = prometheus.NewDesc("podvol_transfer_pulls_total", "Pulls finished, by result: done (the volume is ready) or given_up (refused for good; the volume deleted).", []string{"result"}, nil)
)

type transferCollector struct{ stats func() TransferStats }

// AddTransfers exports the transfer series, read from stats at each scrape.
func (m *Metrics) AddTransfers(stats func() TransferStats) {
	m.podvol.MustRegister(&transferCollector{stats: stats})
}

func (c *transferCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{pulledDesc, servedDesc, progressDesc, pullsDesc} {
		ch <- d
	}
}

func (c *transferCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.stats()
	ch <- prometheus.MustNewConstMetric(pulledDesc, prometheus.CounterValue, float64(s.PulledBytes))
	ch <- prometheus.MustNewConstMetric(servedDesc, prometheus.CounterValue, float64(s.ServedBytes))
	ch <- prometheus.MustNewConstMetric(progressDesc, prometheus.GaugeValue, float64(s.InProgress))
	ch <- prometheus.MustNewConstMetric(pullsDesc, prometheus.CounterValue, float64(s.Done), "done")
	ch <- prometheus.MustNewConstMetric(pullsDesc, prometheus.CounterValue, float64(s.GivenUp), "given_up")
}
