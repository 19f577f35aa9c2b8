#!/usr/bin/env bash
# build.sh [binary...]: builds the Kubernetes binaries podvol's dev cluster and
# envtest suites run, from Go modules, into a cache directory keyed by version
# (outside the repository), and prints that directory. A binary already in
# the cache is not rebuilt. A cold build of all of them took 11 minutes on 2
# cores (modules downloaded already); progress (packages compiled, time so far) goes to stderr.
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
PREBIND_WATCH=
for b in "${WANT[@]}"; do
  if [ "$b" = kube-scheduler-prebind-watch ]; then
    PREBIND_WATCH=1
    continue
  fi
  [ -n "${PKG[$b]:-}" ] || { echo "build.sh: unknown binary $b (known: ${!PKG[*]} kube-scheduler-prebind-watch)" >&2; exit 2; }
  ARGS+=("$OUT/$b=${PKG[$b]}")
done
BUILD_FLAGS=(-ldflags "$LDFLAGS")
build_missing kubernetes "~11 min cold on 2 cores" "${ARGS[@]}"

# kube-scheduler-prebind-watch: kube-scheduler with this directory's patch
# applied to its volume binding (see the patch's header), for
# `make bench-startup`. go build -overlay may not replace a file of the module
# cache, so the Kubernetes module is a tree of links to the module cache's
# files but the patched one, made beside the binaries and put in with
# -modfile's replace.
# Rebuilt when the patch changes; the Kubernetes packages it uses compile
# anew (their directory differs).
if [ -n "$PREBIND_WATCH" ]; then
  bin=$OUT/kube-scheduler-prebind-watch
  stamp=$OUT/.kube-scheduler-prebind-watch.patch
  cmp -s kube-scheduler-prebind-watch.patch "$stamp" || rm -f "$bin"
  if [ ! -x "$bin" ]; then
    go mod download k8s.io/kubernetes
    mod=$(go list -m -f '{{.Dir}}' k8s.io/kubernetes)
    tree=$OUT/.kube-scheduler-prebind-watch
    # A copy cut short keeps the module cache's read-only directories.
    [ ! -e "$tree" ] || chmod -R u+w "$tree"
    rm -rf "$tree"
    mkdir -p "$tree"
    cp -as "$mod" "$tree/kubernetes"
    chmod -R u+w "$tree/kubernetes"
    f=pkg/scheduler/framework/plugins/volumebinding/binder.go
    rm "$tree/kubernetes/$f"
    patch -s -o "$tree/kubernetes/$f" "$mod/$f" <kube-scheduler-prebind-watch.patch
    cp go.mod "$tree/go.mod"
    cp go.sum "$tree/go.sum"
    echo "replace k8s.io/kubernetes => $tree/kubernetes" >>"$tree/go.mod"
    BUILD_FLAGS=(-ldflags "$LDFLAGS" -modfile "$tree/go.mod")
    build_missing kube-scheduler-prebind-watch "~5 min after kube-scheduler" "$bin=${PKG[kube-scheduler]}"
    rm -rf "$tree"
    cp kube-scheduler-prebind-watch.patch "$stamp"
  fi
fi
echo "$OUT"
