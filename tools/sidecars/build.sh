#!/usr/bin/env bash
# build.sh: builds the CSI sidecars podvol deploys (static binaries, for
# single-binary images) from Go modules into a cache directory keyed by
# version, and prints it. Cached binaries are not rebuilt. Cold: ~10 minutes
# on 2 cores; progress goes to stderr.
set -euo pipefail
cd "$(dirname "$0")"
CACHE=${PODVOL_CACHE:-/var/cache/podvol}
OUT=$CACHE/sidecars/bin
mkdir -p "$OUT"
# Test packages run in parallel and may all ask for the binaries at once:
# one builds, the others wait and then find them cached.
exec 9>"$CACHE/.build-lock"
flock 9
# name  module-dir  module  package-in-module; each version is the one the
# module dir's go.mod requires (internal/versions checks those).
SIDECARS=(
  "csi-provisioner provisioner github.com/kubernetes-csi/external-provisioner/v6 cmd/csi-provisioner"
  "csi-resizer resizer github.com/kubernetes-csi/external-resizer/v2 cmd/csi-resizer"
  "csi-snapshotter snapshotter github.com/kubernetes-csi/external-snapshotter/v8 cmd/csi-snapshotter"
  "snapshot-controller snapshotter github.com/kubernetes-csi/external-snapshotter/v8 cmd/snapshot-controller"
)
start=$SECONDS
i=0
for s in "${SIDECARS[@]}"; do
  read -r name dir module sub <<<"$s"
  pkg=$module/$sub
  version=$(cd "$dir" && go list -m -f '{{.Version}}' "$module")
  i=$((i + 1))
  bin=$OUT/$name-$version
  if [ -x "$bin" ]; then
    echo "[$i/${#SIDECARS[@]}] $name $version: cached" >&2
    continue
  fi
  echo "[$i/${#SIDECARS[@]}] building $name $version ($((SECONDS - start))s so far)..." >&2
  t0=$SECONDS
  (cd "$dir" && CGO_ENABLED=0 go build -ldflags "-s -w -X main.version=$version" -o "$bin.tmp" "$pkg")
  mv "$bin.tmp" "$bin"
  echo "[$i/${#SIDECARS[@]}] $name built in $((SECONDS - t0))s" >&2
done
echo "$OUT"
