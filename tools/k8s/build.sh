#!/usr/bin/env bash
# build.sh [binary...]: builds the Kubernetes binaries podvol's dev cluster and
# envtest suites run, from Go modules, into a cache directory keyed by version
# (outside the repository), and prints that directory. A binary already in
# the cache is not rebuilt. A cold build of all of them takes ~12 minutes on 2
# cores; progress is printed to stderr.
set -euo pipefail
cd "$(dirname "$0")"
# The version is the one tools/k8s/go.mod requires (internal/versions checks it).
K8S_VERSION=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
K8S_MINOR=$(echo "$K8S_VERSION" | cut -d. -f2)
CACHE=${PODVOL_CACHE:-/var/cache/podvol}
OUT=$CACHE/kubernetes-$K8S_VERSION/bin
mkdir -p "$OUT"
# Test packages run in parallel and may all ask for the binaries at once:
# one builds, the others wait and then find them cached.
exec 9>"$CACHE/.build-lock"
flock 9

V=k8s.io/component-base/version
LDFLAGS="-s -w -X $V.gitVersion=$K8S_VERSION -X $V.gitMajor=1 -X $V.gitMinor=$K8S_MINOR -X $V.gitTreeState=clean -X $V.buildDate=2026-01-01T00:00:00Z"

declare -A PKG=(
  [etcd]=./etcd
  [kube-apiserver]=k8s.io/kubernetes/cmd/kube-apiserver
  [kube-controller-manager]=k8s.io/kubernetes/cmd/kube-controller-manager
  [kube-scheduler]=k8s.io/kubernetes/cmd/kube-scheduler
  [kubelet]=k8s.io/kubernetes/cmd/kubelet
  [kubectl]=k8s.io/kubernetes/cmd/kubectl
)
ORDER=(etcd kube-apiserver kubectl kube-controller-manager kube-scheduler kubelet)
[ $# -gt 0 ] && ORDER=("$@")

start=$SECONDS
i=0
for b in "${ORDER[@]}"; do
  i=$((i + 1))
  [ -n "${PKG[$b]:-}" ] || { echo "build.sh: unknown binary $b (known: ${!PKG[*]})" >&2; exit 2; }
  if [ -x "$OUT/$b" ]; then
    echo "[$i/${#ORDER[@]}] $b: cached" >&2
    continue
  fi
  echo "[$i/${#ORDER[@]}] building $b ($((SECONDS - start))s so far; a cold kube-apiserver takes ~9 min)..." >&2
  t0=$SECONDS
  # Build to a temporary name: an interrupted build must not leave a
  # binary the cache would trust.
  go build -ldflags "$LDFLAGS" -o "$OUT/.$b.tmp" "${PKG[$b]}"
  mv "$OUT/.$b.tmp" "$OUT/$b"
  echo "[$i/${#ORDER[@]}] $b built in $((SECONDS - t0))s" >&2
done
echo "$OUT"
