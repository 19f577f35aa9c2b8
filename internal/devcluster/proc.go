package devcluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// startProcess starts a cluster component in its own session, so that it
// outlives `podvol-dev up`, records its PID in run/<name>.pid and its output
// in logs/<name>.log. A component whose recorded PID still runs is left as
// it is.
func (c *Cluster) startProcess(name string, env []string, bin string, args ...string) error {
	if pid, ok := c.running(name); ok {
		c.p.note("%s already running (pid %d)", name, pid)
		return nil
	}
	logf, err := os.OpenFile(filepath.Join(c.Dir, "logs", name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	pid := cmd.Process.Pid
	if c.children == nil {
		c.children = map[int]*os.Process{}
	}
	c.children[pid] = cmd.Process
	return os.WriteFile(c.pidFile(name), []byte(strconv.Itoa(pid)), 0o600)
}

func (c *Cluster) pidFile(name string) string { return filepath.Join(c.Dir, "run", name+".pid") }

// running reports the recorded PID of a component if that process lives and
// is still the program that was started (a recycled PID is not ours).
func (c *Cluster) running(name string) (int, bool) {
	b, err := os.ReadFile(c.pidFile(name))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, false
	}
	if !c.alive(pid) {
		return 0, false
	}
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if !strings.Contains(string(cmdline), c.Dir) {
		return 0, false
	}
	return pid, true
}

// stopProcess stops a component by its recorded PID: SIGTERM, then SIGKILL
// after the grace period.
func (c *Cluster) stopProcess(name string, grace time.Duration) error {
	pid, ok := c.running(name)
	if !ok {
		_ = os.Remove(c.pidFile(name))
		return nil
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	if !c.gone(pid, grace) {
		if grace > 0 {
			c.p.note("%s (pid %d) did not stop within %s: SIGKILL", name, pid, grace)
		}
		_ = syscall.Kill(pid, syscall.SIGKILL)
		if !c.gone(pid, 10*time.Second) {
			return fmt.Errorf("%s (pid %d) survived SIGKILL for 10s (stuck in the kernel?): its pid file %s is kept", name, pid, c.pidFile(name))
		}
	}
	c.p.note("stopped %s (pid %d)", name, pid)
	return os.Remove(c.pidFile(name))
}

// gone waits up to timeout for pid to exit.
func (c *Cluster) gone(pid int, timeout time.Duration) bool {
	for deadline := time.Now().Add(timeout); c.alive(pid); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// alive reports whether pid still runs. A component this process started
// stays a zombie after it exits until it is reaped, and signal 0 still
// reaches a zombie: such a child is reaped here through its own handle;
// any other zombie counts as stopped.
func (c *Cluster) alive(pid int) bool {
	if p, ok := c.children[pid]; ok {
		var ws syscall.WaitStatus
		if got, _ := syscall.Wait4(p.Pid, &ws, syscall.WNOHANG, nil); got == pid {
			delete(c.children, pid)
			_ = p.Release()
			return false
		}
	}
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses.
	if i := strings.LastIndexByte(string(stat), ')'); i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
		return false
	}
	return true
}

// waitFor polls check until it succeeds or timeout passes, and says what it
// was waiting for and where to look when it gives up.
func waitFor(what string, timeout time.Duration, check func() error) error {
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		if err = check(); err == nil {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("%s: not ready after %s: %w", what, timeout, err)
}

var errNotYet = errors.New("not yet")
