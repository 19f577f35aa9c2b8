package metrics

import "github.com/prometheus/client_golang/prometheus"

// FilesystemStats is what the pool's filesystem gauges report: how much of
// it the images occupy and how much it has left. Allocation (PoolStats) is
// what volumes were promised; sparse images take space only as they are
// written, so a pool whose filesystem is shared or smaller than its capacity
// can run out of space before its allocation does.
type FilesystemStats struct {
	UsedBytes, AvailableBytes int64
}

var (
	usedDesc = prometheus.NewDesc("podvol_pool_used_bytes",
		"Bytes the pool's volume and snapshot images occupy on its filesystem (written blocks of the sparse images).", nil, nil)
	fsAvailableDesc = prometheus.NewDesc("podvol_pool_filesystem_available_bytes",
		"Bytes the pool's filesystem has left for the images to grow into.", nil, nil)
)

// AddFilesystem registers the gauges of the filesystem of the pool named
// pool; stats is read at
// each scrape (a stat of every image: cheap beside the scrape interval).
func (m *Metrics) AddFilesystem(pool string, stats func() (FilesystemStats, error)) {
	m.pool(pool, &fsCollector{stats: stats})
}

type fsCollector struct {
	stats func() (FilesystemStats, error)
}

func (c *fsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- usedDesc
	ch <- fsAvailableDesc
}

func (c *fsCollector) Collect(ch chan<- prometheus.Metric) {
	s, err := c.stats()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(usedDesc, err)
		return
	}
	ch <- prometheus.MustNewConstMetric(usedDesc, prometheus.GaugeValue, float64(s.UsedBytes))
	ch <- prometheus.MustNewConstMetric(fsAvailableDesc, prometheus.GaugeValue, float64(s.AvailableBytes))
}
