#!/usr/bin/env bash
# build.sh: builds the CSI sidecars podvol deploys (static binaries, for
# single-binary images) from this directory's Go module into a cache
# directory keyed by version and go.sum, and prints it. Cached binaries are not rebuilt.
# Cold: 41 s on 2 cores after tools/k8s/build.sh, whose libraries they share
# (tools/align.sh; one build: the four share their packages);
# progress goes to stderr.
set -euo pipefail
cd "$(dirname "$0")"
. ../lib.sh
CACHE=$(cache_dir)
# Keyed by the module's dependencies too: the same sidecar version built
# against other libraries is another binary.
OUT=$CACHE/sidecars/$(cat go.mod go.sum | sha256sum | cut -c1-12)/bin
mkdir -p "$OUT"
lock_cache "$CACHE/.build-lock"
# name  module  package-in-module; each version is the one go.mod requires
# (internal/versions checks those).
SIDECARS=(
  "csi-provisioner github.com/kubernetes-csi/external-provisioner/v6 cmd/csi-provisioner"
  "csi-resizer github.com/kubernetes-csi/external-resizer/v2 cmd/csi-resizer"
  "csi-snapshotter github.com/kubernetes-csi/external-snapshotter/v8 cmd/csi-snapshotter"
  "snapshot-controller github.com/kubernetes-csi/external-snapshotter/v8 cmd/snapshot-controller"
)
BUILD_FLAGS=()
ARGS=()
for s in "${SIDECARS[@]}"; do
  read -r name module sub <<<"$s"
  version=$(module_version "$module")
  # Each binary's own version stamp: -ldflags with a package pattern.
  BUILD_FLAGS+=(-ldflags "$module/$sub=-s -w -X main.version=$version")
  ARGS+=("$OUT/$name-$version=$module/$sub")
done
build_missing sidecars "~1 min cold after tools/k8s" "${ARGS[@]}"
echo "$OUT"
