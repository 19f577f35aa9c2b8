# The podvol-plugin image, built elsewhere (the dev cluster builds the same
# image without Docker: internal/devcluster/images.go). It carries the tools
# the plugin runs: mount, blkid, mkfs/fsck/resize for ext4 and xfs.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -ldflags "-s -w -X main.version=$(git describe --tags --always 2>/dev/null || echo dev)" -o /podvol-plugin ./cmd/podvol-plugin

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends mount util-linux e2fsprogs xfsprogs \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /podvol-plugin /podvol-plugin
ENTRYPOINT ["/podvol-plugin"]
