#!/usr/bin/env bash
# build.sh [binary...]: builds the Kubernetes binaries podvol's dev cluster and
# envtest suites run, from Go modules, into a cache directory keyed by version
# (outside the repository), and prints that directory. A binary already in
# the cache is not rebuilt. A cold build of all of them takes ~12 minutes on 2
# cores; progress (packages compiled, time so far) goes to stderr.
set -euo pipefail
cd "$(dirname "$0")"
. ../lib.sh
K8S_VERSION=$(module_version k8s.io/kubernetes)
CACHE=$(cache_dir)
OUT=$CACHE/kubernetes-$K8S_VERSION/bin
mkdir -p "$OUT"
lock_cache "$CACHE/.build-lock"
LDFLAGS=$(k8s_ldflags "$K8S_VERSION")

declare -A PKG=(
  [etcd]=./etcd
  [kube-apiserver]=k8s.io/kubernetes/cmd/kube-apiserver
  [kube-controller-manager]=k8s.io/kubernetes/cmd/kube-controller-manager
  [kube-scheduler]=k8s.io/kubernetes/cmd/kube-scheduler
  [kubelet]=k8s.io/kubernetes/cmd/kubelet
  [kubectl]=k8s.io/kubernetes/cmd/kubectl
)
WANT=(etcd kube-apiserver kubectl kube-controller-manager kube-scheduler kubelet)
[ $# -gt 0 ] && WANT=("$@")
ARGS=()
for b in "${WANT[@]}"; do
  [ -n "${PKG[$b]:-}" ] || { echo "build.sh: unknown binary $b (known: ${!PKG[*]})" >&2; exit 2; }
  ARGS+=("$OUT/$b=${PKG[$b]}")
done
BUILD_FLAGS=(-ldflags "$LDFLAGS")
build_missing kubernetes "~12 min cold on 2 cores" "${ARGS[@]}"
echo "$OUT"
