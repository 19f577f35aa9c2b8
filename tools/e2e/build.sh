#!/usr/bin/env bash
# build.sh [binary...]: builds Kubernetes' e2e suite with its external
# storage specs alone (e2e-storage.test: `go test -c ./storage`, this module's
# entry point for the unchanged upstream specs, run as upstream's e2e.test
# runs them; see storage/suite_test.go) and agnhost (the test
# image the storage specs run) from Go modules into the Kubernetes cache
# directory keyed by version, and prints that directory. A binary already in
# the cache is not rebuilt. This module requires the versions tools/k8s/go.mod
# does (internal/versions checks), so after tools/k8s/build.sh only the e2e
# packages themselves compile; progress goes to stderr.
set -euo pipefail
cd "$(dirname "$0")"
. ../lib.sh
K8S_VERSION=$(module_version k8s.io/kubernetes)
CACHE=$(cache_dir)
OUT=$CACHE/kubernetes-$K8S_VERSION/bin
mkdir -p "$OUT"
# Its own lock: the dev cluster's builds (tools/k8s, tools/sidecars) need not
# wait for this one.
lock_cache "$CACHE/.build-lock-e2e"
LDFLAGS=$(k8s_ldflags "$K8S_VERSION")

ORDER=(e2e-storage.test agnhost)
[ $# -gt 0 ] && ORDER=("$@")
i=0
for b in "${ORDER[@]}"; do
  i=$((i + 1))
  case $b in
  e2e-storage.test)
    build_into "$OUT/$b" "[$i/${#ORDER[@]}] $b" "~4 min cold after tools/k8s" \
      go test -c -ldflags "$LDFLAGS" -o "$OUT/$b.tmp" ./storage ;;
  agnhost)
    BUILD_FLAGS=(-ldflags "$LDFLAGS")
    build_missing "[$i/${#ORDER[@]}] agnhost" "~1 min cold after e2e-storage.test" "$OUT/$b=k8s.io/kubernetes/test/images/agnhost" ;;
  *) echo "build.sh: unknown binary $b (known: e2e-storage.test agnhost)" >&2; exit 2 ;;
  esac
done
echo "$OUT"
