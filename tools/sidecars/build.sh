#!/usr/bin/env bash
# build.sh: builds the CSI sidecars podvol deploys (static binaries, for
# single-binary images) from Go modules into a cache directory keyed by
# version, and prints it. Cached binaries are not rebuilt. Cold: ~10 minutes
# on 2 cores; progress goes to stderr.
set -euo pipefail
cd "$(dirname "$0")"
. ../lib.sh
CACHE=$(cache_dir)
OUT=$CACHE/sidecars/bin
mkdir -p "$OUT"
lock_cache "$CACHE/.build-lock"
# name  module-dir  module  package-in-module; each version is the one the
# module dir's go.mod requires (internal/versions checks those).
SIDECARS=(
  "csi-provisioner provisioner github.com/kubernetes-csi/external-provisioner/v6 cmd/csi-provisioner"
  "csi-resizer resizer github.com/kubernetes-csi/external-resizer/v2 cmd/csi-resizer"
  "csi-snapshotter snapshotter github.com/kubernetes-csi/external-snapshotter/v8 cmd/csi-snapshotter"
  "snapshot-controller snapshotter github.com/kubernetes-csi/external-snapshotter/v8 cmd/snapshot-controller"
)
i=0
for s in "${SIDECARS[@]}"; do
  read -r name dir module sub <<<"$s"
  i=$((i + 1))
  version=$(cd "$dir" && module_version "$module")
  bin=$OUT/$name-$version
  # Static, for single-binary images.
  build_into "$bin" "[$i/${#SIDECARS[@]}] $name $version" "a few minutes cold" \
    sh -c 'cd "$1" && CGO_ENABLED=0 go build -ldflags "-s -w -X main.version=$2" -o "$3.tmp" "$4"' _ "$dir" "$version" "$bin" "$module/$sub"
done
echo "$OUT"
