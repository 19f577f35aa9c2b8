# Sourced by tools/*/build.sh: the cache, its lock, the version a tool module
# pins, and building one binary into the cache. Every build script builds from
# Go modules into ${PODVOL_CACHE:-/var/cache/podvol}, keyed by version,
# outside the repository; progress goes to stderr.

# cache_dir prints the cache directory: $PODVOL_CACHE or /var/cache/podvol,
# or, where that cannot be written (make check as a non-root user), a
# per-user one next to the Go build cache (usually ~/.cache/podvol).
cache_dir() {
  local c=${PODVOL_CACHE:-/var/cache/podvol}
  if ! { mkdir -p "$c" && [ -w "$c" ]; } 2>/dev/null; then
    c=$(dirname "$(${GO:-go} env GOCACHE)")/podvol
    mkdir -p "$c"
  fi
  echo "$c"
}

# lock_cache FILE: holds a lock until the script exits. Test packages run in
# parallel and may all ask for a binary at once: one builds, the others wait
# and then find it cached.
lock_cache() {
  exec 9>"$1"
  flock 9
}

# module_version MODULE: the version the current directory's go.mod
# requires (internal/versions checks these against its constants).
module_version() {
  ${GO:-go} list -m -f '{{.Version}}' "$1"
}

# k8s_ldflags VERSION: the version stamp Kubernetes binaries carry.
k8s_ldflags() {
  local v=k8s.io/component-base/version minor
  minor=$(echo "$1" | cut -d. -f2)
  echo "-s -w -X $v.gitVersion=$1 -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean -X $v.buildDate=2026-01-01T00:00:00Z"
}

# build_into BIN STEP HINT COMMAND...: runs COMMAND (a go build or go test
# -c, given "-o $BIN.tmp" by the caller) unless BIN is cached, then moves the
# result into place: an interrupted build never leaves a binary the cache
# would trust. STEP labels the progress lines ("[2/6] kubectl"), HINT says
# how long a cold build takes.
build_into() {
  local bin=$1 step=$2 hint=$3 t0=$SECONDS
  shift 3
  if [ -x "$bin" ]; then
    echo "$step: cached" >&2
    return
  fi
  echo "$step: building ($hint)..." >&2
  "$@"
  mv "$bin.tmp" "$bin"
  echo "$step: built in $((SECONDS - t0))s" >&2
}
