// Command podvol-images writes podvol's container images, podvol-plugin and
// podvol-controller, as OCI archives (an image index of one image per
// platform) with no Docker: `make images` runs it. See internal/images.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/podvol/podvol/internal/images"
)

func main() {
	out := flag.String("out", "bin/images", "directory the archives are written to")
	imageVersion := flag.String("version", "dev", "the version stamped into the binaries and the labels, and the archives' tag")
	platforms := flag.String("platforms", strings.Join(images.Platforms, ","), "the architectures, comma-separated (linux)")
	cache := flag.String("cache", images.DefaultCache, "where downloaded Debian indexes and packages are kept, by hash")
	repo := flag.String("repo", ".", "the podvol checkout to build")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	b, err := images.ForRepo(*repo, *imageVersion)
	if err != nil {
		fmt.Fprintf(os.Stderr, "podvol-images: %v\n", err)
		os.Exit(1)
	}
	b.Cache = *cache
	b.TrimPath = true
	b.Logf = func(format string, args ...any) { fmt.Fprintf(os.Stderr, "== "+format+"\n", args...) }
	digests, err := b.WriteAll(ctx, *repo, *out, strings.Split(*platforms, ","))
	if err != nil {
		fmt.Fprintf(os.Stderr, "podvol-images: %v\n", err)
		os.Exit(1)
	}
	for _, name := range []string{images.Plugin, images.Controller} {
		fmt.Printf("%s/%s.oci.tar %s\n", *out, name, digests[name])
	}
	fmt.Fprintf(os.Stderr, "== done in %s\n", time.Since(start).Round(100*time.Millisecond))
}
