package node_test

import (
	"cmp"
	"github.com/podvol/podvol/internal/device"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestHealth(t *testing.T) {
	for _, c := range []struct {
		reason string
		fault  func(e *env, v *volume, dev string)
	}{
		{"", func(*env, *volume, string) {}},
		{"ImageTruncated", func(e *env, v *volume, _ string) { must(e.t, os.Truncate(e.pool.ImagePath(v.ID), 1<<20)) }},
		{"StagingMountMissing", func(e *env, v *volume, _ string) { must(e.t, e.dev.Unmount(v.staging)) }},
		{"PublishMountMissing", func(e *env, v *volume, _ string) { must(e.t, e.dev.Unmount(v.target)) }},
		{"ReadOnly", func(e *env, _ *volume, dev string) { must(e.t, e.dev.SetErrors(dev, 0, "")) }},
		{"FilesystemErrors", func(e *env, _ *volume, dev string) { must(e.t, e.dev.SetErrors(dev, 2, "ext4_find_entry")) }},
		{"FilesystemShutdown", func(e *env, _ *volume, dev string) { must(e.t, e.dev.SetShutdown(dev)) }},
		{"LoopDeviceDetached", func(e *env, _ *volume, _ string) { e.dev.Reboot() }},
		// The freed number goes to the next program that asks for one.
		{"LoopDeviceMismatch", func(e *env, _ *volume, dev string) {
			e.dev.Reboot()
			other := filepath.Join(e.t.TempDir(), "other.img")
			must(e.t, os.WriteFile(other, make([]byte, 1<<20), 0o600))
			got, err := e.dev.AttachLoop(other, device.LoopOptions{})
			must(e.t, err)
			if got != dev {
				e.t.Fatalf("the freed %s was not reused: %s", dev, got)
			}
		}},
	} {
		t.Run(cmp.Or(c.reason, "Healthy"), func(t *testing.T) {
			e := newEnv(t)
			v := e.volume("ext4")
			dev := e.stage(v)
			must(t, e.publish(v, v.target))
			c.fault(e, v, dev)
			cs, err := e.node.Health(ctx, v.ID, true)
			must(t, err)
			var reasons []string
			for _, c := range cs {
				reasons = append(reasons, c.Reason)
			}
			if c.reason == "" && len(reasons) != 0 || c.reason != "" && !slices.Contains(reasons, c.reason) {
				t.Fatalf("conditions %v, want %q", reasons, c.reason)
			}
		})
	}
}
