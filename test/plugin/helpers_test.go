package plugin_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/podvol/podvol/test/plugintest"
)

const node = "node-1"

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

func mountCap(fs string, mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fs}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

func blockCap() *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

var rwo = mountCap("", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)

// env is one plugin with its test directory, staging and target parents.
type env struct {
	t   *testing.T
	dir string
	p   *plugintest.Plugin
}

func newEnv(t *testing.T, o plugintest.Options) *env {
	plugintest.RequireRoot(t)
	o.Dir = plugintest.TempDir(t)
	o.NodeID = node
	switch o.PoolDir {
	case "xfs":
		o.PoolDir = plugintest.XFSPool(t, o.Dir, 8<<30)
	case "ext4":
		// A pool without reflink, whatever the test directory's
		// filesystem is.
		o.PoolDir = plugintest.FilesystemPool(t, o.Dir, "ext4", 1<<30)
	}
	return start(t, o)
}

func start(t *testing.T, o plugintest.Options) *env {
	e := &env{t: t, dir: o.Dir, p: plugintest.Start(t, o)}
	for _, d := range []string{"staging", "pods"} {
		if err := os.MkdirAll(filepath.Join(o.Dir, d), 0o750); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// newEnvArgs is newEnv with plugin arguments that depend on the test
// directory.
func newEnvArgs(t *testing.T, args func(dir string) []string) *env {
	plugintest.RequireRoot(t)
	dir := plugintest.TempDir(t)
	return start(t, plugintest.Options{Dir: dir, NodeID: node, Args: args(dir)})
}

func (e *env) staging(id string) string { return filepath.Join(e.dir, "staging", id) }
func (e *env) target(id string) string  { return filepath.Join(e.dir, "pods", id+"-mount") }

func (e *env) create(name string, size int64, c *csi.VolumeCapability, params map[string]string) *csi.Volume {
	e.t.Helper()
	r, err := e.p.Controller().CreateVolume(ctx(e.t), &csi.CreateVolumeRequest{
		Name:               name,
		CapacityRange:      &csi.CapacityRange{RequiredBytes: size},
		VolumeCapabilities: []*csi.VolumeCapability{c},
		Parameters:         params,
	})
	if err != nil {
		e.t.Fatalf("CreateVolume %s: %v", name, err)
	}
	return r.GetVolume()
}

func (e *env) stage(id string, c *csi.VolumeCapability) error {
	_, err := e.p.Node().NodeStageVolume(ctx(e.t), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: e.staging(id), VolumeCapability: c})
	return err
}

func (e *env) publish(id string, c *csi.VolumeCapability) error {
	_, err := e.p.Node().NodePublishVolume(ctx(e.t), &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: e.staging(id), TargetPath: e.target(id), VolumeCapability: c})
	return err
}

func (e *env) unpublish(id string) error {
	_, err := e.p.Node().NodeUnpublishVolume(ctx(e.t), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: e.target(id)})
	return err
}

func (e *env) unstage(id string) error {
	_, err := e.p.Node().NodeUnstageVolume(ctx(e.t), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: e.staging(id)})
	return err
}

func (e *env) delete(id string) error {
	_, err := e.p.Controller().DeleteVolume(ctx(e.t), &csi.DeleteVolumeRequest{VolumeId: id})
	return err
}

func (e *env) must(what string, err error) {
	e.t.Helper()
	if err != nil {
		e.t.Fatalf("%s: %v\nplugin log:\n%s", what, err, e.p.Log())
	}
}

// up stages and publishes a filesystem volume.
func (e *env) up(id string, c *csi.VolumeCapability) {
	e.t.Helper()
	e.must("NodeStageVolume", e.stage(id, c))
	e.must("NodePublishVolume", e.publish(id, c))
}

// down unpublishes, unstages and deletes.
func (e *env) down(id string) {
	e.t.Helper()
	e.must("NodeUnpublishVolume", e.unpublish(id))
	e.must("NodeUnstageVolume", e.unstage(id))
	e.must("DeleteVolume", e.delete(id))
}

func (e *env) volumeIDs() []string {
	e.t.Helper()
	r, err := e.p.Controller().ListVolumes(ctx(e.t), &csi.ListVolumesRequest{})
	e.must("ListVolumes", err)
	var ids []string
	for _, en := range r.GetEntries() {
		ids = append(ids, en.GetVolume().GetVolumeId())
	}
	return ids
}

// images lists the files in the pool's image directory.
func (e *env) images() []string {
	ents, _ := os.ReadDir(filepath.Join(e.p.PoolDir, "volumes"))
	var out []string
	for _, en := range ents {
		out = append(out, en.Name())
	}
	return out
}

// assertClean fails unless no loop device or mount of the test remains
// (besides an XFS or ext4 pool's own, and a ramfs pool's mount).
func (e *env) assertClean() {
	e.t.Helper()
	loops, mounts := plugintest.Leftovers(e.dir)
	pools := []string{filepath.Join(e.dir, "xfs-pool"), filepath.Join(e.dir, "ext4-pool"), filepath.Join(e.dir, "ramfs-pool")}
	loops = slices.DeleteFunc(loops, func(l string) bool {
		return strings.HasSuffix(l, "/xfs-pool.img)") || strings.HasSuffix(l, "/ext4-pool.img)")
	})
	mounts = slices.DeleteFunc(mounts, func(m string) bool { return slices.Contains(pools, m) })
	if len(loops)+len(mounts) > 0 {
		e.t.Fatalf("leftovers: loop devices %v, mounts %v", loops, mounts)
	}
}

func wantCode(t *testing.T, what string, err error, code codes.Code) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("%s: got %v, want code %s", what, err, code)
	}
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	f, _ := os.Open(path)
	_ = f.Sync()
	f.Close()
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// asPodUser runs a shell command as a non-root pod user (uid 1000) whose only
// group is the fsGroup 2000, in volume (bind-mounted, as a container runtime
// does, at a path the user can reach), and fails the test if it fails.
func asPodUser(t *testing.T, volume, command string) {
	t.Helper()
	mnt, err := os.MkdirTemp("", "podvol-pod-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(mnt)
	if err := os.Chmod(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "--bind", volume, mnt).CombinedOutput(); err != nil {
		t.Fatalf("bind %s: %v: %s", volume, err, out)
	}
	defer func() { _ = unix.Unmount(mnt, 0) }()
	cmd := exec.Command("setpriv", "--reuid", "1000", "--regid", "2000", "--clear-groups", "--", "sh", "-c", command)
	cmd.Dir = mnt
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("as uid 1000 gid 2000 in %s: %s: %v: %s", volume, command, err, out)
	}
}
