package node_test

import (
	"errors"
	"testing"

	"github.com/podvol/podvol/internal/device/devicetest"
	"github.com/podvol/podvol/internal/errkind"
	"github.com/podvol/podvol/internal/node"
	"github.com/podvol/podvol/internal/size"
)

func TestStageUnstageIdempotent(t *testing.T) {
	e := newEnv(t)
	v := e.volume("ext4")
	dev := e.stage(v)
	e.mountedFrom(v.staging, dev)
	if devs, _ := e.dev.LoopsFor(e.pool.ImagePath(v.ID)); len(devs) != 1 {
		t.Fatalf("loop devices of the image: %v", devs)
	}
	if sig, _ := devicetest.ReadSignature(e.pool.ImagePath(v.ID)); sig == nil || sig.Type != "ext4" {
		t.Fatalf("image holds %+v after stage", sig)
	}
	formats, mounts := e.dev.Calls(devicetest.Format), e.dev.Calls(devicetest.Mount)

	// A repeated stage finds it done.
	if e.stage(v) != dev {
		t.Fatal("a repeated stage changed the device")
	}
	if e.dev.Calls(devicetest.Format) != formats || e.dev.Calls(devicetest.Mount) != mounts || e.mountsAt(v.staging) != 1 {
		t.Fatalf("a repeated stage acted again: formats %d→%d, mounts %d→%d, %d mounts at the staging path",
			formats, e.dev.Calls(devicetest.Format), mounts, e.dev.Calls(devicetest.Mount), e.mountsAt(v.staging))
	}
	wantErr(t, e.node.Stage(ctx, node.StageRequest{VolumeID: v.ID, StagingPath: v.staging + "2"}), errkind.ErrConflict, "stage at a second path")
	wantErr(t, e.node.Stage(ctx, node.StageRequest{VolumeID: v.ID, StagingPath: v.staging, Block: true}), errkind.ErrConflict, "stage for block access")

	must(t, e.node.Unstage(ctx, v.ID, v.staging))
	e.clean()
	if r := e.record(v.ID); r.Stage != nil {
		t.Fatalf("stage record after unstage: %+v", r.Stage)
	}
	must(t, e.node.Unstage(ctx, v.ID, v.staging))
	wantErr(t, e.node.Stage(ctx, node.StageRequest{VolumeID: v.ID, StagingPath: v.staging, FsType: "xfs"}), errkind.ErrInvalid, "stage of an ext4 volume as xfs")

	// Staged again, the filesystem is found, checked and kept.
	dev = e.stage(v)
	e.mountedFrom(v.staging, dev)
	if e.dev.Calls(devicetest.Format) != formats {
		t.Fatal("a volume with a filesystem was formatted again")
	}
	if e.dev.Calls(devicetest.FsckIfNeeded) == 0 {
		t.Fatal("ext4 mounted without a check")
	}
	must(t, e.node.Unstage(ctx, v.ID, v.staging))
	e.clean()
}

func TestStageNeverFormatsOverForeignData(t *testing.T) {
	for _, c := range []struct{ fs, found string }{{"ext4", "swap"}, {"ext4", "partition-table:dos"}, {"xfs", "ext4"}} {
		t.Run(c.fs+" holding "+c.found, func(t *testing.T) {
			e := newEnv(t)
			v := e.volume(c.fs)
			must(t, devicetest.WriteSignature(e.pool.ImagePath(v.ID), c.found))
			err := e.node.Stage(ctx, node.StageRequest{VolumeID: v.ID, StagingPath: v.staging})
			wantErr(t, err, errkind.ErrInvalid, "stage of a volume holding "+c.found)
			if sig, _ := devicetest.ReadSignature(e.pool.ImagePath(v.ID)); sig == nil || sig.Type != c.found {
				t.Fatalf("the image now holds %+v", sig)
			}
			if n := e.dev.Calls(devicetest.Format); n != 0 {
				t.Fatalf("formatted %d times", n)
			}
			// The failed stage is rolled back: nothing attached or
			// mounted, no record.
			e.clean()
			if r := e.record(v.ID); r.Stage != nil {
				t.Fatalf("stage record: %+v", r.Stage)
			}
		})
	}
}

func TestStageFailureRollsBack(t *testing.T) {
	e := newEnv(t)
	v := e.volume("xfs")
	boom := errors.New("mount: boom")
	e.dev.FailNext(devicetest.Mount, boom)
	if err := e.node.Stage(ctx, node.StageRequest{VolumeID: v.ID, StagingPath: v.staging}); !errors.Is(err, boom) {
		t.Fatalf("stage: %v, want %v", err, boom)
	}
	e.clean()
	if r := e.record(v.ID); r.Stage != nil {
		t.Fatalf("stage record after a failed stage: %+v", r.Stage)
	}
	// kubelet's retry starts clean and uses the filesystem made the first
	// time.
	e.stage(v)
	if n := e.dev.Calls(devicetest.Format); n != 1 {
		t.Fatalf("formatted %d times", n)
	}
}

func TestStageBlock(t *testing.T) {
	e := newEnv(t)
	v := e.volume("ext4")
	must(t, e.node.Stage(ctx, node.StageRequest{VolumeID: v.ID, StagingPath: v.staging, Block: true}))
	dev := e.device(v)
	if e.dev.LoopBackingFile(dev) != e.pool.ImagePath(v.ID) {
		t.Fatalf("%s does not serve the image", dev)
	}
	e.notMounted(v.staging)
	if e.dev.Calls(devicetest.Format) != 0 || e.dev.Calls(devicetest.Probe) != 0 {
		t.Fatal("a block volume's contents were touched")
	}
	must(t, e.node.Unstage(ctx, v.ID, v.staging))
	e.clean()
}

// Growth of a staged volume: xfs online, ext4 offline while no pod has it,
// and refused with the reason when a published ext4 cannot grow online.
func TestExpand(t *testing.T) {
	e := newEnv(t)
	for _, fs := range []string{"xfs", "ext4"} {
		v := e.volume(fs)
		dev := e.stage(v)
		got, err := e.node.Expand(ctx, v.ID, v.staging, 768*size.MiB)
		if err != nil || got != 768*size.MiB {
			t.Fatalf("%s: expand: %d, %v", fs, got, err)
		}
		e.mountedFrom(v.staging, dev)
		if st, _ := e.dev.Statfs(v.staging); st.TotalBytes != 768*size.MiB {
			t.Fatalf("%s: filesystem is %d bytes after growth", fs, st.TotalBytes)
		}
		if r := e.record(v.ID); r.GrowFs {
			t.Fatalf("%s: growth still pending", fs)
		}
	}
	e.dev.SetOnlineExt4Growth(false)
	v := e.volume("ext4")
	e.stage(v)
	must(t, e.publish(v, e.targetPath()))
	_, err := e.node.Expand(ctx, v.ID, v.staging, 1*size.GiB)
	wantErr(t, err, errkind.ErrInUse, "online growth of a published ext4 without CAP_SYS_RESOURCE")
	if r := e.record(v.ID); !r.GrowFs || r.SizeBytes != size.GiB {
		t.Fatalf("the image grew but no growth is pending: %+v", r)
	}
}
