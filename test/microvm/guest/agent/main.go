// Command agent is the /init of podvol's test microVM: a stand-in for Kata's
// guest agent, reduced to what a direct-assigned volume needs. It loads the
// kernel modules the initramfs carries, finds the volume's virtio-blk disk
// and its channel (a virtio-serial port named podvol.agent), and answers the
// test runtime's requests there, one JSON object a line:
//
//	{"op":"mount","fstype":..,"options":[..],"fsGroup":"2000","fsGroupChangePolicy":..}
//	{"op":"exec","uid":1000,"gid":1000,"groups":[2000],"cmd":"shell script"}
//	{"op":"stats"}
//	{"op":"resize","size":N}   refused, as Kata's agent does
//	{"op":"shutdown"}   unmount, sync, power off
//
// With podvol.nodisk on the kernel command line it waits for no disk: the
// volume is then a virtio-fs share ({"op":"mount","fstype":"virtiofs","source":tag}).
//
// Built static (CGO_ENABLED=0); it is never shipped.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/podvol/podvol/test/microvm/agentapi"
)

func logf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "podvol-agent: "+format+"\n", a...)
}

func main() {
	if err := run(); err != nil {
		logf("FATAL: %v", err)
	}
	powerOff()
}

func powerOff() {
	unix.Sync()
	logf("power off")
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	// Should the machine not power off, the runtime runs QEMU with
	// -no-reboot: a restart ends it too.
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART)
	select {}
}

func run() error {
	start := time.Now()
	for _, m := range []struct{ src, dst, fs string }{
		{"devtmpfs", "/dev", "devtmpfs"}, {"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"}, {"tmpfs", "/run", "tmpfs"}, {"tmpfs", "/tmp", "tmpfs"},
	} {
		_ = os.MkdirAll(m.dst, 0o755)
		if err := unix.Mount(m.src, m.dst, m.fs, 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount %s: %w", m.dst, err)
		}
	}
	up, _ := os.ReadFile("/proc/uptime")
	logf("started at uptime %s", strings.Fields(string(up) + " ?")[0])
	if err := loadModules("/lib/modules/load"); err != nil {
		return err
	}
	logf("modules loaded in %v", time.Since(start).Round(time.Millisecond))
	port, err := waitPort(10 * time.Second)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(port, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	dev := ""
	if cmdline, _ := os.ReadFile("/proc/cmdline"); !slices.Contains(strings.Fields(string(cmdline)), agentapi.NoDisk) {
		if dev, err = waitDisk(10 * time.Second); err != nil {
			return err
		}
	}
	logf("ready after %v: disk %s, channel %s", time.Since(start).Round(time.Millisecond), dev, port)
	enc := json.NewEncoder(f)
	up, _ = os.ReadFile("/proc/uptime")
	if err := enc.Encode(agentapi.Reply{Device: dev, Uptime: strings.Fields(string(up) + " ?")[0] + "s"}); err != nil { // the "ready" line
		return err
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var req agentapi.Request
		if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
			_ = enc.Encode(agentapi.Reply{Error: "bad request: " + err.Error()})
			continue
		}
		rep := handle(dev, &req)
		if err := enc.Encode(rep); err != nil {
			return err
		}
		if req.Op == "shutdown" && rep.Error == "" {
			return nil
		}
	}
	return fmt.Errorf("channel closed: %w", errors.Join(sc.Err(), errors.New("end of channel")))
}

func handle(dev string, req *agentapi.Request) agentapi.Reply {
	switch req.Op {
	case agentapi.OpMount:
		if err := mountVolume(dev, req); err != nil {
			return agentapi.Reply{Error: err.Error()}
		}
		return agentapi.Reply{Device: dev}
	case agentapi.OpExec:
		cmd := exec.Command("/bin/sh", "-c", req.Cmd)
		cmd.Dir = "/"
		if _, err := os.Stat(agentapi.Mountpoint); err == nil {
			cmd.Dir = agentapi.Mountpoint
		}
		cmd.Env = []string{"PATH=/bin", "VOL=" + agentapi.Mountpoint, "HOME=/tmp"}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: req.UID, Gid: req.GID, Groups: req.Groups}}
		out, err := cmd.CombinedOutput()
		r := agentapi.Reply{Output: string(out)}
		if err != nil {
			r.Exit = -1
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				r.Exit = ee.ExitCode()
			} else {
				r.Error = err.Error()
			}
		}
		return r
	case agentapi.OpStats:
		var st unix.Statfs_t
		if err := unix.Statfs(agentapi.Mountpoint, &st); err != nil {
			return agentapi.Reply{Error: err.Error()}
		}
		bs := uint64(max(st.Bsize, 0))
		r := agentapi.Reply{
			Device: dev, Total: i64(st.Blocks * bs), Available: i64(st.Bavail * bs),
			Used: i64((st.Blocks - st.Bfree) * bs), Inodes: i64(st.Files), InodesFree: i64(st.Ffree),
			InodesUsed: i64(st.Files - st.Ffree),
		}
		if b, err := os.ReadFile("/sys/block/" + filepath.Base(dev) + "/size"); err == nil {
			n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
			r.DeviceBytes = n * 512
		}
		return r
	case agentapi.OpResize:
		return agentapi.Reply{Error: fmt.Sprintf("%s (%s to %d bytes)", agentapi.ResizeRefusal, agentapi.Mountpoint, req.Size)}
	case agentapi.OpShutdown:
		unix.Sync()
		if err := unix.Unmount(agentapi.Mountpoint, 0); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return agentapi.Reply{Error: "unmount: " + err.Error()}
		}
		unix.Sync()
		// Flush the disk's cache to the host before the machine goes.
		if dev == "" {
			return agentapi.Reply{}
		}
		if f, err := os.OpenFile(dev, os.O_RDWR, 0); err == nil {
			_ = f.Sync()
			f.Close()
		}
		return agentapi.Reply{}
	}
	return agentapi.Reply{Error: "unknown op " + req.Op}
}

// i64 converts a statfs count, capped (no filesystem here comes near).
func i64(v uint64) int64 {
	if v > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(v)
}

// loadModules loads the modules listed (in dependency order) in list.
func loadModules(list string) error {
	b, err := os.ReadFile(list)
	if err != nil {
		return err
	}
	dir, err := os.OpenRoot("/lib/modules")
	if err != nil {
		return err
	}
	defer func() { _ = dir.Close() }() // a directory handle
	for _, name := range strings.Fields(string(b)) {
		f, err := dir.Open(name + ".ko")
		if err != nil {
			return err
		}
		err = unix.FinitModule(int(f.Fd()), "", 0)
		f.Close()
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("load module %s: %w", name, err)
		}
	}
	return nil
}

func waitPort(d time.Duration) (string, error) {
	deadline := time.Now().Add(d)
	for {
		ents, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
		for _, e := range ents {
			if b, _ := os.ReadFile(e); strings.TrimSpace(string(b)) == agentapi.PortName {
				p := "/dev/" + filepath.Base(filepath.Dir(e))
				if _, err := os.Stat(p); err == nil {
					return p, nil
				}
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no virtio-serial port %q after %v", agentapi.PortName, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func waitDisk(d time.Duration) (string, error) {
	deadline := time.Now().Add(d)
	for {
		ents, _ := filepath.Glob("/sys/block/vd*")
		if len(ents) == 1 {
			p := "/dev/" + filepath.Base(ents[0])
			if _, err := os.Stat(p); err == nil {
				return p, nil
			}
		}
		if len(ents) > 1 {
			return "", fmt.Errorf("more than one virtio disk: %v", ents)
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no virtio-blk disk after %v", d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var flagOpts = map[string]struct {
	set   bool
	value uintptr
}{
	"ro": {true, unix.MS_RDONLY}, "rw": {false, unix.MS_RDONLY},
	"nosuid": {true, unix.MS_NOSUID}, "suid": {false, unix.MS_NOSUID},
	"nodev": {true, unix.MS_NODEV}, "dev": {false, unix.MS_NODEV},
	"noexec": {true, unix.MS_NOEXEC}, "exec": {false, unix.MS_NOEXEC},
	"sync": {true, unix.MS_SYNCHRONOUS}, "async": {false, unix.MS_SYNCHRONOUS},
	"dirsync": {true, unix.MS_DIRSYNC}, "noatime": {true, unix.MS_NOATIME}, "atime": {false, unix.MS_NOATIME},
	"nodiratime": {true, unix.MS_NODIRATIME}, "relatime": {true, unix.MS_RELATIME}, "norelatime": {false, unix.MS_RELATIME},
	"strictatime": {true, unix.MS_STRICTATIME}, "lazytime": {true, unix.MS_LAZYTIME},
}

// mountVolume mounts dev with the runtime's fstype and options, as Kata's
// agent does (flags as flags, the rest as data), then applies the fsGroup.
func mountVolume(dev string, req *agentapi.Request) error {
	var flags uintptr
	var data []string
	for _, o := range req.Options {
		if f, ok := flagOpts[o]; ok {
			if f.set {
				flags |= f.value
			} else {
				flags &^= f.value
			}
			continue
		}
		if o == "defaults" {
			continue
		}
		data = append(data, o)
	}
	if err := os.MkdirAll(agentapi.Mountpoint, 0o755); err != nil {
		return err
	}
	// The filesystem's modules are loaded now, as a module loader would on
	// the first mount of that type.
	if strings.Trim(req.FsType, "abcdefghijklmnopqrstuvwxyz0123456789") != "" {
		return fmt.Errorf("fstype %q is not a filesystem name", req.FsType)
	}
	if _, err := os.Stat("/lib/modules/load." + req.FsType); err == nil {
		t0 := time.Now()
		if err := loadModules("/lib/modules/load." + req.FsType); err != nil {
			return err
		}
		logf("%s modules loaded in %v", req.FsType, time.Since(t0).Round(time.Millisecond))
	}
	src := dev
	if req.Source != "" {
		src = req.Source
	}
	if src == "" {
		return fmt.Errorf("nothing to mount: the guest has no disk and the request names no source")
	}
	if err := unix.Mount(src, agentapi.Mountpoint, req.FsType, flags, strings.Join(data, ",")); err != nil {
		return fmt.Errorf("mount %s as %s (flags %#x, data %q): %w", src, req.FsType, flags, strings.Join(data, ","), err)
	}
	logf("mounted %s on %s as %s, options %v", src, agentapi.Mountpoint, req.FsType, req.Options)
	if req.FsGroup == "" {
		return nil
	}
	gid, err := strconv.Atoi(req.FsGroup)
	if err != nil {
		return fmt.Errorf("fsGroup %q: %w", req.FsGroup, err)
	}
	return applyFsGroup(agentapi.Mountpoint, gid, req.FsGroupChangePolicy)
}

// applyFsGroup does what kubelet does for a pod's fsGroup: group of every
// file, group read/write (and execute where the owner has it, and on
// directories), setgid directories. OnRootMismatch skips the walk when the
// root already has all of it.
func applyFsGroup(root string, gid int, policy string) error {
	if policy == "OnRootMismatch" {
		var st unix.Stat_t
		if err := unix.Stat(root, &st); err == nil && int(st.Gid) == gid && st.Mode&(unix.S_ISGID|0o070) == unix.S_ISGID|0o070 {
			logf("fsGroup %d: root already matches, skipped", gid)
			return nil
		}
	}
	// Beneath a root handle: a name in the volume cannot lead outside it.
	r, err := os.OpenRoot(root)
	if err != nil {
		return err
	}
	defer func() { _ = r.Close() }() // a directory handle
	n := 0
	err = fs.WalkDir(r.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := r.Lchown(p, -1, gid); err != nil {
			return err
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		fi, err := r.Lstat(p)
		if err != nil {
			return err
		}
		mode := fi.Mode() & (os.ModePerm | os.ModeSetuid | os.ModeSetgid | os.ModeSticky)
		mode |= 0o060
		if d.IsDir() {
			mode |= 0o010 | os.ModeSetgid
		} else if mode&0o100 != 0 {
			mode |= 0o010
		}
		n++
		return r.Chmod(p, mode)
	})
	logf("fsGroup %d applied to %d files (policy %q)", gid, n, policy)
	return err
}
