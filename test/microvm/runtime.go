// Package microvm is podvol's test runtime for direct-assigned volumes: it
// does with a volume what Kata Containers' runtime does, for real, with a
// QEMU microVM. It reads <direct-volumes>/<base64url(target)>/mountInfo.json
// (through internal/directvolume, the same file podvol wrote, located the way
// Kata's runtime locates it), records the sandbox id beside it, boots a guest
// with the volume's device as its virtio-blk disk, has the guest agent mount
// it with the fstype, options and fsGroup written there, and serves the
// shim's GET /direct-volume/stats and POST /direct-volume/resize on
// <sandboxes>/<id>/shim-monitor.sock by asking the guest (which refuses to
// resize, as Kata's agent does). Boot also starts a guest on a virtio-fs
// share, for bench/microvm. Nothing here is shipped.
package microvm

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/podvol/podvol/internal/directvolume"
	"github.com/podvol/podvol/test/microvm/agentapi"
	"github.com/podvol/podvol/test/microvm/guest"
)

// Runtime boots sandboxes for direct-assigned volumes.
type Runtime struct {
	Root      string // the direct-volumes directory (podvol's --kata-direct-volumes-dir)
	Sandboxes string // where sandboxes keep shim-monitor.sock (in podvol's --kata-sandbox-dirs)
	Guest     *guest.Guest
	Logf      func(format string, args ...any)
	MemoryMiB int
}

// Accel is the accelerator guests get: kvm when /dev/kvm can be opened and
// answers, tcg otherwise or once a guest failed to come up under kvm (see
// Boot).
func Accel() string {
	if kvmFailed.Load() {
		return "tcg"
	}
	return kvmAnswers()
}

// /dev/kvm can answer and still be unable to run a guest (nested
// virtualization here: "KVM internal error. Suberror: 1, emulation
// failure", after which QEMU pauses the guest for good): the first guest
// under kvm proves it, or sends every guest after it to tcg.
var kvmProven, kvmFailed atomic.Bool

func kvmAnswers() string {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return "tcg"
	}
	defer f.Close()
	const kvmGetAPIVersion = 0xAE00
	v, _, errno := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), kvmGetAPIVersion, 0)
	if errno != 0 || v != 12 {
		return "tcg"
	}
	return "kvm"
}

// hostTSCkHz is the host's CPU clock in kHz from /proc/cpuinfo.
func hostTSCkHz() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "cpu MHz" {
			if mhz, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil && mhz > 100 {
				return strconv.Itoa(int(mhz * 1000))
			}
		}
	}
	return "2000000"
}

// Probe starts QEMU's microvm machine paused and stops it: an error means
// QEMU cannot start here at all.
func Probe() error {
	cmd := exec.Command("qemu-system-x86_64", "-M", "microvm", "-accel", Accel(), "-nodefaults", "-no-user-config",
		"-display", "none", "-serial", "none", "-monitor", "none", "-S")
	out := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(done) }()
	select {
	case <-done:
		return fmt.Errorf("qemu-system-x86_64 -M microvm exited at once: %w: %s", waitErr, out)
	case <-time.After(time.Second):
		_ = cmd.Process.Kill()
		<-done // killed: its exit status says nothing
		return nil
	}
}

// Sandbox is one running microVM with one direct-assigned volume.
type Sandbox struct {
	ID      string
	Target  string
	Info    *directvolume.MountInfo
	Console string // the guest's serial console log
	Device  string // the volume's disk as the guest sees it
	Booted  time.Duration
	Uptime  string // the guest kernel's uptime when its agent was ready

	r          *Runtime
	cmd        *exec.Cmd
	exited     chan struct{}
	waitErr    error
	conn       net.Conn
	rd         *bufio.Reader
	mu         sync.Mutex // one request on the channel at a time
	srv        *http.Server
	dir        string
	askedMu    sync.Mutex
	statsAsked []string
	resizes    []ResizeRequest
}

// ResizeRequest is the body of the shim's POST /direct-volume/resize, as
// Kata's shim decodes it.
type ResizeRequest struct {
	VolumePath string
	Size       uint64
}

// Reply is the agent's answer.
type Reply = agentapi.Reply

// Start reads the mount information of the volume published at target,
// records sandbox id beside it, boots the guest with the device and has the
// agent mount it. The caller must Stop the sandbox.
func (r *Runtime) Start(ctx context.Context, target, id string) (*Sandbox, error) {
	info, err := directvolume.Read(r.Root, target)
	if err != nil {
		return nil, fmt.Errorf("no direct volume at %s: %w", target, err)
	}
	if info.VolumeType != "directvol" {
		return nil, fmt.Errorf("volume-type %q is not directvol", info.VolumeType)
	}
	if fi, err := os.Stat(info.Device); err != nil || fi.Mode()&os.ModeDevice == 0 {
		return nil, fmt.Errorf("device %q of %s is not a block device (%w)", info.Device, target, errors.Join(err, errors.New("not a device node")))
	}
	// Kata records the sandbox as an empty file named by its id.
	if err := os.WriteFile(filepath.Join(directvolume.Dir(r.Root, target), id), nil, 0o600); err != nil {
		return nil, err
	}
	s, err := r.Boot(ctx, id, Disk{Path: info.Device})
	if err != nil {
		return nil, err
	}
	s.Target, s.Info = target, info
	ok := false
	defer func() {
		if !ok {
			s.kill()
		}
	}()
	if info.FsType != "" {
		if err := s.Mount(ctx, agentapi.Request{FsType: info.FsType, Options: info.Options,
			FsGroup: info.Metadata[directvolume.MetaFsGroup], FsGroupChangePolicy: info.Metadata[directvolume.MetaFsGroupChangePolicy]}); err != nil {
			return nil, err
		}
	}
	if err := s.serveShim(); err != nil {
		return nil, err
	}
	ok = true
	return s, nil
}

// Disk is what the guest gets as its volume: a virtio-blk disk (Path, a
// block device or image) or, for comparison, a directory of the host shared
// by a running virtiofsd (VhostUserSocket, mounted in the guest by Tag).
type Disk struct {
	Path            string
	VhostUserSocket string
	Tag             string
}

// Boot starts a guest with disk and waits for its agent; it mounts nothing.
// The caller must Stop the sandbox.
func (r *Runtime) Boot(ctx context.Context, id string, disk Disk) (*Sandbox, error) {
	if Accel() == "kvm" && !kvmProven.Load() {
		// Under kvm a guest is up in about a second.
		s, err := r.boot(ctx, id, disk, "kvm", 20*time.Second)
		if err == nil {
			kvmProven.Store(true)
			return s, nil
		}
		// A cancelled test or a disk that is not there says nothing of kvm.
		if e := err.Error(); ctx.Err() != nil || !strings.Contains(e, "guest did not come up") && !strings.Contains(e, "KVM internal error") {
			return nil, err
		}
		msg := err.Error()
		if i := strings.IndexByte(msg, '\n'); i > 0 {
			msg = msg[:i]
		}
		r.logf("sandbox %s: no guest under kvm (%s), although /dev/kvm answers: tcg from now on", id, msg)
		kvmFailed.Store(true)
		if err := os.RemoveAll(filepath.Join(r.Sandboxes, id)); err != nil {
			return nil, err
		}
	}
	return r.boot(ctx, id, disk, Accel(), 90*time.Second)
}

// boot starts the guest under accel and waits up to ready for its agent.
func (r *Runtime) boot(ctx context.Context, id string, disk Disk, accel string, ready time.Duration) (*Sandbox, error) {
	s := &Sandbox{ID: id, r: r, dir: filepath.Join(r.Sandboxes, id), exited: make(chan struct{})}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return nil, err
	}
	s.Console = filepath.Join(s.dir, "console.log")
	ok := false
	defer func() {
		if !ok {
			s.kill()
		}
	}()
	lis, err := net.Listen("unix", filepath.Join(s.dir, "agent.sock"))
	if err != nil {
		return nil, err
	}
	defer func() { _ = lis.Close() }() // QEMU is connected or has failed by then
	mem := r.MemoryMiB
	if mem == 0 {
		mem = 256
	}
	// Under TCG the kernel's TSC calibration against the PIT fails when the
	// host is busy and the boot hangs: tell it the rate (TCG's TSC is the
	// host's).
	appendArgs := "console=ttyS0 panic=-1 quiet tsc=reliable tsc_early_khz=" + hostTSCkHz()
	machine := "microvm"
	var devices []string
	switch {
	case disk.Path != "":
		devices = []string{
			"-drive", "id=vol,file=" + disk.Path + ",format=raw,if=none,cache=none,aio=threads",
			"-device", "virtio-blk-device,drive=vol,serial=podvol-volume",
		}
	case disk.VhostUserSocket != "":
		// vhost-user needs the guest's memory shared with virtiofsd.
		machine += ",memory-backend=mem"
		devices = []string{
			"-object", fmt.Sprintf("memory-backend-memfd,id=mem,size=%dM,share=on", mem),
			"-chardev", "socket,id=vfs,path=" + disk.VhostUserSocket,
			"-device", "vhost-user-fs-device,chardev=vfs,tag=" + disk.Tag,
		}
		appendArgs += " " + agentapi.NoDisk
	default:
		return nil, errors.New("a sandbox needs a disk path or a virtiofsd socket")
	}
	args := append([]string{
		"-M", machine, "-accel", accel, "-m", fmt.Sprint(mem), "-smp", "1",
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		// Virtio 1.0 over MMIO, as Kata's and Firecracker's guests get:
		// QEMU's microvm defaults to the legacy interface, which
		// virtiofsd's vhost-user library refuses.
		"-global", "virtio-mmio.force-legacy=false",
		"-serial", "file:" + s.Console,
		"-kernel", r.Guest.Kernel, "-initrd", r.Guest.Initramfs,
		"-append", appendArgs,
	}, devices...)
	args = append(args,
		"-device", "virtio-serial-device,max_ports=2",
		"-chardev", "socket,id=agent,path="+filepath.Join(s.dir, "agent.sock"),
		"-device", "virtserialport,chardev=agent,name="+agentapi.PortName,
	)
	s.cmd = exec.Command("qemu-system-x86_64", args...)
	qlog, err := os.Create(filepath.Join(s.dir, "qemu.log"))
	if err != nil {
		return nil, err
	}
	defer qlog.Close()
	s.cmd.Stdout, s.cmd.Stderr = qlog, qlog
	begin := time.Now()
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start qemu: %w", err)
	}
	r.logf("sandbox %s: qemu pid %d, %s, disk %+v", id, s.cmd.Process.Pid, accel, disk)
	go func() { s.waitErr = s.cmd.Wait(); close(s.exited) }()

	// QEMU connects to the channel as it starts, before the guest runs.
	type accepted struct {
		c   net.Conn
		err error
	}
	ac := make(chan accepted, 1)
	go func() { c, err := lis.Accept(); ac <- accepted{c, err} }()
	select {
	case a := <-ac:
		if a.err != nil {
			return nil, a.err
		}
		s.conn = a.c
	case <-s.exited:
		return nil, fmt.Errorf("qemu exited: %w\n%s", s.waitErr, s.logs())
	case <-time.After(30 * time.Second):
		return nil, fmt.Errorf("qemu did not connect to the agent channel\n%s", s.logs())
	}
	s.rd = bufio.NewReader(s.conn)
	var up Reply
	if err := s.read(ctx, ready, &up); err != nil {
		return nil, fmt.Errorf("guest did not come up: %w\n%s", err, s.logs())
	}
	s.Device = up.Device
	s.Booted = time.Since(begin)
	s.Uptime = up.Uptime
	r.logf("sandbox %s: guest agent ready after %v (guest uptime %s; disk %s)", id, s.Booted.Round(time.Millisecond), up.Uptime, s.Device)
	ok = true
	return s, nil
}

// Mount has the agent mount the volume (req.Op is set here).
func (s *Sandbox) Mount(ctx context.Context, req agentapi.Request) error {
	req.Op = agentapi.OpMount
	rep, err := s.Call(ctx, req)
	if err != nil {
		return err
	}
	if rep.Error != "" {
		return fmt.Errorf("guest mount: %s\n%s", rep.Error, s.logs())
	}
	return nil
}

func (r *Runtime) logf(format string, a ...any) {
	if r.Logf != nil {
		r.Logf(format, a...)
	}
}

func (s *Sandbox) logs() string {
	c, _ := os.ReadFile(s.Console)
	q, _ := os.ReadFile(filepath.Join(s.dir, "qemu.log"))
	return fmt.Sprintf("--- guest console ---\n%s\n--- qemu ---\n%s", c, q)
}

// Logs is the guest's console and QEMU's output so far.
func (s *Sandbox) Logs() string { return s.logs() }

func (s *Sandbox) read(ctx context.Context, d time.Duration, v any) error {
	deadline := time.Now().Add(d)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	_ = s.conn.SetReadDeadline(deadline)
	line, err := s.rd.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("read the agent channel: %w", err)
	}
	return json.Unmarshal(line, v)
}

// Call sends one request to the guest agent and returns its answer.
func (s *Sandbox) Call(ctx context.Context, req agentapi.Request) (*Reply, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, _ := json.Marshal(req)
	_ = s.conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, err := s.conn.Write(append(b, '\n')); err != nil {
		return nil, fmt.Errorf("send %s to the agent: %w", req.Op, err)
	}
	rep := &Reply{}
	if err := s.read(ctx, 5*time.Minute, rep); err != nil {
		return nil, fmt.Errorf("%s: %w\n%s", req.Op, err, s.logs())
	}
	return rep, nil
}

// Exec runs a shell script in the guest as uid:gid with supplementary groups,
// in the volume's mount.
func (s *Sandbox) Exec(ctx context.Context, uid, gid uint32, groups []uint32, script string) (string, error) {
	rep, err := s.Call(ctx, agentapi.Request{Op: agentapi.OpExec, UID: uid, GID: gid, Groups: groups, Cmd: script})
	if err != nil {
		return "", err
	}
	if rep.Error != "" || rep.Exit != 0 {
		return rep.Output, fmt.Errorf("guest workload exited %d %s: %s", rep.Exit, rep.Error, rep.Output)
	}
	return rep.Output, nil
}

// Stats is statfs of the volume's mount in the guest.
func (s *Sandbox) Stats(ctx context.Context) (*Reply, error) {
	rep, err := s.Call(ctx, agentapi.Request{Op: agentapi.OpStats})
	if err != nil {
		return nil, err
	}
	if rep.Error != "" {
		return nil, errors.New(rep.Error)
	}
	return rep, nil
}

// serveShim answers the shim's direct-volume endpoints, as Kata's shim does,
// on <sandboxes>/<id>/shim-monitor.sock.
func (s *Sandbox) serveShim() error {
	lis, err := net.Listen("unix", filepath.Join(s.dir, "shim-monitor.sock"))
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /direct-volume/stats", func(w http.ResponseWriter, req *http.Request) {
		path := req.URL.Query().Get("path")
		s.askedMu.Lock()
		s.statsAsked = append(s.statsAsked, path)
		s.askedMu.Unlock()
		if path != s.Info.Device {
			http.Error(w, fmt.Sprintf("no volume %q in sandbox %s", path, s.ID), http.StatusNotFound)
			return
		}
		st, err := s.Stats(req.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_ = json.NewEncoder(w).Encode(directvolume.Stats{
			Usage: []directvolume.Usage{
				{Available: st.Available, Total: st.Total, Used: st.Used, Unit: 1},
				{Available: st.InodesFree, Total: st.Inodes, Used: st.InodesUsed, Unit: 2},
			},
			Condition: &directvolume.Condition{Message: "OK"},
		})
	})
	// Kata's shim answers a failure of any step with 500 and the error's
	// text: a body it cannot decode, a volume the sandbox does not have, or
	// the agent's answer, which for a direct volume is a refusal.
	mux.HandleFunc("POST /direct-volume/resize", func(w http.ResponseWriter, req *http.Request) {
		var rr ResizeRequest
		if err := json.NewDecoder(io.LimitReader(req.Body, 1<<20)).Decode(&rr); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		s.askedMu.Lock()
		s.resizes = append(s.resizes, rr)
		s.askedMu.Unlock()
		if rr.VolumePath != s.Info.Device {
			http.Error(w, fmt.Sprintf("mount %s not found in sandbox %s", rr.VolumePath, s.ID), http.StatusInternalServerError)
			return
		}
		rep, err := s.Call(req.Context(), agentapi.Request{Op: agentapi.OpResize, Size: int64(min(rr.Size, math.MaxInt64))})
		if err == nil && rep.Error != "" {
			err = errors.New(rep.Error)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
	})
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(lis) }()
	return nil
}

// Stop has the agent unmount the volume, sync and power off, and waits for
// QEMU to exit (killed by its PID if it does not).
func (s *Sandbox) Stop(ctx context.Context) error {
	if s.srv != nil {
		_ = s.srv.Close()
	}
	var err error
	select {
	case <-s.exited:
		err = fmt.Errorf("qemu had already exited: %w", s.waitErr)
	default:
		var rep *Reply
		rep, err = s.Call(ctx, agentapi.Request{Op: agentapi.OpShutdown})
		if err == nil && rep.Error != "" {
			err = fmt.Errorf("guest shutdown: %s", rep.Error)
		}
		if err == nil {
			select {
			case <-s.exited:
				if s.waitErr != nil {
					err = fmt.Errorf("qemu: %w", s.waitErr)
				}
			case <-time.After(60 * time.Second):
				err = fmt.Errorf("the guest did not power off within 60s\n%s", s.logs())
			}
		}
	}
	s.kill()
	if c, rerr := os.ReadFile(s.Console); rerr == nil {
		for _, l := range strings.Split(string(c), "\n") {
			if strings.Contains(l, "podvol-agent:") {
				s.r.logf("sandbox %s console: %s", s.ID, strings.TrimSpace(l))
			}
		}
	}
	return err
}

// kill ends QEMU by its PID and releases the sandbox's sockets.
func (s *Sandbox) kill() {
	if s.srv != nil {
		_ = s.srv.Close()
	}
	if s.conn != nil {
		_ = s.conn.Close()
	}
	if s.cmd != nil && s.cmd.Process != nil {
		select {
		case <-s.exited:
		default:
			_ = s.cmd.Process.Kill()
			<-s.exited
		}
	}
	_ = os.Remove(filepath.Join(s.dir, "shim-monitor.sock"))
	_ = os.Remove(filepath.Join(s.dir, "agent.sock"))
}

// StatsAsked lists the paths the shim's stats endpoint was asked for.
func (s *Sandbox) StatsAsked() []string {
	s.askedMu.Lock()
	defer s.askedMu.Unlock()
	return slices.Clone(s.statsAsked)
}

// Resizes lists the resize requests the shim received.
func (s *Sandbox) Resizes() []ResizeRequest {
	s.askedMu.Lock()
	defer s.askedMu.Unlock()
	return slices.Clone(s.resizes)
}

// Running reports whether QEMU is still running.
func (s *Sandbox) Running() bool {
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}
