package node_test

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/podvol/podvol/internal/device/devicetest"
	"github.com/podvol/podvol/internal/directvolume"
	"github.com/podvol/podvol/internal/errkind"
	"github.com/podvol/podvol/internal/node"
)

func TestPublishUnpublishIdempotent(t *testing.T) {
	e := newEnv(t)
	v := e.volume("ext4")
	dev := e.stage(v)
	must(t, e.publish(v, v.target))
	e.mountedFrom(v.target, dev)
	mounts := e.dev.Calls(devicetest.Mount)
	must(t, e.publish(v, v.target))
	if e.dev.Calls(devicetest.Mount) != mounts || e.mountsAt(v.target) != 1 {
		t.Fatalf("a repeated publish mounted again: %d mounts at the target", e.mountsAt(v.target))
	}
	wantErr(t, e.publish(v, v.target, func(r *node.PublishRequest) { r.ReadOnly = true }), errkind.ErrConflict, "publish again read-only")
	wantErr(t, e.node.Unstage(ctx, v.ID, v.staging), errkind.ErrInUse, "unstage while published")

	// A read-only publication is a read-only bind of the same filesystem.
	ro := e.targetPath()
	must(t, e.publish(v, ro, func(r *node.PublishRequest) { r.ReadOnly = true }))
	if m, _ := e.dev.MountedAt(ro); m == nil || m.Source != dev || !m.ReadOnly() {
		t.Fatalf("read-only publication: %+v", m)
	}

	for _, target := range []string{v.target, ro} {
		must(t, e.node.Unpublish(ctx, v.ID, target))
		e.notMounted(target)
		if _, err := os.Stat(target); !os.IsNotExist(err) {
			t.Fatalf("target %s left: %v", target, err)
		}
		must(t, e.node.Unpublish(ctx, v.ID, target))
	}
	if r := e.record(v.ID); len(r.Publications) != 0 {
		t.Fatalf("publication records left: %v", r.Publications)
	}
	must(t, e.node.Unstage(ctx, v.ID, v.staging))
	e.clean()
	// kubelet's unpublish of a volume that is gone entirely still succeeds.
	must(t, e.pool.DeleteVolume(ctx, v.ID))
	must(t, e.node.Unpublish(ctx, v.ID, v.target))
}

func TestUnpublishLeavesForeignMountsAlone(t *testing.T) {
	e := newEnv(t)
	a, b := e.volume("ext4"), e.volume("ext4")
	e.stage(a)
	devB := e.stage(b)
	must(t, e.publish(b, b.target))
	// a's unpublish names b's target: that mount is not a's.
	wantErr(t, e.node.Unpublish(ctx, a.ID, b.target), errkind.ErrInvalid, "unpublish of another volume's mount")
	e.mountedFrom(b.target, devB)
}

func TestPublishBlock(t *testing.T) {
	e := newEnv(t)
	v := e.volume("ext4")
	must(t, e.node.Stage(ctx, node.StageRequest{VolumeID: v.ID, StagingPath: v.staging, Block: true}))
	dev := e.device(v)
	block := func(r *node.PublishRequest) { r.Block = true }
	wantErr(t, e.publish(v, v.target), errkind.ErrInvalid, "filesystem publish of a block stage")
	must(t, e.publish(v, v.target, block))
	m, _ := e.dev.MountedAt(v.target)
	if m == nil || strings.TrimPrefix(m.Root, "/") != strings.TrimPrefix(dev, "/dev/") {
		t.Fatalf("block publication is not a bind of %s: %+v", dev, m)
	}
	must(t, e.publish(v, v.target, block))
	if e.mountsAt(v.target) != 1 {
		t.Fatal("a repeated block publish mounted again")
	}
	must(t, e.node.Unpublish(ctx, v.ID, v.target))
	if _, err := os.Stat(v.target); !os.IsNotExist(err) {
		t.Fatalf("target file left: %v", err)
	}
	must(t, e.node.Unstage(ctx, v.ID, v.staging))
	e.clean()
}

// A stage that went away under us (unmounted by hand, a reboot) is restored
// before publishing: the pod gets the volume, never the empty staging
// directory on the node's own filesystem.
func TestPublishRestoresLostStage(t *testing.T) {
	for _, lose := range []struct {
		name string
		do   func(e *env, v *volume)
	}{
		{"unmounted by hand", func(e *env, v *volume) { must(e.t, e.dev.Unmount(v.staging)) }},
		{"reboot", func(e *env, v *volume) { e.dev.Reboot() }},
	} {
		t.Run(lose.name, func(t *testing.T) {
			e := newEnv(t)
			v := e.volume("ext4")
			e.stage(v)
			lose.do(e, v)
			must(t, e.publish(v, v.target))
			dev := e.device(v)
			e.mountedFrom(v.staging, dev)
			e.mountedFrom(v.target, dev)
			if e.dev.LoopBackingFile(dev) != e.pool.ImagePath(v.ID) {
				t.Fatalf("%s does not serve the volume's image", dev)
			}
		})
	}
}

func TestPublishRefusesAStandIn(t *testing.T) {
	e := newEnv(t)
	v := e.volume("ext4")
	e.stage(v)
	must(t, e.dev.Unmount(v.staging))
	// The stage cannot be restored: the mount fails.
	e.dev.Inject(devicetest.Mount, func(target string) error {
		if target == v.staging {
			return errors.New("mount: wrong fs type")
		}
		return nil
	})
	wantErr(t, e.publish(v, v.target), errkind.ErrNotStaged, "publish over a lost stage")
	e.notMounted(v.target)
	for _, m := range e.dev.MountTable() {
		if m.FsType == "hostfs" {
			t.Fatalf("the node's own filesystem was bound at %s", m.Target)
		}
	}
	if r := e.record(v.ID); len(r.Publications) != 0 {
		t.Fatalf("publication recorded: %v", r.Publications)
	}
	// Once the mount works again, kubelet's retry publishes the volume.
	e.dev.Inject(devicetest.Mount, nil)
	must(t, e.publish(v, v.target))
	e.mountedFrom(v.target, e.device(v))
}

func TestPublishRequiresStage(t *testing.T) {
	e := newEnv(t)
	v := e.volume("ext4")
	wantErr(t, e.publish(v, v.target), errkind.ErrNotStaged, "publish before stage")
	e.stage(v)
	wantErr(t, e.node.Publish(ctx, node.PublishRequest{VolumeID: v.ID, StagingPath: v.staging + "x", TargetPath: v.target}), errkind.ErrNotStaged, "publish from another staging path")
	wantErr(t, e.node.Publish(ctx, node.PublishRequest{VolumeID: "pv-000000000000000000000000", StagingPath: v.staging, TargetPath: v.target}), errkind.ErrNotFound, "publish of an unknown volume")
	e.notMounted(v.target)
}

func TestReadWriteOncePod(t *testing.T) {
	e := newEnv(t)
	v := e.volume("ext4")
	e.stage(v)
	first, second := v.target, e.targetPath()
	must(t, e.publish(v, first, exclusive))
	wantErr(t, e.publish(v, second, exclusive), errkind.ErrInUse, "second RWOP publication")
	wantErr(t, e.publish(v, second), errkind.ErrInUse, "second publication beside an RWOP one")
	e.notMounted(second)
	must(t, e.publish(v, first, exclusive)) // the same pod again: done
	must(t, e.node.Unpublish(ctx, v.ID, first))
	must(t, e.publish(v, second, exclusive))
}

// While a volume is assigned to a microVM, the host must not mount it: the
// guest owns the filesystem.
func TestDirectAssignment(t *testing.T) {
	e := newEnv(t)
	v := e.volume("ext4")
	dev := e.stage(v)
	wantErr(t, e.publish(v, v.target, func(r *node.PublishRequest) { r.Direct = true }), errkind.ErrInUse, "direct assignment without RWOP")
	must(t, e.publish(v, v.target, direct))
	e.notMounted(v.staging)
	e.notMounted(v.target)
	info, err := directvolume.Read(e.shim.Root, v.target)
	must(t, err)
	if info.Device != dev || info.FsType != "ext4" {
		t.Fatalf("mount information: %+v", info)
	}
	must(t, e.publish(v, v.target, direct)) // kubelet's retry

	host := e.targetPath()
	wantErr(t, e.publish(v, host), errkind.ErrInUse, "host publish while assigned")
	wantErr(t, e.publish(v, host, exclusive), errkind.ErrInUse, "host RWOP publish while assigned")
	e.notMounted(host)
	e.notMounted(v.staging)

	// The assignment ends: the staging mount comes back before its record
	// goes, so a failed remount keeps the unpublish failing (and retried).
	e.dev.FailNext(devicetest.Mount, errors.New("mount: boom"))
	if err := e.node.Unpublish(ctx, v.ID, v.target); err == nil {
		t.Fatal("unpublish succeeded without the staging mount back")
	}
	if r := e.record(v.ID); r.Publications[v.target] == nil {
		t.Fatal("the assignment's record went before the staging mount was back")
	}
	e.notMounted(v.staging)
	wantErr(t, e.publish(v, host), errkind.ErrInUse, "host publish while the assignment is ending")
	must(t, e.node.Unpublish(ctx, v.ID, v.target))
	e.mountedFrom(v.staging, dev)
	if directvolume.Exists(e.shim.Root, v.target) {
		t.Fatal("mount information left")
	}
	must(t, e.publish(v, host))
	e.mountedFrom(host, dev)
}

func TestFsGroup(t *testing.T) {
	e := newEnv(t)
	v := e.volume("ext4")
	e.stage(v)
	group := func(r *node.PublishRequest) { r.FsGroup = "2000" }
	must(t, e.publish(v, v.target, group))
	if sig, _ := devicetest.ReadSignature(e.pool.ImagePath(v.ID)); sig.Group != 2000 || !sig.Setgid {
		t.Fatalf("root after publish with fsGroup: %+v", sig)
	}
	wantErr(t, e.publish(v, e.targetPath(), func(r *node.PublishRequest) { r.FsGroup = "staff" }), errkind.ErrInvalid, "non-numeric fsGroup")
	// A failure to apply it leaves no publication behind.
	other := e.targetPath()
	e.dev.FailNext(devicetest.SetGroup, errors.New("chown: boom"))
	if err := e.publish(v, other, group); err == nil {
		t.Fatal("publish succeeded without the fsGroup")
	}
	e.notMounted(other)
}
