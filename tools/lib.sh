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
  if ! flock -n 9; then
    echo "waiting for another build that holds $1 (.ci/run starts some in the background)..." >&2
    flock 9
  fi
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

# Every tool binary is static. Packages compiled with and without cgo differ,
# so one setting lets the Kubernetes binaries, the e2e suite and agnhost share
# what they compile (a cold agnhost took 7 minutes beside a cgo kubelet), and
# a static binary runs alone in a single-binary image.
export CGO_ENABLED=0

# build_into BIN STEP HINT COMMAND...: runs COMMAND (a go test -c, given
# "-o $BIN.tmp" by the caller) unless BIN is cached, then moves the result
# into place: an interrupted build never leaves a binary the cache would
# trust. STEP labels the progress lines ("[1/2] e2e.test"), HINT says how long
# a cold build takes.
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

# build_missing STEP HINT BIN=PACKAGE...: builds the binaries not yet cached, all
# in one `go build` of the current module, with the flags in the array
# BUILD_FLAGS (-ldflags PATTERN=... sets one binary's). One build compiles the
# packages the binaries share once and keeps both cores busy while a binary
# links. Each binary lands in place only when the whole build succeeded. STEP
# labels the progress lines, HINT says how long a cold build takes.
build_missing() {
  local step=$1 hint=$2 t0=$SECONDS tmp pair i
  shift 2
  local -a bins=() pkgs=()
  for pair in "$@"; do
    if [ -x "${pair%%=*}" ]; then
      echo "$(basename "${pair%%=*}"): cached" >&2
    else
      bins+=("${pair%%=*}")
      pkgs+=("${pair#*=}")
    fi
  done
  [ ${#bins[@]} -gt 0 ] || return 0
  local names
  names=$(for i in "${bins[@]}"; do basename "$i"; done | paste -sd, - | sed 's/,/, /g')
  echo "$step: building $names ($hint)..." >&2
  tmp=$(mktemp -d "$(dirname "${bins[0]}")/.build.XXXXXX")
  # shellcheck disable=SC2064 # expand now: tmp is local
  trap "rm -rf '$tmp'" EXIT
  # -v names each package compiled (on stderr; nothing else goes to stdout).
  ${GO:-go} build -v "${BUILD_FLAGS[@]}" -o "$tmp/" "${pkgs[@]}" 2>&1 | count_packages "$step" >&2
  for i in "${!bins[@]}"; do
    mv "$tmp/$(basename "${pkgs[$i]}")" "${bins[$i]}"
  done
  rmdir "$tmp"
  echo "$step: built $names in $((SECONDS - t0))s" >&2
}

# count_packages LABEL: reads `go build -v` output and prints a progress line
# every 100 packages compiled (how many, how long so far); anything else (an
# error) goes through unchanged.
count_packages() {
  local label=$1 n=0 t0=$SECONDS line
  while IFS= read -r line; do
    case $line in
    *" "* | "") echo "$line" ;;
    *)
      n=$((n + 1))
      [ $((n % 100)) -ne 0 ] || echo "$label: $n packages compiled, $((SECONDS - t0))s so far" ;;
    esac
  done
}
