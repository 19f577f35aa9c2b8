package inline_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/podvol/podvol/internal/device/devicetest"
	"github.com/podvol/podvol/internal/errkind"
	"github.com/podvol/podvol/internal/inline"
	"github.com/podvol/podvol/internal/keylock"
	"github.com/podvol/podvol/internal/node"
	"github.com/podvol/podvol/internal/pool"
	"github.com/podvol/podvol/internal/size"
	"github.com/podvol/podvol/internal/store"
)

var ctx = context.Background()

type env struct {
	t       *testing.T
	dev     *devicetest.Fake
	poolDir string
	kubelet string
	pool    *pool.Pool
	node    *node.Node
	m       *inline.Manager
}

func newEnv(t *testing.T, capacity int64) *env {
	t.Helper()
	dir, err := filepath.EvalSymlinks(t.TempDir())
	must(t, err)
	e := &env{t: t, dev: devicetest.New(), poolDir: filepath.Join(dir, "pool"), kubelet: filepath.Join(dir, "kubelet")}
	e.open(capacity)
	t.Cleanup(func() {
		if err := e.pool.Close(); err != nil {
			t.Error(err)
		}
	})
	return e
}

// open starts the plugin's pool, node and inline manager, as the plugin
// does at start.
func (e *env) open(capacity int64) {
	e.t.Helper()
	p, err := pool.Open(pool.Config{Dir: e.poolDir, Capacity: capacity, Device: e.dev})
	must(e.t, err)
	e.pool, e.node = p, node.New(p, nil, e.dev)
	e.m = &inline.Manager{Pool: p, Node: e.node, KubeletDir: e.kubelet, Device: e.dev, Locks: &keylock.Locks{}}
}

func (e *env) restart() {
	e.t.Helper()
	must(e.t, e.pool.Close())
	e.open(10 * size.GiB)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// pod is one pod's inline volume as kubelet asks for it.
type pod struct {
	uid, handle, dir, target string
}

func (e *env) pod(name string) *pod {
	e.t.Helper()
	uid := "uid-" + name
	dir := filepath.Join(e.kubelet, "pods", uid)
	target := filepath.Join(dir, "volumes", "kubernetes.io~csi", "scratch", "mount")
	must(e.t, os.MkdirAll(filepath.Dir(target), 0o750))
	return &pod{uid: uid, handle: "csi-" + name, dir: dir, target: target}
}

func (e *env) publish(p *pod, mod ...func(*inline.PublishRequest)) error {
	r := inline.PublishRequest{Handle: p.handle, TargetPath: p.target, SizeBytes: 64 * size.MiB, FsType: "ext4",
		Pod: store.Inline{PodUID: p.uid, PodName: "pod", PodNamespace: "ns"}}
	for _, m := range mod {
		m(&r)
	}
	return e.m.Publish(ctx, r)
}

// published fails unless the pod's inline volume is mounted at its target
// from its own image, and returns the volume's id.
func (e *env) published(p *pod) string {
	e.t.Helper()
	id, ok := e.m.VolumeID(p.handle)
	if !ok {
		e.t.Fatalf("no volume for %s", p.handle)
	}
	m, err := e.dev.MountedAt(p.target)
	if err != nil || m == nil || e.dev.LoopBackingFile(m.Source) != e.pool.ImagePath(id) {
		e.t.Fatalf("%s is not mounted from its image: %+v, %v", p.target, m, err)
	}
	return id
}

// gone fails unless nothing is left of the pod's inline volume.
func (e *env) gone(p *pod, id string) {
	e.t.Helper()
	if _, ok := e.m.VolumeID(p.handle); ok {
		e.t.Fatalf("%s still has a volume", p.handle)
	}
	if m, _ := e.dev.MountedAt(p.target); m != nil {
		e.t.Fatalf("%s still mounted", p.target)
	}
	if _, err := os.Stat(p.target); !os.IsNotExist(err) {
		e.t.Fatalf("target %s left (%v)", p.target, err)
	}
	if id != "" {
		if _, err := os.Stat(e.pool.ImagePath(id)); !os.IsNotExist(err) {
			e.t.Fatalf("image of %s left (%v)", id, err)
		}
	}
}

func (e *env) volumes() int {
	e.t.Helper()
	vols, err := e.pool.Store().Volumes()
	must(e.t, err)
	return len(vols)
}

// A Manager without a mount table refuses to work rather than read and
// unmount the host's: a test that forgets the fake must fail, and nothing
// is created.
func TestManagerWithoutDeviceIsRefused(t *testing.T) {
	e := newEnv(t, 10*size.GiB)
	m := &inline.Manager{Pool: e.pool, Node: e.node, KubeletDir: e.kubelet, Locks: &keylock.Locks{}}
	e.m = m
	p := e.pod("a")
	err := e.publish(p)
	if err == nil || !strings.Contains(err.Error(), "Device") {
		t.Fatalf("publish with no Device: %v", err)
	}
	if vols, _ := e.pool.Store().Volumes(); len(vols) != 0 {
		t.Fatalf("the refused publish created %d volumes", len(vols))
	}
	if err := m.Unpublish(ctx, p.handle, p.target); err == nil || !strings.Contains(err.Error(), "Device") {
		t.Fatalf("unpublish with no Device: %v", err)
	}
	if err := m.Collect(ctx); err == nil || !strings.Contains(err.Error(), "Device") {
		t.Fatalf("collect with no Device: %v", err)
	}
}

func TestPublishUnpublish(t *testing.T) {
	e := newEnv(t, 10*size.GiB)
	p := e.pod("a")
	must(t, e.publish(p, func(r *inline.PublishRequest) { r.FsGroup = "3000" }))
	id := e.published(p)
	if sig, _ := devicetest.ReadSignature(e.pool.ImagePath(id)); sig == nil || sig.Type != "ext4" || sig.Group != 3000 {
		t.Fatalf("volume holds %+v, want ext4 owned by the pod's fsGroup", sig)
	}
	// kubelet's retry: done already.
	must(t, e.publish(p))
	if e.volumes() != 1 || e.dev.Calls(devicetest.Format) != 1 {
		t.Fatalf("a repeated publish made %d volumes, formatted %d times", e.volumes(), e.dev.Calls(devicetest.Format))
	}
	must(t, e.m.Unpublish(ctx, p.handle, p.target))
	e.gone(p, id)
	if left := e.dev.Leftovers(); len(left) != 0 {
		t.Fatalf("left: %v", left)
	}
	// Unpublish again, and of a handle never seen: done.
	must(t, e.m.Unpublish(ctx, p.handle, p.target))
	must(t, e.m.Unpublish(ctx, "csi-never", e.pod("never").target))
}

func TestPublishFailureLeavesNothing(t *testing.T) {
	for name, fail := range map[string]func(e *env){
		"format":  func(e *env) { e.dev.FailNext(devicetest.Format, errors.New("mkfs: boom")) },
		"mount":   func(e *env) { e.dev.FailNext(devicetest.Mount, errors.New("mount: boom")) },
		"fsGroup": func(e *env) { e.dev.FailNext(devicetest.SetGroup, errors.New("chown: boom")) },
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, 10*size.GiB)
			p := e.pod("a")
			fail(e)
			if err := e.publish(p, func(r *inline.PublishRequest) { r.FsGroup = "3000" }); err == nil {
				t.Fatal("publish succeeded")
			}
			if _, ok := e.m.VolumeID(p.handle); ok {
				t.Fatal("the volume of a failed publish was kept")
			}
			// The target directory the publish made may stay, empty and
			// unmounted: kubelet removes it with the pod.
			if m, _ := e.dev.MountedAt(p.target); m != nil {
				t.Fatalf("%s still mounted", p.target)
			}
			if ents, err := os.ReadDir(p.target); err == nil && len(ents) != 0 {
				t.Fatalf("target holds %v", ents)
			}
			if n := e.volumes(); n != 0 {
				t.Fatalf("%d volumes left", n)
			}
			if ents, _ := os.ReadDir(filepath.Join(e.poolDir, "volumes")); len(ents) != 0 {
				t.Fatalf("images left: %v", ents)
			}
			if left := e.dev.Leftovers(); len(left) != 0 {
				t.Fatalf("left: %v", left)
			}
			// kubelet's retry works.
			must(t, e.publish(p))
			e.published(p)
		})
	}
}

func TestInlineSharesThePoolsCapacity(t *testing.T) {
	e := newEnv(t, 1*size.GiB)
	_, err := e.pool.CreateVolume(ctx, pool.CreateRequest{Name: "pvc", SizeBytes: 961 * size.MiB, FsType: "ext4"})
	must(t, err)
	p := e.pod("a")
	err = e.publish(p)
	if !errors.Is(err, errkind.ErrNoSpace) {
		t.Fatalf("publish beyond the pool: %v", err)
	}
	e.gone(p, "")
	if e.volumes() != 1 {
		t.Fatal("a volume was recorded")
	}
}

// Collection removes inline volumes no pod uses any more, and only those.
func TestCollect(t *testing.T) {
	e := newEnv(t, 10*size.GiB)
	podGone, unmounted, live := e.pod("gone"), e.pod("unmounted"), e.pod("live")
	ids := map[*pod]string{}
	for _, p := range []*pod{podGone, unmounted, live} {
		must(t, e.publish(p))
		ids[p] = e.published(p)
	}
	// kubelet removed one pod's directory without unpublishing, and
	// unmounted another's target.
	must(t, os.RemoveAll(podGone.dir))
	must(t, e.dev.Unmount(unmounted.target))

	// A CSI call holds one volume's lock: collection waits for it.
	unlock := e.m.Locks.Lock(podGone.handle)
	done := make(chan error)
	go func() { done <- e.m.Collect(ctx) }()
	select {
	case err := <-done:
		t.Fatalf("collection ran past a volume's lock held by another call: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	unlock()
	must(t, <-done)
	e.gone(podGone, ids[podGone])
	e.gone(unmounted, ids[unmounted])
	if e.published(live) != ids[live] {
		t.Fatal("the live pod's volume changed")
	}
	must(t, e.m.Collect(ctx))
	e.published(live)
}

// A reboot takes every mount; at start the node restores the stages whose
// target is still there, and the collector removes the volumes of pods that
// went meanwhile.
func TestCollectAfterReboot(t *testing.T) {
	e := newEnv(t, 10*size.GiB)
	stays, goes := e.pod("stays"), e.pod("goes")
	must(t, e.publish(stays))
	must(t, e.publish(goes))
	staysID, goesID := e.published(stays), e.published(goes)
	e.dev.Reboot()
	must(t, os.RemoveAll(goes.dir))

	e.restart()
	must(t, e.node.Recover(ctx))
	must(t, e.pool.Recover(ctx))
	must(t, e.m.Collect(ctx))
	e.gone(goes, goesID)
	if e.published(stays) != staysID {
		t.Fatal("the surviving pod's volume changed")
	}
}

// A volume whose target lies outside --kubelet-dir is judged by its mount
// alone: a wrong flag must not make a live volume look dead.
func TestCollectOutsideKubeletDir(t *testing.T) {
	e := newEnv(t, 10*size.GiB)
	p := e.pod("a")
	e.m.KubeletDir = filepath.Join(t.TempDir(), "elsewhere")
	must(t, e.publish(p))
	id := e.published(p)
	must(t, e.m.Collect(ctx))
	if e.published(p) != id {
		t.Fatal("volume changed")
	}
}
