#!/usr/bin/env bash
# build.sh: builds prometheus and promtool, at the version tools/prometheus/go.mod
# pins, from Go modules into a cache directory keyed by the module's
# dependencies, and prints that directory (it holds prometheus, promtool and
# promqlnames). Cached binaries are not rebuilt. promtool runs the alert
# rules' unit tests and promqlnames (this module's own, on Prometheus' PromQL
# parser) reads the metric names of the rules and the dashboard (make check);
# prometheus scrapes the dev cluster on request (podvol-dev up --prometheus,
# the e2e test). Progress goes to stderr.
#
# The tag remove_all_sd leaves out Prometheus' service-discovery plugins
# (cloud APIs podvol never needs: EC2, Azure, GCE, Consul...) but the one
# enable_kubernetes_sd keeps, which the scrape configs use (static and file
# discovery are built in): 243 of the 1527 packages the two binaries need.
# The web UI's assets are not built in either (no builtinassets tag): the
# HTTP API is what the tests use.
# Measured 2026-12-02 on 2 cores with an empty build cache, after
# tools/k8s/build.sh (whose libraries it shares: tools/align.sh): 112 s.
set -euo pipefail
cd "$(dirname "$0")"
. ../lib.sh
MOD=github.com/prometheus/prometheus
VERSION=$(module_version "$MOD")
TAGS=remove_all_sd,enable_kubernetes_sd
# Keyed by the dependencies, the tags and promqlnames' source too: the same
# version built against other libraries, or with other plugins, is another
# binary.
OUT=$(cache_dir)/prometheus-$VERSION/$(cat go.mod go.sum promqlnames/*.go <(echo "$TAGS") | sha256sum | cut -c1-12)/bin
mkdir -p "$OUT"
lock_cache "$OUT/.build-lock"
v=github.com/prometheus/common/version
# No -trimpath: what tools/k8s compiled (the same versions, tools/align.sh)
# is reused from the build cache only when compiled with the same flags.
BUILD_FLAGS=(-tags "$TAGS" -ldflags "-s -w -X $v.Version=${VERSION#v} -X $v.Revision=gomod -X $v.Branch=gomod -X $v.BuildUser=podvol")
build_missing prometheus "~2 min cold after tools/k8s" \
  "$OUT/prometheus=$MOD/cmd/prometheus" "$OUT/promtool=$MOD/cmd/promtool" \
  "$OUT/promqlnames=github.com/podvol/podvol/tools/prometheus/promqlnames"
echo "$OUT"
