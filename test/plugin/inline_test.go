package plugin_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/podvol/podvol/test/plugintest"
)

// kubelet mimics the directory tree kubelet makes for CSI inline volumes.
type kubelet struct {
	e   *env
	dir string
}

func newInlineEnv(t *testing.T, capacity string, args ...string) (*env, *kubelet) {
	e := newEnv(t, plugintest.Options{Capacity: capacity, Args: append([]string{"--kubelet-dir", "{dir}/kubelet"}, args...)})
	return e, &kubelet{e: e, dir: filepath.Join(e.dir, "kubelet")}
}

func (k *kubelet) target(podUID, name string) string {
	return filepath.Join(k.dir, "pods", podUID, "volumes", "kubernetes.io~csi", name, "mount")
}

func (k *kubelet) handle(podUID, name string) string { return "csi-" + podUID + "-" + name }

func (k *kubelet) publish(podUID, name string, attrs map[string]string) error {
	return k.publishCap(podUID, name, attrs, rwo)
}

func (k *kubelet) publishCap(podUID, name string, attrs map[string]string, c *csi.VolumeCapability) error {
	t := k.target(podUID, name)
	if err := os.MkdirAll(filepath.Dir(t), 0o750); err != nil {
		k.e.t.Fatal(err)
	}
	ctxAttrs := map[string]string{
		"csi.storage.k8s.io/ephemeral":     "true",
		"csi.storage.k8s.io/pod.name":      "pod-" + podUID,
		"csi.storage.k8s.io/pod.namespace": "default",
		"csi.storage.k8s.io/pod.uid":       podUID,
	}
	for k, v := range attrs {
		ctxAttrs[k] = v
	}
	_, err := k.e.p.Node().NodePublishVolume(ctx(k.e.t), &csi.NodePublishVolumeRequest{
		VolumeId: k.handle(podUID, name), TargetPath: t, VolumeCapability: c, VolumeContext: ctxAttrs,
	})
	return err
}

func (k *kubelet) unpublish(podUID, name string) error {
	_, err := k.e.p.Node().NodeUnpublishVolume(ctx(k.e.t), &csi.NodeUnpublishVolumeRequest{VolumeId: k.handle(podUID, name), TargetPath: k.target(podUID, name)})
	return err
}

func TestInlineVolumeLifecycle(t *testing.T) {
	e, k := newInlineEnv(t, "")
	k.e.must("publish", k.publish("uid1", "scratch", map[string]string{"size": "64Mi", "fsType": "xfs"}))
	target := k.target("uid1", "scratch")
	writeFile(t, filepath.Join(target, "f"), "scratch data")
	if got := readFile(t, filepath.Join(target, "f")); got != "scratch data" {
		t.Fatalf("read back %q", got)
	}
	// Repeated publish (kubelet retries) is a no-op.
	k.e.must("publish again", k.publish("uid1", "scratch", map[string]string{"size": "64Mi", "fsType": "xfs"}))
	st, err := e.p.Node().NodeGetVolumeStats(ctx(t), &csi.NodeGetVolumeStatsRequest{VolumeId: k.handle("uid1", "scratch"), VolumePath: target})
	e.must("stats by kubelet's handle", err)
	if total := st.GetUsage()[0].GetTotal(); total <= 0 || total > 300<<20 {
		t.Fatalf("stats total %d for a 300 MiB (xfs minimum) volume", total)
	}
	if ids := e.volumeIDs(); len(ids) != 1 {
		t.Fatalf("volumes %v", ids)
	}
	e.must("unpublish", k.unpublish("uid1", "scratch"))
	e.must("unpublish again", k.unpublish("uid1", "scratch"))
	if _, err := os.Stat(target); !os.IsNotExist(err) {
		t.Fatalf("target still there: %v", err)
	}
	if ids, imgs := e.volumeIDs(), e.images(); len(ids)+len(imgs) > 0 {
		t.Fatalf("left in the pool: volumes %v, images %v", ids, imgs)
	}
	e.assertClean()
}

func TestInlineVolumeRefusals(t *testing.T) {
	e, k := newInlineEnv(t, "1Gi")
	cases := []struct {
		attrs map[string]string
		code  codes.Code
		msg   string
	}{
		{map[string]string{"color": "blue"}, codes.InvalidArgument, "takes size, fsType"},
		{map[string]string{"size": "lots"}, codes.InvalidArgument, "not a quantity"},
		{map[string]string{"size": "0"}, codes.InvalidArgument, "more than zero"},
		{map[string]string{"fsType": "vfat"}, codes.InvalidArgument, "not supported"},
		{map[string]string{"size": "2Gi"}, codes.ResourceExhausted, "free"},
	}
	for _, c := range cases {
		err := k.publish("uid1", "v", c.attrs)
		wantCode(t, "inline publish with "+strings.Join(mapKV(c.attrs), ","), err, c.code)
		if !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%v: message %q lacks %q", c.attrs, err, c.msg)
		}
	}
	if ids, imgs := e.volumeIDs(), e.images(); len(ids)+len(imgs) > 0 {
		t.Fatalf("refusals left volumes %v, images %v", ids, imgs)
	}
	e.assertClean()
}

func mapKV(m map[string]string) []string {
	var out []string
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	return out
}

// TestInlineSharesCapacity: inline and persistent volumes together never
// exceed the pool.
func TestInlineSharesCapacity(t *testing.T) {
	e, k := newInlineEnv(t, "1Gi")
	p := e.create("pvc", 600<<20, rwo, nil).GetVolumeId()
	err := k.publish("uid1", "big", map[string]string{"size": "500Mi"})
	wantCode(t, "inline beyond what persistent volumes left", err, codes.ResourceExhausted)
	e.must("inline that fits", k.publish("uid1", "small", map[string]string{"size": "400Mi"}))
	_, err = e.p.Controller().CreateVolume(ctx(t), &csi.CreateVolumeRequest{Name: "pvc2", CapacityRange: &csi.CapacityRange{RequiredBytes: 100 << 20}, VolumeCapabilities: []*csi.VolumeCapability{rwo}})
	wantCode(t, "persistent beyond what inline left", err, codes.ResourceExhausted)
	r, err := e.p.Controller().GetCapacity(ctx(t), &csi.GetCapacityRequest{})
	e.must("GetCapacity", err)
	if r.GetAvailableCapacity() != 24<<20 {
		t.Fatalf("GetCapacity %d, want 24 MiB", r.GetAvailableCapacity())
	}
	e.must("unpublish", k.unpublish("uid1", "small"))
	e.must("delete", e.delete(p))
	e.assertClean()
}

// TestInlineLeakCollection: kubelet does not call unpublish after a reboot
// that took the pod with it. The restarted plugin collects that volume and
// keeps the one whose pod still exists, with its data.
func TestInlineLeakCollection(t *testing.T) {
	e, k := newInlineEnv(t, "")
	e.must("publish gone", k.publish("gone", "v", nil))
	goneID := e.volumeIDs()[0]
	e.must("publish live", k.publish("live", "v", nil))
	writeFile(t, filepath.Join(k.target("live", "v"), "f"), "survives")

	e.p.Kill()
	plugintest.ForceClean(e.dir) // the reboot: no mount, no loop device
	if err := os.RemoveAll(filepath.Join(k.dir, "pods", "gone")); err != nil {
		t.Fatal(err)
	}
	e.p.Restart()

	for _, img := range e.images() {
		if strings.HasPrefix(img, goneID) {
			t.Fatalf("the gone pod's volume %s was not collected: images %v\n%s", goneID, e.images(), e.p.Log())
		}
	}
	if ids := e.volumeIDs(); len(ids) != 1 {
		t.Fatalf("volumes after restart: %v, want only the live pod's", ids)
	}
	// kubelet's repeated publish for the live pod finds its data.
	e.must("publish live again", k.publish("live", "v", nil))
	if got := readFile(t, filepath.Join(k.target("live", "v"), "f")); got != "survives" {
		t.Fatalf("live pod's data: %q", got)
	}
	e.must("unpublish live", k.unpublish("live", "v"))
	e.assertClean()
}

// TestInlinePeriodicCollection: a target unmounted behind the plugin's back
// (kubelet cleaning up without calling it) is collected on the next pass.
func TestInlinePeriodicCollection(t *testing.T) {
	e, k := newInlineEnv(t, "", "--inline-gc-interval", "200ms")
	e.must("publish", k.publish("uid1", "v", nil))
	e.must("publish other", k.publish("uid2", "v", nil))
	run(t, "umount", k.target("uid1", "v"))
	deadline := time.Now().Add(10 * time.Second)
	for len(e.volumeIDs()) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("not collected: %v\n%s", e.volumeIDs(), e.p.Log())
		}
		time.Sleep(100 * time.Millisecond)
	}
	e.must("unpublish other", k.unpublish("uid2", "v"))
	e.assertClean()
}

// TestInlineVolumeFsGroup: podvol advertises VOLUME_MOUNT_GROUP, so kubelet
// leaves the pod's fsGroup to it; a non-root pod in that group can write to
// its inline scratch space.
func TestInlineVolumeFsGroup(t *testing.T) {
	e, k := newInlineEnv(t, "")
	for _, fs := range []string{"ext4", "xfs"} {
		c := mountCap(fs, csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
		c.GetMount().VolumeMountGroup = "2000"
		e.must("publish "+fs, k.publishCap("uid-"+fs, "scratch", map[string]string{"size": "300Mi"}, c))
		target := k.target("uid-"+fs, "scratch")
		var st unix.Stat_t
		if err := unix.Stat(target, &st); err != nil {
			t.Fatal(err)
		}
		if st.Gid != 2000 || st.Mode&unix.S_ISGID == 0 || st.Mode&0o070 != 0o070 {
			t.Fatalf("%s: inline volume root has gid %d mode %o, want gid 2000, setgid and g+rwx", fs, st.Gid, st.Mode&0o7777)
		}
		asPodUser(t, target, "echo ok > written-by-pod")
		e.must("unpublish", k.unpublish("uid-"+fs, "scratch"))
	}
	e.assertClean()
}
