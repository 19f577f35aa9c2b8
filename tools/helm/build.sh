#!/usr/bin/env bash
# build.sh: builds Helm, at the version tools/helm/go.mod pins, from Go
# modules into a cache directory keyed by version (outside the repository),
# and prints the binary's path. A cached binary is not rebuilt. A cold build
# (empty Go build cache) took 60 minutes at nice 19 on 2 cores shared with
# several other builds (load average ~30); alone it is expected to be of
# golangci-lint's order. Progress goes to stderr.
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
# prints the version from the ldflags.
build_into "$BIN" "helm $VERSION" "minutes cold: the Kubernetes client libraries" \
  "$GO" build -trimpath -buildvcs=false \
  -ldflags "-s -w -X $MOD/internal/version.version=$VERSION -X $MOD/internal/version.gitTreeState=clean" \
  -o "$BIN.tmp" "$MOD/cmd/helm"
echo "$BIN"
