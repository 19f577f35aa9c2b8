# podvol's two images, built elsewhere (the dev cluster builds the same images
# without Docker: internal/devcluster/images.go):
#   docker build --target podvol-controller -t <registry>/podvol-controller:<tag> .
#   docker build --target podvol-plugin     -t <registry>/podvol-plugin:<tag> .
# The plugin image carries the tools the plugin runs: mount, blkid,
# mkfs/fsck/resize for ext4 and xfs. The controller is one static binary.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN for b in podvol-plugin podvol-controller; do \
      CGO_ENABLED=0 go build -ldflags "-s -w -X main.version=${VERSION}" -o /$b ./cmd/$b || exit 1; \
    done

FROM scratch AS podvol-controller
COPY --from=build /podvol-controller /podvol-controller
USER 65532:65532
ENTRYPOINT ["/podvol-controller"]

# Last, so that a plain `docker build .` builds the plugin, as it always has.
FROM debian:bookworm-slim AS podvol-plugin
RUN apt-get update \
 && apt-get install -y --no-install-recommends mount util-linux e2fsprogs xfsprogs \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /podvol-plugin /podvol-plugin
ENTRYPOINT ["/podvol-plugin"]
