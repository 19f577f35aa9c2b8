#!/usr/bin/env bash
# align.sh: gives podvol's module and the tool modules (tools/k8s, sidecars,
# helm, prometheus, e2e) one version of every module they share, so that a
# package they all compile (client-go, k8s.io/api, grpc, golang.org/x/sys,
# ...) is compiled once and then taken from the Go build cache. The Go build
# cache keys a package by its sources and its dependencies': one different
# version of a leaf (golang.org/x/sys) below client-go means every module
# compiles client-go again. Aligned, a cold CI compiles Helm's and
# Prometheus' Kubernetes libraries with the Kubernetes build's.
#
#   tools/align.sh          raise every shared module to the highest version
#                           any of them requires (go work sync), then tidy
#   tools/align.sh --check  fail, naming the modules, if the versions the
#                           builds would compile differ between them
#
# lint is left out: golangci-lint pins its analysers' versions and shares
# little with the others. The workspace is temporary: the builds run each
# module on its own (go.mod alone is what they compile).
set -euo pipefail
# A go list that fails inside $(scan) must fail the script, not drop that
# module's lines from the comparison.
shopt -s inherit_errexit
cd "$(dirname "$0")"
GO=${GO:-go}
MODS=(k8s sidecars helm prometheus e2e)
export CGO_ENABLED=0

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The workspace (go work sync's) lives outside the repository, with absolute
# paths: a go.work in tools/ would put every build under it in workspace mode
# while it exists (make test runs this beside tools/e2e/build.sh).
{
  echo "go $("$GO" env GOVERSION | sed 's/^go//')"
  echo "use $(cd .. && pwd)"
  for m in "${MODS[@]}"; do echo "use $(pwd)/$m"; done
} >"$work/go.work"

# What each build compiles: module path and version, per package built.
F='{{with .Module}}{{if .Replace}}{{.Path}} {{.Replace.Version}}{{else}}{{.Path}} {{.Version}}{{end}}{{end}}'
built() {
  case $1 in
  ..) (cd .. && GOWORK=off "$GO" list -deps -test -f "$F" ./...) ;;
  k8s) (cd k8s && GOWORK=off "$GO" list -deps -f "$F" ./etcd k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubectl) ;;
  sidecars) (cd sidecars && GOWORK=off "$GO" list -deps -f "$F" \
    github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner \
    github.com/kubernetes-csi/external-resizer/v2/cmd/csi-resizer \
    github.com/kubernetes-csi/external-snapshotter/v8/cmd/csi-snapshotter \
    github.com/kubernetes-csi/external-snapshotter/v8/cmd/snapshot-controller) ;;
  helm) (cd helm && GOWORK=off "$GO" list -deps -f "$F" helm.sh/helm/v4/cmd/helm) ;;
  prometheus) (cd prometheus && GOWORK=off "$GO" list -tags remove_all_sd,enable_kubernetes_sd -deps -f "$F" \
    github.com/prometheus/prometheus/cmd/prometheus github.com/prometheus/prometheus/cmd/promtool ./promqlnames) ;;
  e2e) (cd e2e && GOWORK=off "$GO" list -deps -test -f "$F" ./storage k8s.io/kubernetes/test/images/agnhost) ;;
  esac | grep -v '^github.com/podvol/' | sort -u
}
# scan writes, for every module path the builds compile at more than one
# version, a line: path, then each version with the builds compiling it.
scan() {
  : >"$work/all"
  for m in .. "${MODS[@]}"; do
    built "$m" | sed "s|\$| ${m/../podvol}|" >>"$work/all"
  done
  sort "$work/all" | awk '
    { k = $1 " " $2; if (!(k in by)) { n[$1]++; vs[$1] = vs[$1] " " $2 }; by[k] = by[k] sep[k] $3; sep[k] = "," }
    END { for (p in n) if (n[p] > 1) { line = p ":"; split(substr(vs[p], 2), a, " "); for (i in a) line = line " " a[i] " (" by[p " " a[i]] ")"; print line } }' | sort
}

if [ "${1:-}" != --check ]; then
  GOWORK=$work/go.work "$GO" work sync
  # go work sync does not see through replace directives (tools/k8s and
  # e2e replace the Kubernetes staging modules): raise what is still lower
  # to the highest version, in the modules that compile it lower.
  for round in 1 2 3; do
    bad=$(scan)
    [ -n "$bad" ] || break
    while read -r line; do
      path=${line%%:*}
      # The workspace's choice is the highest by Go's ordering (sort -V
      # puts v1.2.0-rc.1 above v1.2.0).
      max=$(GOWORK=$work/go.work "$GO" list -m -f '{{if .Replace}}{{.Replace.Version}}{{else}}{{.Version}}{{end}}' "$path")
      grep -oE 'v[^ ]+ \([^)]*\)' <<<"${line#*:}" | while read -r v mods; do
        [ "$v" != "$max" ] || continue
        for m in $(tr -d '()' <<<"$mods" | tr ',' ' '); do
          d=${m/podvol/..}
          echo "align.sh: $path $v -> $max in ${m}" >&2
          # A module its go.mod replaces takes the version from the replace.
          if [ -n "$(cd "$d" && GOWORK=off "$GO" list -m -f '{{if .Replace}}r{{end}}' "$path")" ]; then
            (cd "$d" && GOWORK=off "$GO" mod edit -replace="$path=$path@$max" && GOWORK=off "$GO" mod tidy)
          else
            (cd "$d" && GOWORK=off "$GO" get "$path@$max")
          fi
        done
      done
    done <<<"$bad"
    GOWORK=$work/go.work "$GO" work sync
  done
  for m in .. "${MODS[@]}"; do (cd "$m" && GOWORK=off "$GO" mod tidy); done
fi

bad=$(scan)
if [ -n "$bad" ]; then
  echo "align.sh: these modules are compiled at different versions by podvol and the tools, so the build cache" >&2
  echo "compiles them (and everything above them) once per version; run tools/align.sh to align them:" >&2
  echo "$bad" >&2
  exit 1
fi
echo "align.sh: podvol and tools/{$(IFS=,; echo "${MODS[*]}")} compile one version of each of the $(cut -d' ' -f1 "$work/all" | sort -u | wc -l) modules they use"
