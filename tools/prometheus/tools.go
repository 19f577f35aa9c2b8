//go:build tools

// Package tools pins Prometheus and promtool, built from Go modules by
// build.sh: promtool runs the alert rules' unit tests in make check, and the
// dev cluster starts prometheus on request to scrape podvol.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
