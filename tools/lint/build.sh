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
GO=${GO:-go}
MOD=github.com/golangci/golangci-lint/v2
VERSION=$(awk -v m="$MOD" '$1 == "require" && $2 == m { print $3 } $1 == m { print $2 }' go.mod)
[ -n "$VERSION" ] || { echo "build.sh: no $MOD in tools/lint/go.mod" >&2; exit 2; }

CACHE=${PODVOL_CACHE:-/var/cache/podvol}
if ! { mkdir -p "$CACHE" && [ -w "$CACHE" ]; } 2>/dev/null; then
  CACHE=$(dirname "$("$GO" env GOCACHE)")/podvol
  mkdir -p "$CACHE"
fi
OUT=$CACHE/golangci-lint-$VERSION
BIN=$OUT/golangci-lint
if [ -x "$BIN" ]; then
  echo "$BIN"
  exit 0
fi
mkdir -p "$OUT"
# Parallel callers: one builds, the others wait and then find it cached.
exec 9>"$OUT/.build-lock"
flock 9
if [ ! -x "$BIN" ]; then
  echo "building golangci-lint $VERSION into $OUT (cold: ~5-8 min on 2 cores)..." >&2
  t0=$SECONDS
  # Build to a temporary name: an interrupted build must not leave a binary
  # the cache would trust. -buildvcs=false: the repository may belong to
  # another user, and this binary's version comes from the ldflags.
  "$GO" build -trimpath -buildvcs=false \
    -ldflags "-s -w -X main.version=${VERSION#v} -X main.commit=gomod -X main.date=$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
    -o "$OUT/.golangci-lint.tmp" "$MOD/cmd/golangci-lint"
  mv "$OUT/.golangci-lint.tmp" "$BIN"
  echo "golangci-lint $VERSION built in $((SECONDS - t0))s" >&2
fi
echo "$BIN"
