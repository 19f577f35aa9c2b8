package devcluster

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/podvol/podvol/internal/chart"
	"github.com/podvol/podvol/internal/images"
)

// Release is one version of podvol as an admin installs it: a chart
// directory and the tag of podvol's images built for it on every node.
type Release struct {
	Chart string
	Tag   string
}

// CurrentRelease is the podvol that Up installs: the checkout's chart with
// the images built from it.
func (c *Cluster) CurrentRelease() Release {
	return Release{Chart: filepath.Join(c.Repo, chart.Dir), Tag: c.podvolTag}
}

// BuildRelease builds podvol's two images from the source tree at src (a
// checkout of another version, which must be a git work tree: the images'
// labels name its commit), imports them into every node's containerd and
// returns that version's release: src's chart and the images' tag. The
// images are built as Up builds the current ones, with the programs of
// the current plugin image (the Debian packages are not part of the
// version).
func (c *Cluster) BuildRelease(ctx context.Context, src string) (Release, error) {
	if !c.Running() {
		return Release{}, fmt.Errorf("the dev cluster is not running")
	}
	b, err := images.ForRepo(src, "previous")
	if err != nil {
		return Release{}, err
	}
	b.Logf = c.p.note
	// The same commit makes the same images wherever it is checked out, so
	// a second run imports nothing new.
	b.TrimPath = true
	dir := c.path("releases", filepath.Base(src))
	bins, err := b.CompileBinaries(ctx, src, runtime.GOARCH, filepath.Join(dir, "bin"))
	if err != nil {
		return Release{}, fmt.Errorf("the release at %s: %w", src, err)
	}
	tag, archives, err := c.writePodvolImages(ctx, b, bins, "release", dir)
	if err != nil {
		return Release{}, err
	}
	for _, archive := range archives {
		for _, n := range c.Nodes {
			if _, err := c.run(ctx, "ctr", "-a", n.ContainerdSock(), "-n", "k8s.io", "images", "import", "--no-unpack", archive); err != nil {
				return Release{}, fmt.Errorf("node %s: import %s: %w", n.Name, archive, err)
			}
		}
	}
	c.p.note("podvol's images of %s (commit %.12s) on every node as %s", src, b.Revision, tag)
	return Release{Chart: filepath.Join(src, chart.Dir), Tag: tag}, nil
}

// Install installs release r, or upgrades the installed one to it, with the
// dev cluster's values (helm upgrade --install), and waits as Up does:
// podvol's pods rolled out, registered with every kubelet, every node's
// capacity published.
func (c *Cluster) Install(ctx context.Context, r Release) error {
	if err := c.helmUpgrade(ctx, r); err != nil {
		return err
	}
	return c.waitDeployed(ctx)
}

// Uninstall runs helm uninstall of podvol's release and waits until
// podvol's pods are gone.
func (c *Cluster) Uninstall(ctx context.Context) error {
	helm, err := c.Helm(ctx)
	if err != nil {
		return err
	}
	if _, err := c.run(ctx, helm, "uninstall", chart.Release, "--kubeconfig", c.Kubeconfig(),
		"--namespace", chart.Namespace, "--wait", "--timeout", "5m"); err != nil {
		return err
	}
	return waitFor("podvol's pods gone", 3*time.Minute, func() error {
		out, err := c.kubectl(ctx, "-n", chart.Namespace, "get", "pods", "-l", "app.kubernetes.io/part-of=podvol", "-o", "name")
		if err != nil {
			return err
		}
		if out = strings.TrimSpace(out); out != "" {
			return fmt.Errorf("still running: %s: %w", strings.ReplaceAll(out, "\n", ", "), errNotYet)
		}
		return nil
	})
}
