package plugin_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/podvol/podvol/test/plugintest"
)

// fsBytes reads the size of the (unmounted) filesystem on dev from its
// superblock: what a guest that mounts dev gets.
func fsBytes(t *testing.T, dev, fs string) int64 {
	t.Helper()
	var out []byte
	var err error
	field := func(name string) int64 {
		t.Helper()
		for _, l := range strings.Split(string(out), "\n") {
			k, v, ok := strings.Cut(l, "=")
			if !ok {
				k, v, ok = strings.Cut(l, ":")
			}
			if ok && strings.TrimSpace(k) == name {
				n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				if err != nil {
					t.Fatalf("%s of %s: %q", name, dev, v)
				}
				return n
			}
		}
		t.Fatalf("no %s for %s in:\n%s", name, dev, out)
		return 0
	}
	switch fs {
	case "ext4":
		out, err = exec.Command("dumpe2fs", "-h", dev).Output()
		if err != nil {
			t.Fatalf("dumpe2fs -h %s: %v", dev, err)
		}
		return field("Block count") * field("Block size")
	case "xfs":
		out, err = exec.Command("xfs_db", "-r", "-c", "sb 0", "-c", "p dblocks blocksize", dev).Output()
		if err != nil {
			t.Fatalf("xfs_db %s: %v", dev, err)
		}
		return field("dblocks") * field("blocksize")
	}
	t.Fatalf("fsBytes: %s", fs)
	return 0
}

// expandAsCO grows the volume as Kubernetes does: ControllerExpandVolume
// (external-resizer), then NodeExpandVolume (kubelet) at path.
func (e *env) expandAsCO(id, path string, size int64, c *csi.VolumeCapability) (int64, error) {
	e.t.Helper()
	cr, err := e.p.Controller().ControllerExpandVolume(ctx(e.t), &csi.ControllerExpandVolumeRequest{
		VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapability: c})
	e.must("ControllerExpandVolume", err)
	if cr.GetCapacityBytes() != size || !cr.GetNodeExpansionRequired() {
		e.t.Fatalf("ControllerExpandVolume to %d: %v", size, cr)
	}
	r, err := e.p.Node().NodeExpandVolume(ctx(e.t), &csi.NodeExpandVolumeRequest{
		VolumeId: id, VolumePath: path, StagingTargetPath: e.staging(id),
		CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapability: c})
	return r.GetCapacityBytes(), err
}

// growthLeftovers fails the test if anything of a growth is mounted on the
// host or left in the pool.
func (e *env) growthLeftovers(dev string) {
	e.t.Helper()
	if _, mounts := plugintest.Leftovers(e.dir); len(mounts) != 0 {
		e.t.Fatalf("mounts left on the host while %s is assigned to a guest: %v", dev, mounts)
	}
	if m, _ := os.ReadFile("/proc/self/mountinfo"); bytes.Contains(m, []byte(" "+dev+" ")) {
		e.t.Fatalf("%s is mounted on the host while assigned to a guest:\n%s", dev, m)
	}
	if ents, _ := os.ReadDir(filepath.Join(e.p.PoolDir, "growing")); len(ents) != 0 {
		e.t.Fatalf("private growth mounts left in the pool: %v", ents)
	}
}

// TestDirectAssignedVolumeGrowsBeforeItsSandbox: kubelet's order for a pod
// whose volume was expanded while no pod used it: NodeStageVolume,
// NodePublishVolume (direct), then NodeExpandVolume at the target path, all
// before the runtime creates the sandbox. The expansion succeeds and the
// filesystem on the device, which the guest is about to mount, is the new
// size, with the data on it; nothing stays mounted on the host. Once a
// sandbox has taken the volume, growth goes to the runtime again, whose
// refusal comes back as FAILED_PRECONDITION.
func TestDirectAssignedVolumeGrowsBeforeItsSandbox(t *testing.T) {
	for _, tc := range []struct {
		fs         string
		size, grow int64
	}{{"ext4", 64 << 20, 160 << 20}, {"xfs", 300 << 20, 600 << 20}} {
		t.Run(tc.fs, func(t *testing.T) {
			var rt *runtime
			e := newEnvArgs(t, func(dir string) []string { rt = newRuntime(t, dir); return rt.args() })
			c := rwop(tc.fs)
			id := e.create("kata-grow-"+tc.fs, tc.size, c, map[string]string{"directAssign": "always"}).GetVolumeId()
			e.must("stage", e.stage(id, c))
			writeFile(t, filepath.Join(e.staging(id), "f"), "kept")
			target := e.target(id)
			e.must("publish (direct)", e.publishReq(id, c, target))
			dev := str(t, rt.read(target), "device")
			before := fsBytes(t, dev, tc.fs)

			got, err := e.expandAsCO(id, target, tc.grow, c)
			e.must("NodeExpandVolume at the target before the sandbox exists", err)
			if got != tc.grow {
				t.Fatalf("NodeExpandVolume returned %d bytes, want %d", got, tc.grow)
			}
			after := fsBytes(t, dev, tc.fs)
			t.Logf("[%s] filesystem on %s: %d -> %d bytes (device %d)", tc.fs, dev, before, after, tc.grow)
			if after <= before || after < tc.grow*99/100 || after > tc.grow {
				t.Fatalf("the filesystem the guest will mount is %d bytes (was %d), want about %d", after, before, tc.grow)
			}
			e.growthLeftovers(dev)
			// kubelet's retry finds the work done.
			got, err = e.expandAsCO(id, target, tc.grow, c)
			e.must("NodeExpandVolume again", err)
			if got != tc.grow || fsBytes(t, dev, tc.fs) != after {
				t.Fatalf("the repeated expansion returned %d bytes and left a %d-byte filesystem (was %d)", got, fsBytes(t, dev, tc.fs), after)
			}
			// The mount information still names the device.
			if str(t, rt.read(target), "device") != dev {
				t.Fatal("mountInfo.json changed")
			}

			// A sandbox has taken it: the runtime's call again, its refusal
			// passed on, the filesystem left as the guest has it.
			rt.startSandbox(target, "sandbox-"+tc.fs)
			_, err = e.expandAsCO(id, target, tc.grow+64<<20, c)
			wantCode(t, "growth once a sandbox has the volume", err, codes.FailedPrecondition)
			if !strings.Contains(err.Error(), "resize not implemented by the agent") {
				t.Fatalf("the runtime's answer is not in %v", err)
			}
			if now := fsBytes(t, dev, tc.fs); now != after {
				t.Fatalf("the host grew the filesystem of a volume a sandbox has: %d -> %d bytes", after, now)
			}
			e.growthLeftovers(dev)

			e.must("unpublish", e.unpublish(id))
			if got := readFile(t, filepath.Join(e.staging(id), "f")); got != "kept" {
				t.Fatalf("data after the growth: %q", got)
			}
			if total := statfs(t, e.staging(id)); total < (tc.grow+64<<20)*9/10 {
				t.Fatalf("staging mount has %d bytes: the refused growth did not follow at the host stage", total)
			}
			e.must("unstage", e.unstage(id))
			img := filepath.Join(e.p.PoolDir, "volumes", id+".img")
			check := []string{"e2fsck", "-fn", img}
			if tc.fs == "xfs" {
				check = []string{"xfs_repair", "-n", "-f", img}
			}
			if out, err := exec.Command(check[0], check[1:]...).CombinedOutput(); err != nil {
				t.Fatalf("%v: %v\n%s", check, err, out)
			}
			e.must("delete", e.delete(id))
			e.assertClean()
		})
	}
}

// TestDirectAssignedBlockVolumeGrowsBeforeItsSandbox: a raw block volume in
// the same order: the device grows, and nothing waits for a runtime that
// has no sandbox yet.
func TestDirectAssignedBlockVolumeGrowsBeforeItsSandbox(t *testing.T) {
	var rt *runtime
	e := newEnvArgs(t, func(dir string) []string { rt = newRuntime(t, dir); return rt.args() })
	c := blockCap()
	c.AccessMode.Mode = csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
	id := e.create("kata-block-grow", 32<<20, c, map[string]string{"directAssign": "always"}).GetVolumeId()
	e.must("stage", e.stage(id, c))
	e.must("publish", e.publishReq(id, c, e.target(id)))
	dev := str(t, rt.read(e.target(id)), "device")
	got, err := e.expandAsCO(id, e.target(id), 64<<20, c)
	e.must("NodeExpandVolume at the target before the sandbox exists", err)
	out, err := exec.Command("blockdev", "--getsize64", dev).Output()
	if err != nil {
		t.Fatal(err)
	}
	if got != 64<<20 || strings.TrimSpace(string(out)) != strconv.Itoa(64<<20) {
		t.Fatalf("NodeExpandVolume returned %d bytes, the device has %s", got, out)
	}
	e.must("unpublish", e.unpublish(id))
	e.must("unstage", e.unstage(id))
	e.must("delete", e.delete(id))
	e.assertClean()
}

// TestCrashDuringDirectAssignedExpand: killed in the middle of growing an
// assigned volume that no sandbox has taken (after the new size is recorded;
// for xfs also while its private mount exists), the plugin leaves nothing
// mounted after its restart, and kubelet's retry grows the filesystem.
func TestCrashDuringDirectAssignedExpand(t *testing.T) {
	for _, tc := range []struct{ fs, fp string }{
		{"ext4", "grow-after-record"},
		{"xfs", "grow-after-record"},
		{"xfs", "grow-assigned-after-mount"},
	} {
		t.Run(tc.fs+"/"+tc.fp, func(t *testing.T) {
			var rt *runtime
			e := newEnvArgs(t, func(dir string) []string { rt = newRuntime(t, dir); return rt.args() })
			c := rwop(tc.fs)
			id := e.create("kata-crash", 300<<20, c, map[string]string{"directAssign": "always"}).GetVolumeId()
			e.must("stage", e.stage(id, c))
			writeFile(t, filepath.Join(e.staging(id), "f"), "kept")
			target := e.target(id)
			e.must("publish (direct)", e.publishReq(id, c, target))
			dev := str(t, rt.read(target), "device")
			e.crash(tc.fp, func() error { _, err := e.expand(id, target, 600<<20); return err })
			if tc.fp == "grow-assigned-after-mount" && !strings.Contains(e.p.Log(), "Removing a private growth mount") {
				t.Fatalf("the restart did not remove the private mount the crash left:\n%s", e.p.Log())
			}
			e.growthLeftovers(dev)
			got, err := e.expandAsCO(id, target, 600<<20, c)
			e.must("kubelet's retry after the restart", err)
			if size := fsBytes(t, dev, tc.fs); got != 600<<20 || size < 590<<20 {
				t.Fatalf("after the retry: capacity %d, filesystem %d bytes", got, size)
			}
			e.growthLeftovers(dev)
			e.must("unpublish", e.unpublish(id))
			if got := readFile(t, filepath.Join(e.staging(id), "f")); got != "kept" {
				t.Fatalf("data: %q", got)
			}
			e.must("unstage", e.unstage(id))
			e.must("delete", e.delete(id))
			e.assertClean()
		})
	}
}
