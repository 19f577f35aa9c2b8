// Package images builds podvol's two container images, podvol-plugin and
// podvol-controller, for each platform, with no Docker: the binaries
// cross-compiled, the plugin's programs (device.Programs) and the shared
// libraries they load taken from Debian packages of the platform's
// architecture (internal/debpkg), the images written reproducibly by
// internal/ociimage. `make images` and the dev cluster both build them
// here.
package images

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/mod/modfile"

	"github.com/podvol/podvol/internal/ociimage"
)

// Names of the images (and of their binaries).
const (
	Plugin     = "podvol-plugin"
	Controller = "podvol-controller"
)

// GroupSnapshotter is the other binary of the plugin's image: the node
// pod's group snapshot sidecar (cmd/podvol-group-snapshotter).
const GroupSnapshotter = "podvol-group-snapshotter"

// Platforms are the architectures `make images` builds by default.
var Platforms = []string{"amd64", "arm64"}

// ControllerUser is the numeric user:group the controller runs as: it
// needs no privilege, and a numeric id lets runAsNonRoot check it.
const ControllerUser = "65532:65532"

// DefaultCache is where downloaded Debian indexes and packages are kept,
// by hash.
const DefaultCache = "/var/cache/podvol/debian"

// Build is what every image of one build shares.
type Build struct {
	Version  string    // stamped into the binaries and the labels
	Revision string    // the commit
	Source   string    // the source repository's URL
	Created  time.Time // every file's time and the images' creation time
	Cache    string    // the Debian cache (DefaultCache if empty)
	// TrimPath compiles with -trimpath, so that the binaries do not depend
	// on where the checkout is (make images). Without it, compiling shares
	// the build cache with make build and the tests (a -trimpath build
	// compiles every dependency again): the dev cluster's choice.
	TrimPath bool
	Logf     func(format string, args ...any)
}

// ForRepo returns a Build of the checkout at repo: its commit, its module's
// repository, and as the time SOURCE_DATE_EPOCH if set, else the commit's.
func ForRepo(repo, version string) (Build, error) {
	b := Build{Version: version}
	gomod, err := os.ReadFile(filepath.Join(repo, "go.mod"))
	if err != nil {
		return b, err
	}
	b.Source = "https://" + modfile.ModulePath(gomod)
	rev, err := exec.Command("git", "-C", repo, "rev-parse", "HEAD").Output()
	if err != nil {
		return b, fmt.Errorf("git rev-parse HEAD in %s (the images' revision label): %w", repo, err)
	}
	b.Revision = strings.TrimSpace(string(rev))
	epoch := os.Getenv("SOURCE_DATE_EPOCH")
	if epoch == "" {
		out, err := exec.Command("git", "-C", repo, "log", "-1", "--format=%ct").Output()
		if err != nil {
			return b, fmt.Errorf("git log in %s (the images' time): %w", repo, err)
		}
		epoch = strings.TrimSpace(string(out))
	}
	sec, err := strconv.ParseInt(epoch, 10, 64)
	if err != nil {
		return b, fmt.Errorf("SOURCE_DATE_EPOCH %q: not a number of seconds", epoch)
	}
	b.Created = time.Unix(sec, 0).UTC()
	return b, nil
}

func (b Build) logf(format string, args ...any) {
	if b.Logf != nil {
		b.Logf(format, args...)
	}
}

func (b Build) cache() string {
	if b.Cache != "" {
		return b.Cache
	}
	return DefaultCache
}

// Labels returns the org.opencontainers.image.* labels of the image name.
func (b Build) Labels(name string) map[string]string {
	l := map[string]string{
		ociimage.AnnotationTitle:   name,
		ociimage.AnnotationCreated: b.Created.UTC().Format(time.RFC3339),
		ociimage.AnnotationVersion: b.Version,
	}
	if b.Revision != "" {
		l[ociimage.AnnotationRevision] = b.Revision
	}
	if b.Source != "" {
		l[ociimage.AnnotationSource] = b.Source
	}
	return l
}

// PluginImage is the plugin's image for goarch: root (it attaches loop
// devices and mounts), the binaries at /podvol-plugin and
// /podvol-group-snapshotter (when bins has it: a release older than group
// snapshots has none) and tools, the files PluginTools returns.
func (b Build) PluginImage(goarch string, bins map[string]string, tools []ociimage.File) ociimage.Image {
	files := []ociimage.File{
		{Path: "/" + Plugin, From: bins[Plugin], Mode: 0o755},
		{Path: "/tmp", Dir: true, Mode: 0o1777},
	}
	if g, ok := bins[GroupSnapshotter]; ok {
		files = append(files, ociimage.File{Path: "/" + GroupSnapshotter, From: g, Mode: 0o755})
	}
	files = append(files, tools...)
	return ociimage.Image{
		Platform:   ociimage.Linux(goarch),
		Entrypoint: []string{"/" + Plugin},
		Labels:     b.Labels(Plugin),
		Created:    b.Created,
		Files:      files,
	}
}

// ControllerImage is the controller's image for goarch: one static binary,
// run as ControllerUser.
func (b Build) ControllerImage(goarch, binary string) ociimage.Image {
	return ociimage.Image{
		Platform:   ociimage.Linux(goarch),
		Entrypoint: []string{"/" + Controller},
		User:       ControllerUser,
		Labels:     b.Labels(Controller),
		Created:    b.Created,
		Files:      []ociimage.File{{Path: "/" + Controller, From: binary, Mode: 0o755}},
	}
}

// CompileBinaries cross-compiles the plugin, the group snapshotter (if the
// checkout has it) and the controller for goarch into dir (as dir/<name>),
// static, stripped, with the version stamped in as `make build` does.
func (b Build) CompileBinaries(ctx context.Context, repo, goarch, dir string) (map[string]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, name := range []string{Plugin, GroupSnapshotter, Controller} {
		if _, err := os.Stat(filepath.Join(repo, "cmd", name)); name == GroupSnapshotter && errors.Is(err, fs.ErrNotExist) {
			continue // an older release (the upgrade test's previous one)
		}
		bin := filepath.Join(dir, name)
		b.logf("compiling %s for linux/%s", name, goarch)
		args := []string{"build", "-ldflags", "-s -w -X main.version=" + b.Version, "-o", bin}
		if b.TrimPath {
			args = append(args, "-trimpath")
		}
		cmd := exec.CommandContext(ctx, "go", append(args, "./cmd/"+name)...)
		cmd.Dir = repo
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+goarch)
		if o, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("go build %s for linux/%s: %w\n%s", name, goarch, err, o)
		}
		out[name] = bin
	}
	return out, nil
}

// WriteAll builds both images for each of goarches from the checkout at
// repo and writes them to outDir as <name>.oci.tar, each an image index of
// one image per platform. It returns each archive's index digest.
func (b Build) WriteAll(ctx context.Context, repo, outDir string, goarches []string) (map[string]string, error) {
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return nil, err
	}
	byName := map[string][]ociimage.Image{}
	for _, arch := range goarches {
		bins, err := b.CompileBinaries(ctx, repo, arch, filepath.Join(outDir, "bin", "linux_"+arch))
		if err != nil {
			return nil, err
		}
		tools, err := PluginTools(ctx, arch, b.cache(), b.logf)
		if err != nil {
			return nil, err
		}
		byName[Plugin] = append(byName[Plugin], b.PluginImage(arch, bins, tools))
		byName[Controller] = append(byName[Controller], b.ControllerImage(arch, bins[Controller]))
	}
	digests := map[string]string{}
	names := make([]string, 0, len(byName))
	for n := range byName {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		path := filepath.Join(outDir, name+".oci.tar")
		d, err := ociimage.WriteIndexArchive(path, name+":"+b.Version, b.Labels(name), byName[name]...)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		digests[name] = d
		b.logf("%s %s", path, d)
	}
	return digests, nil
}
