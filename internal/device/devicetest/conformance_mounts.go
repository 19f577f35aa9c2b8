package devicetest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/podvol/podvol/internal/device"
)

// Conformance checks of mounts: bind mounts, stacking, block binds.

func checkBindMountsAndStacking(t *testing.T, c *conf) {
	m := c.m
	ctx := context.Background()
	img := c.image(32 << 20)
	dev := c.attach(img)
	must(t, m.Format(ctx, dev, "ext4"))
	stage, target, ro := c.dir("stage"), c.dir("target"), c.dir("ro")
	c.mount(dev, stage, "ext4")
	c.mount(stage, target, "", "bind")
	c.mount(stage, ro, "", "bind", "ro")
	if mt, _ := m.MountedAt(target); mt == nil || mt.Source != dev || mt.ReadOnly() {
		t.Fatalf("bind mount: %+v", mt)
	}
	if mt, _ := m.MountedAt(ro); mt == nil || mt.Source != dev || !mt.ReadOnly() {
		t.Fatalf("read-only bind mount: %+v", mt)
	}
	if mps, _ := m.MountsOf(dev); len(mps) != 3 {
		t.Fatalf("MountsOf: %v", mps)
	}
	// The bind is the filesystem of dev, but only the staging path is
	// the root of its mount: the target is as well (a bind of the root).
	if err := m.MountedFrom(target, dev); err != nil {
		t.Fatalf("MountedFrom(bind of the root): %v", err)
	}
	sub := filepath.Join(stage, "sub")
	must(t, os.Mkdir(sub, 0o755))
	if err := m.MountedFrom(sub, dev); !errors.Is(err, device.ErrNotMounted) {
		t.Fatalf("MountedFrom(a directory inside): %v", err)
	}
	// A second bind at the same path stacks; Unmount takes both.
	c.mount(stage, target, "", "bind")
	must(t, m.Unmount(target))
	if mt, _ := m.MountedAt(target); mt != nil {
		t.Fatalf("stacked mount left: %+v", mt)
	}
	// The staging mount can go while binds of it remain: the
	// filesystem stays, and so does its device's source.
	must(t, m.Unmount(stage))
	if mps, _ := m.MountsOf(dev); !slices.Equal(mps, []string{ro}) {
		t.Fatalf("MountsOf after unmounting the stage: %v", mps)
	}
	if err := m.MountedFrom(stage, dev); !errors.Is(err, device.ErrNotMounted) {
		t.Fatalf("MountedFrom(unmounted staging path): %v", err)
	}
	// A bind of a directory on no volume is the host's filesystem.
	host := c.dir("host")
	c.mount(host, target, "", "bind")
	if mt, _ := m.MountedAt(target); mt == nil || mt.Source == dev {
		t.Fatalf("bind of a host directory: %+v", mt)
	}
	if err := m.MountedFrom(target, dev); !errors.Is(err, device.ErrNotMounted) {
		t.Fatalf("MountedFrom(a host bind): %v", err)
	}
}

func checkBlockBind(t *testing.T, c *conf) {
	m := c.m
	img := c.image(1 << 20)
	dev := c.attach(img)
	target := filepath.Join(c.dir("pod"), "dev")
	must(t, os.WriteFile(target, nil, 0o640))
	c.mount(dev, target, "", "bind")
	mt, err := m.MountedAt(target)
	if err != nil || mt == nil || strings.TrimPrefix(mt.Root, "/") != strings.TrimPrefix(dev, "/dev/") {
		t.Fatalf("bind of %s: %+v, %v", dev, mt, err)
	}
	if mps, _ := m.MountsOf(dev); len(mps) != 0 {
		t.Fatalf("a device node's bind is not a mount of the device: %v", mps)
	}
	// Kubelet binds the published file on to a path of its own.
	mapped := filepath.Join(c.dir("map"), "pod-uid")
	must(t, os.WriteFile(mapped, nil, 0o640))
	c.mount(target, mapped, "", "bind")
	for _, p := range []string{dev, target, mapped} {
		if err := m.DeviceNodeOf(p, dev); err != nil {
			t.Fatalf("DeviceNodeOf(%s, %s): %v", p, dev, err)
		}
	}
	other := c.attach(c.image(1 << 20))
	for _, p := range []string{other, img, filepath.Dir(mapped), filepath.Join(c.dir("none"), "x")} {
		if err := m.DeviceNodeOf(p, dev); err == nil {
			t.Fatalf("DeviceNodeOf(%s, %s) = nil, want an error", p, dev)
		}
	}
}
