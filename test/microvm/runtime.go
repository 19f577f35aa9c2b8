// Package microvm is podvol's test runtime for direct-assigned volumes: it
// does with a volume what Kata Containers' runtime does, for real, with a
// QEMU microVM. It reads <direct-volumes>/<base64url(target)>/mountInfo.json
// (through internal/directvolume, the same file podvol wrote, located the way
// Kata's runtime locates it), records the sandbox id beside it, boots a guest
// with the volume's device as its virtio-blk disk, has the guest agent mount
// it with the fstype, options and fsGroup written there, and serves the
// shim's GET /direct-volume/stats on <sandboxes>/<id>/shim-monitor.sock by
// asking the guest. Nothing here is shipped.
package microvm

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
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

// Accel is kvm when /dev/kvm can be opened and answers, tcg otherwise.
func Accel() string {
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
	s := &Sandbox{ID: id, Target: target, Info: info, r: r, dir: filepath.Join(r.Sandboxes, id), exited: make(chan struct{})}
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
	args := []string{
		"-M", "microvm", "-accel", Accel(), "-m", fmt.Sprint(mem), "-smp", "1",
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		"-serial", "file:" + s.Console,
		"-kernel", r.Guest.Kernel, "-initrd", r.Guest.Initramfs,
		// Under TCG the kernel's TSC calibration against the PIT fails
		// when the host is busy and the boot hangs: tell it the rate (TCG's
		// TSC is the host's).
		"-append", "console=ttyS0 panic=-1 quiet tsc=reliable tsc_early_khz=" + hostTSCkHz(),
		"-drive", "id=vol,file=" + info.Device + ",format=raw,if=none,cache=none,aio=threads",
		"-device", "virtio-blk-device,drive=vol,serial=podvol-volume",
		"-device", "virtio-serial-device,max_ports=2",
		"-chardev", "socket,id=agent,path=" + filepath.Join(s.dir, "agent.sock"),
		"-device", "virtserialport,chardev=agent,name=" + agentapi.PortName,
	}
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
	r.logf("sandbox %s: qemu pid %d, %s, device %s", id, s.cmd.Process.Pid, Accel(), info.Device)
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
	var ready Reply
	if err := s.read(ctx, 90*time.Second, &ready); err != nil {
		return nil, fmt.Errorf("guest did not come up: %w\n%s", err, s.logs())
	}
	s.Device = ready.Device
	s.Booted = time.Since(begin)
	r.logf("sandbox %s: guest agent ready after %v (guest uptime %s; disk %s)", id, s.Booted.Round(time.Millisecond), ready.Uptime, s.Device)

	if info.FsType != "" {
		rep, err := s.Call(ctx, agentapi.Request{Op: agentapi.OpMount, FsType: info.FsType, Options: info.Options,
			FsGroup: info.Metadata[directvolume.MetaFsGroup], FsGroupChangePolicy: info.Metadata[directvolume.MetaFsGroupChangePolicy]})
		if err != nil {
			return nil, err
		}
		if rep.Error != "" {
			return nil, fmt.Errorf("guest mount: %s\n%s", rep.Error, s.logs())
		}
	}
	if err := s.serveShim(); err != nil {
		return nil, err
	}
	ok = true
	return s, nil
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
	mux.HandleFunc("POST /direct-volume/resize", func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "resize not implemented by the agent", http.StatusInternalServerError)
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

// Running reports whether QEMU is still running.
func (s *Sandbox) Running() bool {
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}
