// Package failpoint lets the crash tests kill the plugin at an exact step of an
// operation, so that restart convergence is tested at every step that matters
// rather than wherever a timer happens to land. Points are enabled only by the
// PODVOL_FAILPOINTS environment variable (a comma-separated list of names) and
// cost one map lookup otherwise.
package failpoint

import (
	"os"
	"strings"
	"syscall"

	"k8s.io/klog/v2"
)

var enabled = parse(os.Getenv("PODVOL_FAILPOINTS"))

func parse(s string) map[string]bool {
	m := map[string]bool{}
	for _, n := range strings.Split(s, ",") {
		if n = strings.TrimSpace(n); n != "" {
			m[n] = true
		}
	}
	return m
}

// Hit kills the process with SIGKILL if the named point is enabled: no
// deferred function, no cleanup runs, exactly as in a real crash.
func Hit(name string) {
	if enabled[name] {
		klog.Warningf("failpoint %s: killing the process", name)
		klog.Flush()
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
}
