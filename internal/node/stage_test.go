package node_test

import (
	"bytes"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/podvol/podvol/internal/device/devicetest"
	"github.com/podvol/podvol/internal/errkind"
	"github.com/podvol/podvol/internal/node"
	"github.com/podvol/podvol/internal/pool"
	"github.com/podvol/podvol/internal/size"
	"github.com/podvol/podvol/internal/store"
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

// imported is a filesystem volume pulled from another node, made ready
// the way the importer makes it: its image written (data at off, a
// signature of sig if any), its pull recorded complete, finished.
func (e *env) imported(fsType, sig string, data []byte, off int64) *volume {
	e.t.Helper()
	v, err := e.pool.CreateVolume(ctx, pool.CreateRequest{Name: "pvc-" + random(), SizeBytes: 512 * size.MiB, FsType: fsType,
		Source: &store.Source{Kind: store.FromSnapshot, ID: "snap-0123456789abcdef", Node: "node-2"},
		Import: &store.Import{ClaimNamespace: "team-a", ClaimName: "restored", ClaimUID: "uid-restored"}})
	must(e.t, err)
	f, _, err := e.pool.ImportImage(v.ID)
	must(e.t, err)
	defer f.Close()
	const pulled = 256 * size.MiB
	must(e.t, f.Truncate(pulled))
	if len(data) > 0 {
		_, err = f.WriteAt(data, off)
		must(e.t, err)
	}
	if sig != "" {
		must(e.t, devicetest.WriteSignature(e.pool.ImagePath(v.ID), sig))
	}
	must(e.t, e.pool.RecordImport(v.ID, "snap@1", "", pulled, pulled))
	v, err = e.pool.FinishImport(ctx, v.ID)
	must(e.t, err)
	return &volume{Volume: v, staging: e.stagingPath(v.ID), target: e.targetPath()}
}

// A volume pulled from another node is never formatted over its data: one
// whose filesystem is not found (a copy or a source damaged, a raw block
// volume's data) is refused at stage with FAILED_PRECONDITION and left as
// it is; one with its filesystem is mounted; one that holds no data at
// all (its source was never formatted) is formatted as a new volume is.
func TestStageNeverFormatsAnImportedVolume(t *testing.T) {
	data := bytes.Repeat([]byte("a pod's data "), 100000)
	t.Run("data without a filesystem", func(t *testing.T) {
		e := newEnv(t)
		v := e.imported("ext4", "", data, 1*size.MiB)
		before, err := os.ReadFile(e.pool.ImagePath(v.ID))
		must(t, err)
		err = e.node.Stage(ctx, node.StageRequest{VolumeID: v.ID, StagingPath: v.staging})
		wantErr(t, err, errkind.ErrNoFilesystem, "stage of an imported volume without a filesystem")
		for _, w := range []string{"pulled from node node-2", "no ext4 filesystem", "refusing to format"} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error %q does not say %q", err, w)
			}
		}
		if n := e.dev.Calls(devicetest.Format); n != 0 {
			t.Fatalf("formatted %d times", n)
		}
		after, err := os.ReadFile(e.pool.ImagePath(v.ID))
		must(t, err)
		if !bytes.Equal(before, after) {
			t.Fatal("the refused stage changed the image")
		}
		e.clean()
		if r := e.record(v.ID); r.Stage != nil {
			t.Fatalf("stage record: %+v", r.Stage)
		}
		// Staged for block access, its data is the consumer's: no
		// filesystem is looked for.
		must(t, e.node.Stage(ctx, stageBlock(v)))
		must(t, e.node.Unstage(ctx, v.ID, v.staging))
		e.clean()
	})
	t.Run("its filesystem", func(t *testing.T) {
		e := newEnv(t)
		v := e.imported("ext4", "ext4", data, 1*size.MiB)
		e.mountedFrom(v.staging, e.stage(v))
		if n := e.dev.Calls(devicetest.Format); n != 0 {
			t.Fatalf("formatted %d times", n)
		}
		must(t, e.node.Unstage(ctx, v.ID, v.staging))
		e.clean()
	})
	t.Run("no data at all", func(t *testing.T) {
		e := newEnv(t)
		v := e.imported("xfs", "", nil, 0)
		e.mountedFrom(v.staging, e.stage(v))
		if sig, _ := devicetest.ReadSignature(e.pool.ImagePath(v.ID)); sig == nil || sig.Type != "xfs" {
			t.Fatalf("image holds %+v after stage", sig)
		}
		must(t, e.node.Unstage(ctx, v.ID, v.staging))
		e.clean()
	})
}
