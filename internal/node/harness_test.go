package node_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/podvol/podvol/internal/device/devicetest"
	"github.com/podvol/podvol/internal/directvolume"
	"github.com/podvol/podvol/internal/node"
	"github.com/podvol/podvol/internal/pool"
	"github.com/podvol/podvol/internal/size"
	"github.com/podvol/podvol/internal/store"
)

var ctx = context.Background()

// env is one node: a pool in a temporary directory, a Node on the fake
// machine, and a kubelet-like directory for staging and target paths.
type env struct {
	t       *testing.T
	dev     *devicetest.Fake
	poolDir string
	kubelet string
	shim    *directvolume.Shim
	pool    *pool.Pool
	node    *node.Node
}

func newEnv(t *testing.T) *env {
	t.Helper()
	dir, err := filepath.EvalSymlinks(t.TempDir())
	must(t, err)
	e := &env{t: t, dev: devicetest.New(), poolDir: filepath.Join(dir, "pool"), kubelet: filepath.Join(dir, "kubelet")}
	e.shim = &directvolume.Shim{Root: filepath.Join(dir, "direct-volumes")}
	must(t, os.MkdirAll(filepath.Join(e.kubelet, "pods"), 0o750))
	e.open()
	t.Cleanup(func() {
		if err := e.pool.Close(); err != nil {
			t.Error(err)
		}
	})
	return e
}

func (e *env) open() {
	e.t.Helper()
	p, err := pool.Open(pool.Config{Dir: e.poolDir, Capacity: 100 * size.GiB, Device: e.dev})
	must(e.t, err)
	e.pool, e.node = p, node.New(p, e.shim, e.dev)
}

// restart plays a plugin restart: a new pool and node on the same
// directory and the same machine (whose kernel state survives).
func (e *env) restart() {
	e.t.Helper()
	must(e.t, e.pool.Close())
	e.open()
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func wantErr(t *testing.T, err, kind error, what string) {
	t.Helper()
	if !errors.Is(err, kind) {
		t.Fatalf("%s: %v, want %v", what, err, kind)
	}
}

func random() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (e *env) create(fsType string, size int64) *store.Volume {
	e.t.Helper()
	v, err := e.pool.CreateVolume(ctx, pool.CreateRequest{Name: "pvc-" + random(), SizeBytes: size, FsType: fsType})
	must(e.t, err)
	return v
}

// volume is a volume with the paths kubelet would give it.
type volume struct {
	*store.Volume
	staging, target string
}

func (e *env) volume(fsType string) *volume {
	e.t.Helper()
	v := e.create(fsType, 512*size.MiB)
	return &volume{Volume: v, staging: e.stagingPath(v.ID), target: e.targetPath()}
}

func (e *env) stagingPath(id string) string {
	return filepath.Join(e.kubelet, "plugins", "podvol.io", id, "globalmount")
}

// targetPath is a new pod's target; its parent exists, as kubelet makes it.
func (e *env) targetPath() string {
	e.t.Helper()
	dir := filepath.Join(e.kubelet, "pods", random(), "volumes")
	must(e.t, os.MkdirAll(dir, 0o750))
	return filepath.Join(dir, "mount")
}

func (e *env) stage(v *volume) string {
	e.t.Helper()
	must(e.t, e.node.Stage(ctx, node.StageRequest{VolumeID: v.ID, StagingPath: v.staging}))
	return e.device(v)
}

func (e *env) publish(v *volume, target string, mod ...func(*node.PublishRequest)) error {
	r := node.PublishRequest{VolumeID: v.ID, StagingPath: v.staging, TargetPath: target}
	for _, m := range mod {
		m(&r)
	}
	return e.node.Publish(ctx, r)
}

func exclusive(r *node.PublishRequest) { r.Exclusive = true }
func direct(r *node.PublishRequest)    { r.Direct, r.Exclusive = true, true }

func (e *env) record(id string) *store.Volume {
	e.t.Helper()
	v, err := e.pool.Store().Volume(id)
	must(e.t, err)
	return v
}

// device is the loop device the store records for a staged volume.
func (e *env) device(v *volume) string {
	e.t.Helper()
	r := e.record(v.ID)
	if r.Stage == nil || r.Stage.Device == "" {
		e.t.Fatalf("volume %s has no stage record: %+v", v.ID, r.Stage)
	}
	return r.Stage.Device
}

// mountedFrom fails unless path is the root of a mount of dev's filesystem.
func (e *env) mountedFrom(path, dev string) {
	e.t.Helper()
	if err := e.dev.MountedFrom(path, dev); err != nil {
		e.t.Fatalf("%s: %v", path, err)
	}
}

func (e *env) notMounted(path string) {
	e.t.Helper()
	if m, _ := e.dev.MountedAt(path); m != nil {
		e.t.Fatalf("%s has %s mounted", path, m.Source)
	}
}

// mountsAt counts the stacked mounts at path.
func (e *env) mountsAt(path string) int {
	n := 0
	for _, m := range e.dev.MountTable() {
		if m.Target == path {
			n++
		}
	}
	return n
}

func (e *env) clean() {
	e.t.Helper()
	if left := e.dev.Leftovers(); len(left) != 0 {
		e.t.Fatalf("left behind: %v", left)
	}
}

func stageBlock(v *volume) node.StageRequest {
	return node.StageRequest{VolumeID: v.ID, StagingPath: v.staging, Block: true}
}
