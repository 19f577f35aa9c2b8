#!/usr/bin/env bash
# build.sh: builds golangci-lint, at the version tools/lint/go.mod pins, from
# Go modules into a cache directory keyed by version (outside the repository),
# and prints the binary's path. A cached binary is not rebuilt; a cold build
# takes 5-8 minutes on 2 cores. Progress goes to stderr.
#
# The cache is ${PODVOL_CACHE:-/var/cache/podvol}; where that cannot be
# written (make check as a non-root user), a per-user one next to the Go build
# cache ($(go env GOCACHE)/../podvol, usually ~/.cache/podvol).
set -euo pipefail
cd "$(dirname "$0")"
. ../lib.sh
GO=${GO:-go}
MOD=github.com/golangci/golangci-lint/v2
VERSION=$(module_version "$MOD")
OUT=$(cache_dir)/golangci-lint-$VERSION
BIN=$OUT/golangci-lint
if [ -x "$BIN" ]; then
  echo "$BIN"
  exit 0
fi
mkdir -p "$OUT"
lock_cache "$OUT/.build-lock"
# -buildvcs=false: the repository may belong to another user, and this
# binary's version comes from the ldflags.
build_into "$BIN" "golangci-lint $VERSION" "~5-8 min cold on 2 cores" \
  "$GO" build -trimpath -buildvcs=false \
  -ldflags "-s -w -X main.version=${VERSION#v} -X main.commit=gomod -X main.date=$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
  -o "$BIN.tmp" "$MOD/cmd/golangci-lint"
echo "$BIN"
