// Package plugintest runs the real podvol-plugin binary for tests: built once
// per test binary, started as its own process on a unix socket, stopped by PID,
// and checked afterwards for anything it left on the machine.
package plugintest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/moby/sys/mountinfo"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/podvol/podvol/internal/device"
)

var (
	buildOnce sync.Once
	binary    string
	buildErr  error
)

// Binary builds podvol-plugin (once per test process) and returns its path.
func Binary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "podvol-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binary = filepath.Join(dir, "podvol-plugin")
		cmd := exec.Command("go", "build", "-o", binary, "github.com/podvol/podvol/cmd/podvol-plugin")
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build podvol-plugin: %w\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binary
}

// RequireRoot skips nothing: podvol's tests need loop devices and mounts, and
// a run without them must fail loudly rather than pass hollow.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("these tests attach loop devices and mount filesystems: run them as root (make test does)")
	}
}

// Options configures one plugin process.
type Options struct {
	Dir     string // test directory: pool, socket and logs go below it
	PoolDir string // default: Dir/pool
	NodeID  string
	// Capacity is the pool's --capacity, given with --force-capacity: the
	// tests count promises, they do not write them, and their directory's
	// filesystem holds less. "" is 200Gi; RoomCapacity gives none, so that
	// the plugin takes what the pool's filesystem can give.
	Capacity string
	Env      []string // e.g. PODVOL_FAILPOINTS=...
	Args     []string // "{dir}" in an argument stands for Dir
}

// RoomCapacity, as Options.Capacity, starts the plugin without --capacity.
const RoomCapacity = "room"

// Plugin is a running podvol-plugin.
type Plugin struct {
	t        testing.TB
	opts     Options
	cmd      *exec.Cmd
	waitDone chan struct{}
	log      *syncBuffer
	Endpoint string
	Socket   string
	PoolDir  string
	conn     *grpc.ClientConn
}

// Start starts the plugin and waits until it answers Probe.
func Start(t testing.TB, o Options) *Plugin {
	t.Helper()
	if o.NodeID == "" {
		o.NodeID = "node-1"
	}
	if o.Capacity == "" {
		o.Capacity = "200Gi"
	}
	if o.PoolDir == "" {
		o.PoolDir = filepath.Join(o.Dir, "pool")
	}
	p := &Plugin{t: t, opts: o, PoolDir: o.PoolDir, Socket: filepath.Join(o.Dir, "csi.sock")}
	p.Endpoint = "unix://" + p.Socket
	p.start()
	return p
}

func (p *Plugin) start() {
	t := p.t
	t.Helper()
	args := []string{"--endpoint", p.Endpoint, "--node-id", p.opts.NodeID, "--pool-dir", p.PoolDir, "-v=2"}
	if p.opts.Capacity != RoomCapacity {
		args = append(args, "--capacity", p.opts.Capacity, "--force-capacity")
	}
	for _, a := range p.opts.Args {
		args = append(args, strings.ReplaceAll(a, "{dir}", p.opts.Dir))
	}
	p.cmd = exec.Command(Binary(t), args...)
	p.cmd.Env = append(os.Environ(), p.opts.Env...)
	p.log = &syncBuffer{}
	p.cmd.Stdout = p.log
	p.cmd.Stderr = p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start podvol-plugin: %v", err)
	}
	p.waitDone = make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(p.waitDone) }()
	t.Cleanup(p.Stop)

	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-p.waitDone:
			t.Fatalf("podvol-plugin exited during start-up:\n%s", p.log.String())
		default:
		}
		if _, err := os.Stat(p.Socket); err == nil {
			if _, err := p.Identity().Probe(context.Background(), &csi.ProbeRequest{}); err == nil {
				return
			}
			// A socket left by the previous process refuses the dial;
			// redial rather than wait out gRPC's reconnect backoff.
			_ = p.conn.Close() // redialled below whatever the close says
			p.conn = nil
		}
		if time.Now().After(deadline) {
			t.Fatalf("podvol-plugin did not answer Probe within 30s:\n%s", p.log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// syncBuffer collects the plugin's output while tests read it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Conn is a gRPC connection to the plugin (re-dialled after a restart).
func (p *Plugin) Conn() *grpc.ClientConn {
	if p.conn == nil {
		c, err := grpc.NewClient("unix://"+p.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			p.t.Fatalf("dial plugin: %v", err)
		}
		p.conn = c
	}
	return p.conn
}

func (p *Plugin) Identity() csi.IdentityClient     { return csi.NewIdentityClient(p.Conn()) }
func (p *Plugin) Controller() csi.ControllerClient { return csi.NewControllerClient(p.Conn()) }
func (p *Plugin) Node() csi.NodeClient             { return csi.NewNodeClient(p.Conn()) }

// PID is the process id of the running plugin (benchmarks read its memory
// from /proc).
func (p *Plugin) PID() int { return p.cmd.Process.Pid }

// Log is what the plugin printed so far.
func (p *Plugin) Log() string { return p.log.String() }

// Exited reports whether the process has ended (e.g. at a failpoint).
func (p *Plugin) Exited() bool {
	select {
	case <-p.waitDone:
		return true
	default:
		return false
	}
}

// WaitExit waits for the process to end by itself, as at a failpoint.
func (p *Plugin) WaitExit(d time.Duration) bool {
	select {
	case <-p.waitDone:
		return true
	case <-time.After(d):
		return false
	}
}

// Kill sends SIGKILL to the plugin's PID and waits for it.
func (p *Plugin) Kill() {
	if p.conn != nil {
		_ = p.conn.Close() // dropped either way: nothing to do about a failed close
		p.conn = nil
	}
	if !p.Exited() {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
	}
	<-p.waitDone
}

// Stop ends the plugin gracefully (SIGTERM, then SIGKILL after 10s).
func (p *Plugin) Stop() {
	if p.conn != nil {
		_ = p.conn.Close() // dropped either way: nothing to do about a failed close
		p.conn = nil
	}
	if p.Exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.waitDone:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.waitDone
	}
}

// Restart starts the plugin again with the same pool, with env replaced.
func (p *Plugin) Restart(env ...string) {
	p.Kill()
	p.opts.Env = env
	p.start()
}

// Upgrade stops the plugin gracefully and starts it again on the same pool
// with args in place of its arguments, as a new version or a changed
// DaemonSet would.
func (p *Plugin) Upgrade(args ...string) {
	p.Stop()
	p.opts.Args = args
	p.start()
}

// Leftovers lists loop devices backed by files below dir and mounts below dir.
// A loop device counts when the kernel reports its backing file below dir or
// when it was attached under a name below dir: the kernel reports the file
// as a path in the reader's mount namespace, and a file attached through a
// mount that is gone from every namespace (a test's private namespace that
// ended) is reported relative to that mount, e.g. "/volumes/pv-….img
// (deleted)", which no prefix of dir matches.
func Leftovers(dir string) (loops, mounts []string) {
	ents, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, e := range ents {
		b, err := os.ReadFile(e)
		if err != nil {
			continue
		}
		dev := "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(e)))
		f := strings.TrimSpace(string(b))
		if strings.HasPrefix(f, dir+"/") || strings.HasPrefix(device.LoopTag(dev), dir+"/") {
			loops = append(loops, dev+" ("+f+")")
		}
	}
	ms, _ := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	for _, m := range ms {
		mounts = append(mounts, m.Mountpoint)
	}
	return loops, mounts
}

// TempDir returns a test directory that is checked for leftovers and cleaned
// of them when the test ends: a leak fails the test, then is undone so that
// the machine is left as it was.
func TempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "podvol-test-")
	if err != nil {
		t.Fatal(err)
	}
	dir, _ = filepath.EvalSymlinks(dir)
	t.Cleanup(func() {
		loops, mounts := Leftovers(dir)
		if len(loops)+len(mounts) > 0 {
			t.Errorf("left behind: loop devices %v, mounts %v", loops, mounts)
		}
		ForceClean(dir)
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove test dir: %v", err)
		}
	})
	return dir
}

// ForceClean unmounts everything below dir and detaches loop devices backed
// by files below it. A loop device can keep a filesystem busy and a mount can
// hold a loop device, so it goes round until nothing is left.
func ForceClean(dir string) {
	for i := 0; i < 5; i++ {
		loops, mounts := Leftovers(dir)
		if len(loops)+len(mounts) == 0 {
			return
		}
		for j := len(mounts) - 1; j >= 0; j-- {
			if syscall.Unmount(mounts[j], 0) != nil {
				_ = syscall.Unmount(mounts[j], syscall.MNT_DETACH)
			}
		}
		for _, l := range loops {
			dev := strings.Fields(l)[0]
			if f, err := os.Open(dev); err == nil {
				_, _, _ = syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), 0x4C01, 0) // LOOP_CLR_FD
				f.Close()
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// RunOnce runs the plugin binary to completion (for start-up refusals) and
// returns its output.
func RunOnce(t testing.TB, args ...string) (string, error) {
	t.Helper()
	bin := Binary(t) // built first: the build is not the run's to time
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	return string(out), err
}

// XFSPool makes an XFS filesystem (with reflink, as mkfs.xfs makes it by
// default) on a sparse image of size bytes below dir, mounts it and returns
// the mount point, for tests of constant-time copies. It is unmounted and
// detached when the test ends.
func XFSPool(t testing.TB, dir string, size int64) string {
	t.Helper()
	return FilesystemPool(t, dir, "xfs", size)
}

// FilesystemPool makes a filesystem of fsType (xfs, with reflink, or ext4)
// of size bytes on a loop device and mounts it at dir/<fsType>-pool, for a
// pool of its own; the test's cleanup takes it down.
func FilesystemPool(t testing.TB, dir, fsType string, size int64) string {
	t.Helper()
	img := filepath.Join(dir, fsType+"-pool.img")
	mnt := filepath.Join(dir, fsType+"-pool")
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	out, err := exec.Command("losetup", "--find", "--show", img).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup: %v: %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		// Loop devices of volumes in the pool keep it busy: they go first.
		ForceClean(mnt)
		_ = syscall.Unmount(mnt, 0)
		_ = exec.Command("losetup", "-d", dev).Run()
	})
	mkfs := map[string][]string{"xfs": {"mkfs.xfs", "-q", "-f", "-m", "reflink=1"}, "ext4": {"mkfs.ext4", "-q", "-F"}}[fsType]
	if mkfs == nil {
		t.Fatalf("no pool filesystem %q: want xfs or ext4", fsType)
	}
	if out, err := exec.Command(mkfs[0], append(mkfs[1:], dev)...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", mkfs[0], err, out)
	}
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", dev, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount: %v: %s", err, out)
	}
	return mnt
}

// MountedAt reports whether path is a mount point.
func MountedAt(path string) bool {
	ms, _ := mountinfo.GetMounts(mountinfo.SingleEntryFilter(path))
	return len(ms) > 0
}
