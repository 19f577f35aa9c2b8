# podvol: see README.md.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)
GO ?= go

# Everything is built static (CGO_ENABLED=0), as podvol's binaries and the
# tools under tools/ are: packages compiled with and without cgo differ, so
# one setting compiles the module's dependencies once for vet, lint, the
# tests and the dev cluster's images (on a fresh machine, minutes). Only the
# race detector needs cgo (and gcc).
export CGO_ENABLED ?= 0

.PHONY: all help build generate images align test test-host test-cluster check vet lint prometheus-tools fuzz soak bench bench-microvm bench-startup bench-datapath clean deps demo up down conformance conformance-chaos conformance-slow

all: build

# Each public target with its ## comment.
help: ## this list
	@awk 'BEGIN { FS = ":[^#]*## " } /^[a-zA-Z0-9_-]+:[^#]*## / { printf "  %-18s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

# The five binaries, each with the version stamped in (--version prints it).
build: ## bin/podvol-plugin, bin/podvol-group-snapshotter, bin/podvol-controller, bin/podvol-dev, bin/kubectl-podvol
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/podvol-plugin ./cmd/podvol-plugin
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/podvol-group-snapshotter ./cmd/podvol-group-snapshotter
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/podvol-controller ./cmd/podvol-controller
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/podvol-dev ./cmd/podvol-dev
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/kubectl-podvol ./cmd/kubectl-podvol

# podvol's images without Docker (internal/images): podvol-plugin and
# podvol-controller as OCI archives in bin/images, each an image index for
# IMAGE_PLATFORMS, reproducible (the time is SOURCE_DATE_EPOCH, else the
# commit's). The plugin's programs come from Debian packages of each
# architecture, from the archive apt is configured with, verified and
# cached by hash in IMAGE_CACHE. Push them with any OCI tool (README).
IMAGE_PLATFORMS ?= amd64,arm64
IMAGE_CACHE ?= /var/cache/podvol/debian
images: ## bin/images/podvol-{plugin,controller}.oci.tar for IMAGE_PLATFORMS (no Docker)
	$(GO) run ./cmd/podvol-images -version '$(VERSION)' -platforms '$(IMAGE_PLATFORMS)' -cache '$(IMAGE_CACHE)' -out bin/images

# deploy/base is charts/podvol rendered with its default values (helm
# template, Helm built from Go modules by tools/helm/build.sh the first
# time); make check fails when they differ (internal/chart).
generate: ## write deploy/base from charts/podvol (helm template, default values)
	$(GO) run ./internal/chart/generate

# Debian packages the tests and the dev cluster need (root). Only what is
# missing is installed, so that make test can depend on it and still start
# at once on a machine that has them.
DEB_PACKAGES := gcc libc6-dev gpgv debian-archive-keyring e2fsprogs xfsprogs util-linux mount containerd runc containernetworking-plugins busybox-static iproute2 iptables ca-certificates git qemu-system-x86 curl
deps: ## install the Debian packages the tests and the dev cluster need (root)
	@missing=; for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -z "$$missing" ]; then echo "== Debian packages: all installed"; else \
	echo "== installing Debian packages:$$missing"; \
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; fi

# A real Kubernetes of three nodes with podvol deployed, and a walk through every
# volume lifecycle. The first run builds Kubernetes and the CSI sidecars from
# Go modules (22 minutes on 2 cores, measured; cached afterwards).
demo: deps ## bring up the dev cluster and walk through every volume lifecycle (root)
	$(GO) build -o bin/podvol-dev ./cmd/podvol-dev
	bin/podvol-dev demo

up: ## bring up the dev cluster: three nodes with podvol deployed (root)
	$(GO) build -o bin/podvol-dev ./cmd/podvol-dev
	bin/podvol-dev up

# Stops the dev cluster and removes everything it made.
down: ## stop the dev cluster and remove everything it made
	$(GO) build -o bin/podvol-dev ./cmd/podvol-dev
	bin/podvol-dev down

# Every Go file in the tree, committed or not (no git needed: check runs as
# any user).
GO_FILES = $(shell find . -name '*.go' -not -path './.git/*')

vet: ## gofmt check and go vet
	@test -z "$$(gofmt -l $(GO_FILES))" || { gofmt -l $(GO_FILES); echo "gofmt: the files above need formatting"; exit 1; }
	$(GO) vet ./...

# The unit-test packages: everything under internal/ but internal/device, the
# one package that acts on the machine (its tests attach real loop devices,
# run mkfs and mount: root). The others test against its in-memory fake,
# internal/device/devicetest, so they need no root and run with the race
# detector.
UNIT_PKGS = $(shell $(GO) list ./internal/... | grep -v '/internal/device$$')

# Their pools and images go to tmpfs where there is one: the metadata store's
# fsyncs then cost nothing.
CHECK_TMPDIR ?= $(shell test -d /dev/shm -a -w /dev/shm && echo /dev/shm || echo $${TMPDIR:-/tmp})

# golangci-lint over the whole module, tests included, at the version
# tools/lint/go.mod pins, built from Go modules into a cache by
# tools/lint/build.sh (5-8 minutes the first time); configuration in
# .golangci.yml.
lint: ## golangci-lint over the whole module (.golangci.yml)
	@lint=$$(GO='$(GO)' tools/lint/build.sh) && echo "$$lint run ./..." && "$$lint" run ./...

# go test runs through test/internal/testsummary: it prints go test -json's
# stream as go test without -json would, then every skipped test with its
# reason and every failure again (a skipped package otherwise reads as "ok").
# It fails as go test does, and when a package given to -require-run skipped
# a test: .ci/run sets PODVOL_REQUIRE_MICROVM=1, as make deps installed QEMU
# there, so test/microvm must run.
TEST_SUMMARY = $(GO) run ./test/internal/testsummary
REQUIRE_MICROVM = $(if $(filter 1,$(PODVOL_REQUIRE_MICROVM)),-require-run ./test/microvm)

# podvol's module and the tool modules (Kubernetes, the sidecars, Helm,
# Prometheus, the e2e suite) must compile one version of every module they
# share, or a cold build compiles client-go and everything below it once per
# version (tools/align.sh, which aligns them when run without --check).
align: ## check that podvol and tools/* compile one version of each shared module
	@GO='$(GO)' tools/align.sh --check

# prometheus, promtool and promqlnames at the version tools/prometheus/go.mod
# pins, built from Go modules into a cache by tools/prometheus/build.sh
# (4-8 minutes the first time): internal/monitoring's unit tests run them (the
# alert rules' promtool tests, the metric names of the rules and the
# dashboard), and the dev cluster's Prometheus is the same build.
prometheus-tools: ## build prometheus and promtool (tools/prometheus) into the cache
	@GO='$(GO)' tools/prometheus/build.sh >/dev/null

# Quick checks that need no root: gofmt, go vet, golangci-lint, and the unit
# tests with -race. Among them internal/chart's: helm lint, helm template
# with the default values (deploy/base must be what it renders) and with
# every value set, and bad values refused by the chart's schema; Helm is
# built first (cached), outside the tests' timeout.
check: vet lint prometheus-tools ## vet, lint and the unit tests with -race (the Helm chart's checks too): no root, no cluster
	@GO='$(GO)' tools/helm/build.sh >/dev/null
	$(TEST_SUMMARY) -- env CGO_ENABLED=1 TMPDIR=$(CHECK_TMPDIR) $(GO) test -json -race -count=1 -timeout 5m $(UNIT_PKGS)

# Every test. Needs root; installs the Debian packages it needs (deps) first,
# so that it runs on a fresh machine by itself. Two chains run at once (the
# dev cluster's mostly waits on pods, the host's mostly compiles):
# - test-host: align, make check, the fuzz run, then every package that
#   needs no cluster: internal/device, csi-sanity (ext4, xfs, block), the
#   crash and real-device tests, envtest suites, the microVM guest;
# - test-cluster: the end-to-end package on the dev cluster, with the
#   conformance suite's build beside it, then make conformance.
# The cluster chain is the longer one: the host chain runs at nice 10, so
# that its compiles take what the cluster chain leaves of the CPUs rather
# than half of them (a cold make test on 2 cores: docs/testing.md).
# Their output is interleaved line by line; each ends with its own summary.
test: deps ## every test: check, fuzz, the host packages and the cluster ones (root)
	@$(MAKE) --no-print-directory -j2 test-host-niced test-cluster

# (A recipe line naming $(MAKE) runs even under make -n: each such line here
# is a plain make of a target, which then prints its commands.)
test-host-niced:
	@nice -n 10 $(MAKE) --no-print-directory test-host

CLUSTER_PKGS := ./test/e2e
HOST_PKGS = $(filter-out $(UNIT_PKGS) %/test/e2e,$(shell $(GO) list ./...))

test-host: align check fuzz ## make test's host chain: check, fuzz, every package needing no cluster (root)
	$(TEST_SUMMARY) $(REQUIRE_MICROVM) -- $(GO) test -json -count=1 -timeout 60m $(HOST_PKGS)

# The conformance suite runs on the cluster the e2e tests leave up (they
# leave it as they found it), as it is: the cluster is taken down at the end
# unless it ran before. The suite's build, needed only then, runs beside the
# e2e tests at nice 19.
test-cluster: ## make test's cluster chain: the e2e tests, then make conformance on their cluster (root)
	@$(GO) build -o bin/podvol-dev ./cmd/podvol-dev
	@nice -n 19 tools/e2e/build.sh >/dev/null & build=$$!; \
	was=; bin/podvol-dev running >/dev/null && was=up; \
	PODVOL_E2E_KEEP=1 PODVOL_E2E_CONFORMANCE_NEXT=1 $(TEST_SUMMARY) -- $(GO) test -json -count=1 -timeout 60m $(CLUSTER_PKGS); rc=$$?; \
	wait $$build || { echo "the conformance suite's build (tools/e2e/build.sh) failed: run it alone to see why" >&2; rc=1; }; \
	if [ $$rc = 0 ]; then flock -o $(CONFORMANCE_LOCK) $(GO) run ./test/conformance -redeploy=false || rc=1; fi; \
	if [ "$$was" != up ]; then bin/podvol-dev down || rc=1; fi; \
	exit $$rc

# A bounded run of the native fuzz targets over request sizes and size
# quantities, and over what another node sends a transfer (frames, headers,
# a pull's path and query); their seed corpus also runs in every go test.
# Each target costs FUZZTIME and a start (~8 s), and each package its
# instrumented build: internal/transfer links net/http and crypto/tls. A
# failure is written to the package's testdata/fuzz/: keep it as a
# regression input.
FUZZTIME ?= 10s
fuzz: ## a bounded run of the size and transfer fuzz targets (FUZZTIME each, default 10s)
	$(GO) test -run '^$$' -fuzz '^FuzzSizeFor$$' -fuzztime $(FUZZTIME) ./internal/size/
	$(GO) test -run '^$$' -fuzz '^FuzzParseQuantitySize$$' -fuzztime $(FUZZTIME) ./internal/size/
	$(GO) test -run '^$$' -fuzz '^FuzzFrames$$' -fuzztime $(FUZZTIME) ./internal/transfer/
	$(GO) test -run '^$$' -fuzz '^FuzzHeaders$$' -fuzztime $(FUZZTIME) ./internal/transfer/

# test/plugin's randomized crash soak: random sequences of CSI calls with the
# plugin SIGKILLed at a random failpoint each trial and the invariants checked
# after each restart (make test runs 8 trials; SOAK_SEED replays a run).
SOAK_TRIALS ?= 200
SOAK_SEED ?= 0
soak: ## the crash soak: SOAK_TRIALS (200) random trials of CSI calls and SIGKILLs (root)
	$(GO) test -count=1 -v -run '^TestSoak$$' ./test/plugin/ -soak.trials=$(SOAK_TRIALS) -soak.seed=$(SOAK_SEED)

clean: ## remove bin/
	rm -rf bin

# Benchmarks with a ratio report (see bench/README.md). Needs root and ~15 GiB
# of free disk for the 80%-full volumes.
bench: ## snapshot/clone/provisioning benchmarks (root, ~15 GiB free)
	$(GO) test -run '^$$' -bench . -benchtime 5x -timeout 60m ./bench/

# A QEMU microVM's boot time and fio in the guest on a direct-assigned volume
# vs the same filesystem over virtio-fs (bench/microvm/README.md, rewritten
# with the figures measured, and microvm.png). Needs root; installs QEMU, fio
# and virtiofsd with apt-get if missing. A few minutes (TCG where KVM is not
# usable).
bench-microvm: ## microVM boot and fio: direct assignment vs virtio-fs (root)
	$(GO) test -run '^$$' -bench . -benchtime 1x -timeout 30m ./bench/microvm/

# The data path (issue 22): fio on volumes that the real plugin publishes
# (xfs, ext4, raw block) against the same jobs on the pool's own filesystem,
# etcd's fdatasync check, and the host page cache an image holds after a
# buffered write, with the plugin's loop devices buffered (before) and with
# direct I/O (after) in one run (bench/datapath/README.md, rewritten with the
# figures measured, datapath.png and the figures as JSON). Needs root and ~15
# GiB of free disk; installs fio with apt-get if missing; drops the host's
# page cache before each job. About 10 minutes with the defaults.
# DATAPATH_FLAGS='-pods' adds the pod layer on the dev cluster (it takes the
# cluster's lock and brings the cluster up if it is not running; -host=false
# runs it alone); '-rounds 3' takes the median of three rounds (22 minutes
# with '-runtime 8s'); '-runtime 15s -size 2g' and the others: go test
# ./bench/datapath -args -h. DATAPATH_TIMEOUT bounds the whole run (90m).
DATAPATH_FLAGS ?=
DATAPATH_TIMEOUT ?= 90m
bench-datapath: ## fio on published volumes vs the pool, buffered vs direct I/O (root)
	$(GO) test -run '^$$' -bench . -benchtime 1x -timeout $(DATAPATH_TIMEOUT) ./bench/datapath/ -args -cluster-lock $(CONFORMANCE_LOCK) $(DATAPATH_FLAGS)

# Pod start-up on the dev cluster: emptyDir vs a podvol CSI inline volume vs a
# generic ephemeral volume (ext4, xfs) vs a pre-bound PVC, one pod at a time
# and N at once, phase by phase from the API's watches, with the plugin's own
# CSI call durations (bench/startup/README.md, rewritten with the figures
# measured, startup.png and CSV files). Needs root; brings the dev cluster up
# if it is not running (and leaves it up); holds its lock (see conformance).
# About 30 minutes with the defaults, most of it one pod at a time (~6 s a
# pod with its teardown): STARTUP_FLAGS='-pods 40 -pods-one 40 -burst 20
# -rounds 2' (go run ./bench/startup -h).
STARTUP_FLAGS ?=
bench-startup: ## pod start-up on the dev cluster, by volume kind (root)
	flock -o $(CONFORMANCE_LOCK) $(GO) run ./bench/startup $(STARTUP_FLAGS)

# Data between nodes (issue 27): a snapshot's data moved from node-1 to node-2
# by podvol's transfer (a restore for a pod pinned to node-2) against cp
# --sparse of the same image between the same two pools, each from a cold page
# cache (bench/mobility/README.md, rewritten with the figures measured,
# mobility.png and mobility.json). Needs root; brings the dev cluster up (or up
# to date with the tree) and leaves it up; holds its lock (see conformance). A few
# minutes with the defaults: MOBILITY_FLAGS='-rounds 5 -data 2Gi -size 8Gi'
# (go run ./bench/mobility -h).
MOBILITY_FLAGS ?=
bench-mobility: ## data between two nodes: transfer vs sparse copy, a migrating replica's drain (root)
	flock -o $(CONFORMANCE_LOCK) $(GO) run ./bench/mobility $(MOBILITY_FLAGS)

# Kubernetes' external-storage e2e suite (v1.37.2, built unchanged from Go
# modules by tools/e2e/build.sh) against podvol on the dev cluster, for each
# test-driver definition in test/conformance (ext4, xfs, raw block, inline
# ephemeral); reports in /var/lib/podvol-conformance. README, "Conformance".
# Needs root. The dev cluster is one per machine: its users take this lock
# (-o: the cluster's processes, if this run starts them, must not inherit it).
CONFORMANCE_LOCK ?= /tmp/podvol-devcluster.lock
conformance: ## Kubernetes' external-storage suite on the dev cluster (root)
	tools/e2e/build.sh >/dev/null
	flock -o $(CONFORMANCE_LOCK) $(GO) run ./test/conformance $(CONFORMANCE_FLAGS)

# The same runs while podvol's pods are deleted and its containers SIGKILLed
# every 20-60 s (seeded; the log with the seed in /var/lib/podvol-conformance/
# chaos.log, beside the JUnit reports): every spec must pass as without.
conformance-chaos: ## make conformance while podvol's pods and containers are killed (root)
	tools/e2e/build.sh >/dev/null
	flock -o $(CONFORMANCE_LOCK) $(GO) run ./test/conformance -chaos

# The suite's [Slow] specs, likewise.
conformance-slow: ## the suite's [Slow] specs, likewise (root)
	tools/e2e/build.sh >/dev/null
	flock -o $(CONFORMANCE_LOCK) $(GO) run ./test/conformance -slow
