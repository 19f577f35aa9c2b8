// Package failpoint lets the crash tests kill the plugin at an exact step of an
// operation, so that restart convergence is tested at every step that matters
// rather than wherever a timer happens to land. Points are enabled only by the
// PODVOL_FAILPOINTS environment variable (a comma-separated list of names, each
// optionally "=sleep:<duration>" to hold the step instead of crashing, for
// tests of what runs meanwhile) and cost one map lookup otherwise.
package failpoint

import (
	"os"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

var enabled = parse(os.Getenv("PODVOL_FAILPOINTS"))

// parse maps each enabled point to how long it sleeps; 0 means crash.
func parse(s string) map[string]time.Duration {
	m := map[string]time.Duration{}
	for _, n := range strings.Split(s, ",") {
		name, action, _ := strings.Cut(strings.TrimSpace(n), "=")
		if name == "" {
			continue
		}
		m[name] = 0
		if d, ok := strings.CutPrefix(action, "sleep:"); ok {
			if dur, err := time.ParseDuration(d); err == nil && dur > 0 {
				m[name] = dur
			}
		}
	}
	return m
}

// Hit kills the process with SIGKILL if the named point is enabled: no
// deferred function, no cleanup runs, exactly as in a real crash. A point
// enabled with a sleep holds the caller there instead.
func Hit(name string) {
	d, ok := enabled[name]
	if !ok {
		return
	}
	if d > 0 {
		klog.Warningf("failpoint %s: sleeping %s", name, d)
		time.Sleep(d)
		return
	}
	klog.Warningf("failpoint %s: killing the process", name)
	klog.Flush()
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL) // cannot fail for our own pid; the select below waits for the signal
	select {}
}
