package devcluster

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// KillContainer SIGKILLs every process of the container with this id (the
// id of a pod's containerStatuses, without its containerd:// prefix: its
// processes' cgroup paths end in it) and returns their PIDs. The dev
// cluster's nodes share the host's PID namespace, so the host sees them.
func KillContainer(id string) []int {
	if id == "" {
		return nil
	}
	var pids []int
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cgroup"))
		if err != nil || !strings.Contains(string(b), id) {
			continue
		}
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}
