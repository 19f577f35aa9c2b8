#!/usr/bin/env bash
# build.sh: builds Helm, at the version tools/helm/go.mod pins, from Go
# modules into a cache directory keyed by version (outside the repository),
# and prints the binary's path. A cached binary is not rebuilt. After
# tools/k8s/build.sh, whose Kubernetes libraries it shares (tools/align.sh),
# a cold build took 27 s on 2 cores. Progress goes to stderr.
#
# Helm renders charts/podvol into deploy/base (make generate), lints it (make
# check) and installs it on the dev cluster. The cache is as tools/lib.sh
# says.
set -euo pipefail
cd "$(dirname "$0")"
. ../lib.sh
GO=${GO:-go}
MOD=helm.sh/helm/v4
VERSION=$(module_version "$MOD")
OUT=$(cache_dir)/helm-$VERSION
BIN=$OUT/helm
if [ -x "$BIN" ]; then
  echo "$BIN"
  exit 0
fi
mkdir -p "$OUT"
lock_cache "$OUT/.build-lock"
# -buildvcs=false: the repository may belong to another user; helm version
# prints the version from the ldflags. No -trimpath: the Kubernetes client
# libraries compiled for tools/k8s (the same versions, tools/align.sh) are
# reused from the build cache only when compiled with the same flags.
build_into "$BIN" "helm $VERSION" "~2 min cold after tools/k8s" \
  "$GO" build -buildvcs=false \
  -ldflags "-s -w -X $MOD/internal/version.version=$VERSION -X $MOD/internal/version.gitTreeState=clean" \
  -o "$BIN.tmp" "$MOD/cmd/helm"
echo "$BIN"
