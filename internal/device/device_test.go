package device

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func image(t *testing.T, size int64) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("device tests attach loop devices: run them as root")
	}
	p := filepath.Join(t.TempDir(), "img")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	return p
}

func TestLoopAttachFindDetach(t *testing.T) {
	img := image(t, 32<<20)
	dev, err := AttachLoop(img, LoopOptions{DirectIO: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = DetachLoop(dev, img) })
	if got := LoopBackingFile(dev); got != img {
		t.Fatalf("backing file of %s: %q, want %q", dev, got, img)
	}
	if devs, _ := LoopsFor(img); len(devs) != 1 || devs[0] != dev {
		t.Fatalf("LoopsFor: %v", devs)
	}
	if size, err := DeviceSize(dev); err != nil || size != 32<<20 {
		t.Fatalf("size %d, %v", size, err)
	}
	// A number listed with another file serves someone else now.
	if err := DetachLoop(dev, img+".other"); err != nil || LoopBackingFile(dev) != img {
		t.Fatalf("detach of %s listed with another file: %v; backing now %q", dev, err, LoopBackingFile(dev))
	}
	if err := DetachLoop(dev, img); err != nil {
		t.Fatal(err)
	}
	if err := DetachLoop(dev, img); err != nil {
		t.Fatalf("detaching twice: %v", err)
	}
	if devs, _ := LoopsFor(img); len(devs) != 0 {
		t.Fatalf("still attached: %v", devs)
	}
}

// A scanner (a kubelet's losetup, blkid) holding the device open for a few
// seconds on a loaded machine delays the detach; it does not fail it. It
// failed after 2 s, and an unstage with it (seen in make test, beside the
// dev cluster's e2e tests).
func TestDetachWaitsForAPassingOpener(t *testing.T) {
	img := image(t, 32<<20)
	dev, err := AttachLoop(img, LoopOptions{DirectIO: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = DetachLoop(dev, img) })
	f, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	released := make(chan struct{})
	go func() {
		defer close(released)
		time.Sleep(3 * time.Second)
		f.Close()
	}()
	err = DetachLoop(dev, img)
	<-released
	if err != nil {
		t.Fatalf("detach while another opener held %s for 3 s: %v", dev, err)
	}
	if devs, _ := LoopsFor(img); len(devs) != 0 {
		t.Fatalf("still attached: %v", devs)
	}
}

func TestAttachRefusesSymlink(t *testing.T) {
	img := image(t, 1<<20)
	link := filepath.Join(filepath.Dir(img), "link")
	if err := os.Symlink(img, link); err != nil {
		t.Fatal(err)
	}
	if dev, err := AttachLoop(link, LoopOptions{DirectIO: true}); err == nil {
		_ = DetachLoop(dev, img)
		t.Fatal("attached through a symlink")
	}
}

func TestFormatProbeMount(t *testing.T) {
	ctx := context.Background()
	for _, fs := range []string{"ext4", "xfs"} {
		t.Run(fs, func(t *testing.T) {
			img := image(t, 300<<20)
			dev, err := AttachLoop(img, LoopOptions{DirectIO: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = DetachLoop(dev, img) })
			if got, err := Probe(ctx, dev); err != nil || got != "" {
				t.Fatalf("blank device probed as %q, %v", got, err)
			}
			if err := Format(ctx, dev, fs); err != nil {
				t.Fatal(err)
			}
			if got, err := Probe(ctx, dev); err != nil || got != fs {
				t.Fatalf("probe after format: %q, %v", got, err)
			}
			mnt := t.TempDir()
			if err := Mount(ctx, dev, mnt, fs, []string{"noatime"}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = Unmount(mnt) })
			m, err := MountedAt(mnt)
			if err != nil || m == nil || m.Source != dev || m.FsType != fs || m.ReadOnly() {
				t.Fatalf("MountedAt: %+v, %v", m, err)
			}
			if mps, _ := MountsOf(dev); len(mps) != 1 || mps[0] != mnt {
				t.Fatalf("MountsOf: %v", mps)
			}
			st, err := Statfs(mnt)
			if err != nil || st.TotalBytes <= 0 || st.TotalBytes > 300<<20 || st.TotalInodes <= 0 {
				t.Fatalf("statfs: %+v, %v", st, err)
			}
			if err := Unmount(mnt); err != nil {
				t.Fatal(err)
			}
			if err := Unmount(mnt); err != nil {
				t.Fatalf("unmounting twice: %v", err)
			}
			if m, _ := MountedAt(mnt); m != nil {
				t.Fatalf("still mounted: %+v", m)
			}
		})
	}
}

// A loop device attached from another mount namespace (the plugin's previous
// container, before an upgrade or a restart) reports its backing file under
// that namespace's path, which does not exist here: it is still found as the
// image's, served, and detached.
func TestLoopsOfAnotherMountNamespace(t *testing.T) {
	img := image(t, 8<<20)
	dir := filepath.Dir(img)
	// A private mount namespace binds the image's directory elsewhere and
	// attaches from there; the namespace is gone when the command exits.
	out, err := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c",
		`mkdir -p "$1/elsewhere" && mount --bind "$1" "$1/elsewhere" && losetup --find --show "$1/elsewhere/img"`, "sh", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("attach from another mount namespace: %v\n%s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { _ = exec.Command("losetup", "-d", dev).Run() })
	t.Logf("%s attached elsewhere; the kernel reports its backing file as %q", dev, LoopBackingFile(dev))
	if devs, err := LoopsFor(img); err != nil || len(devs) != 1 || devs[0] != dev {
		t.Fatalf("LoopsFor(%s) = %v, %v; want [%s]", img, devs, err, dev)
	}
	if !LoopServes(dev, img) {
		t.Fatalf("LoopServes(%s, %s) = false", dev, img)
	}
	other := image(t, 1<<20)
	if LoopServes(dev, other) {
		t.Fatalf("LoopServes(%s, %s) = true for another file", dev, other)
	}
	if err := DetachLoop(dev, img); err != nil {
		t.Fatal(err)
	}
	if devs, _ := LoopsFor(img); len(devs) != 0 {
		t.Fatalf("still attached after DetachLoop: %v", devs)
	}
}
