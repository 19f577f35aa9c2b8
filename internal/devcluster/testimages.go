package devcluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path"
	"strings"

	"github.com/podvol/podvol/internal/ociimage"
)

// ImportTestImages builds stand-ins for the images Kubernetes' e2e storage
// suite runs and imports them into every node's containerd under
// the references the suite uses (refs: what `e2e.test --list-images` prints).
// agnhost is the agnhost binary built from the Kubernetes module. busybox,
// nginx and glibc-dns-testing are the host's busybox with GNU dd (the specs
// run `dd oflag=nocache`, which busybox's dd refuses) and dash as /bin/sh;
// the pods the storage specs make with them name their command. pause is podvol-dev's own. A
// reference of another image is not built: it is returned, for the caller
// to report.
func (c *Cluster) ImportTestImages(ctx context.Context, refs []string, agnhost string) (built, unknown []string, err error) {
	if !c.Running() {
		return nil, nil, fmt.Errorf("the dev cluster is not running")
	}
	shell, err := testShellFiles()
	if err != nil {
		return nil, nil, err
	}
	for _, ref := range refs {
		name := path.Base(ref)
		if i := strings.LastIndex(name, ":"); i >= 0 {
			name = name[:i]
		}
		var img image
		switch name {
		case "busybox", "nginx", "glibc-dns-testing":
			img = image{ref: ref, cmd: []string{"sh"}, files: shell}
		case "agnhost":
			files := append([]ociimage.File{{Path: "/agnhost", From: agnhost, Mode: 0o755}, {Path: "/uploads", Dir: true}}, shell...)
			img = image{ref: ref, entrypoint: []string{"/agnhost"}, cmd: []string{"pause"}, files: files}
		case "pause":
			img = image{ref: ref, entrypoint: []string{"/pause"}, files: []ociimage.File{{Path: "/pause", From: c.path("bin", "pause"), Mode: 0o755}}}
		default:
			unknown = append(unknown, ref)
			continue
		}
		if err := c.importImage(ctx, img); err != nil {
			return built, unknown, err
		}
		built = append(built, ref)
	}
	return built, unknown, nil
}

// importImage writes img as an OCI archive below test-images and imports it
// into every node's containerd.
func (c *Cluster) importImage(ctx context.Context, img image) error {
	if err := os.MkdirAll(c.path("test-images"), 0o755); err != nil {
		return err
	}
	archive := c.path("test-images", strings.NewReplacer("/", "_", ":", "_").Replace(img.ref)+".oci.tar")
	if err := img.write(archive); err != nil {
		return fmt.Errorf("image %s: %w", img.ref, err)
	}
	for _, n := range c.Nodes {
		if _, err := c.run(ctx, "ctr", "-a", n.ContainerdSock(), "-n", "k8s.io", "images", "import", "--no-unpack", archive); err != nil {
			return fmt.Errorf("node %s: import %s: %w", n.Name, img.ref, err)
		}
	}
	return nil
}

// ImportToolImage builds an image of host programs (e.g. fio, a Debian
// binary with dozens of shared libraries) with the shared libraries ldd
// says they load and the test images' shell userland, and imports it into
// every node's containerd as ref. Its entrypoint is sh; the programs keep
// their host paths. It is how a benchmark runs a host tool in a pod with no
// registry.
func (c *Cluster) ImportToolImage(ctx context.Context, ref string, programs ...string) error {
	if !c.Running() {
		return fmt.Errorf("the dev cluster is not running")
	}
	img, err := toolImage(ref, programs...)
	if err != nil {
		return err
	}
	return c.importImage(ctx, img)
}

func toolImage(ref string, programs ...string) (image, error) {
	files, err := testShellFiles()
	if err != nil {
		return image{}, err
	}
	tools, err := hostBinaries(programs...)
	if err != nil {
		return image{}, fmt.Errorf("image %s: %w", ref, err)
	}
	// A library both the shell and a tool load is in the image once.
	seen := map[string]bool{}
	for _, f := range files {
		seen[f.Path] = true
	}
	for _, f := range tools {
		if !seen[f.Path] {
			seen[f.Path] = true
			files = append(files, f)
		}
	}
	return image{ref: ref, entrypoint: []string{"/bin/sh"}, files: files}, nil
}

// testShellFiles is a busybox userland whose dd is GNU dd and whose sh is
// dash (with the shared libraries they load).
func testShellFiles() ([]ociimage.File, error) {
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		return nil, err
	}
	applets, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("busybox --list: %w", err)
	}
	files := []ociimage.File{
		{Path: "/bin/busybox", From: busybox, Mode: 0o755},
		{Path: "/etc/passwd", Data: []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n")},
		{Path: "/etc/group", Data: []byte("root:x:0:\nnogroup:x:65534:\n")},
		{Path: "/tmp", Dir: true},
		{Path: "/root", Dir: true},
	}
	// The shell is dash, not busybox's: a static busybox's shell runs its
	// own applets before anything on PATH, its dd included.
	for _, a := range strings.Fields(string(applets)) {
		if a != "busybox" && a != "dd" && a != "sh" {
			files = append(files, ociimage.File{Path: "/bin/" + a, Link: "busybox"})
		}
	}
	seen := map[string]bool{}
	for name, as := range map[string]string{"dd": "/bin/dd", "dash": "/bin/sh"} {
		bins, err := hostBinaries(name)
		if err != nil {
			return nil, fmt.Errorf("%s (Debian: coreutils, dash): %w", name, err)
		}
		p, _ := exec.LookPath(name)
		for _, f := range bins {
			if f.Path == p {
				f.Path = as
			}
			if strings.HasPrefix(f.Path, "/bin/") && f.Path != as || seen[f.Path] {
				continue // a symlink to it under /bin (busybox's here), or a library both load
			}
			seen[f.Path] = true
			files = append(files, f)
		}
	}
	return files, nil
}
