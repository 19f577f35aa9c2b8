# podvol: see README.md.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)
GO ?= go

.PHONY: all build test vet bench clean

all: build

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/podvol-plugin ./cmd/podvol-plugin

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: the files above need formatting"; exit 1; }
	$(GO) vet ./...

# Everything: unit tests, csi-sanity (ext4, xfs, block) and the crash tests,
# all with real loop devices and mounts. Needs root.
test: vet
	$(GO) test -count=1 -timeout 30m ./...

clean:
	rm -rf bin

# Benchmarks with a ratio report (see bench/README.md). Needs root and ~15 GiB
# of free disk for the 80%-full volumes.
bench:
	$(GO) test -run '^$$' -bench . -benchtime 5x -timeout 60m ./bench/
