package node_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/podvol/podvol/internal/device/devicetest"
	"github.com/podvol/podvol/internal/errkind"
	"github.com/podvol/podvol/internal/pool"
)

// onlyFroze fails unless every freeze so far reached dev's filesystem, each
// was thawed through the handle that froze it, and nothing is left frozen
// or open.
func (e *env) onlyFroze(dev string, freezes int) {
	e.t.Helper()
	log := e.dev.FreezeLog()
	if len(log) != 2*freezes {
		e.t.Fatalf("freeze log: %+v, want %d freezes each followed by its thaw", log, freezes)
	}
	for i := 0; i < len(log); i += 2 {
		f, th := log[i], log[i+1]
		if f.Thaw || !th.Thaw || f.Dev != dev || th.Dev != dev || f.Handle != th.Handle {
			e.t.Fatalf("freeze log: %+v, want freezes of %s only, each thawed through its own handle", log, dev)
		}
	}
	if e.dev.Frozen(dev) || e.dev.OpenHandles() != 0 {
		e.t.Fatalf("after the copy: frozen %v, %d handles open", e.dev.Frozen(dev), e.dev.OpenHandles())
	}
}

func TestQuiesceFreezesOnlyTheVolume(t *testing.T) {
	e := newEnv(t)
	v, other := e.volume("xfs"), e.volume("xfs")
	dev := e.stage(v)
	otherDev := e.stage(other)
	must(t, e.publish(v, v.target))
	undo, err := e.node.Quiesce(v.ID)
	must(t, err)
	if !e.dev.Frozen(dev) || e.dev.Frozen(otherDev) {
		t.Fatalf("while quiesced: %s frozen %v, %s frozen %v", dev, e.dev.Frozen(dev), otherDev, e.dev.Frozen(otherDev))
	}
	undo()
	e.onlyFroze(dev, 1)
}

// A snapshot through the pool copies the volume while it is frozen.
func TestSnapshotIsConsistent(t *testing.T) {
	e := newEnv(t)
	v := e.volume("ext4")
	dev := e.stage(v)
	must(t, e.publish(v, v.target))
	s, err := e.pool.CreateSnapshot(pool.SnapshotRequest{Name: "snap", SourceID: v.ID, Quiesce: e.node.Quiesce})
	must(t, err)
	copies := e.dev.Copies()
	if len(copies) != 1 || copies[0].Dst != e.pool.SnapshotPath(s.ID) || !copies[0].Consistent {
		t.Fatalf("copies: %+v", copies)
	}
	e.onlyFroze(dev, 1)
	// Without quiescing, the fake sees the copy of a live filesystem.
	_, err = e.pool.CreateSnapshot(pool.SnapshotRequest{Name: "unquiesced", SourceID: v.ID})
	must(t, err)
	if c := e.dev.Copies(); c[1].Consistent {
		t.Fatal("the fake did not notice a copy of a mounted, unfrozen filesystem")
	}
}

// Whatever is at the staging path when the volume's own filesystem is not
// (nothing: the node's filesystem; another volume's filesystem), nothing is
// frozen: a freeze there would reach a filesystem that is not the volume's.
func TestQuiesceRefusesWhatIsNotTheVolume(t *testing.T) {
	e := newEnv(t)
	v, other := e.volume("ext4"), e.volume("ext4")
	e.stage(v)
	e.stage(other)

	must(t, e.dev.Unmount(v.staging))
	_, err := e.node.Quiesce(v.ID)
	wantErr(t, err, errkind.ErrNotStaged, "quiesce with the staging mount gone")

	// Another volume's filesystem bound where this one's should be.
	must(t, e.dev.Mount(ctx, other.staging, v.staging, "", []string{"bind"}))
	_, err = e.node.Quiesce(v.ID)
	wantErr(t, err, errkind.ErrNotStaged, "quiesce with another volume at the staging path")
	must(t, e.dev.Unmount(v.staging))
	if log := e.dev.FreezeLog(); len(log) != 0 {
		t.Fatalf("froze: %+v", log)
	}
	if e.dev.OpenHandles() != 0 {
		t.Fatal("a handle was left open")
	}
}

// A volume assigned to a microVM is copied crash-consistent: the guest owns
// its filesystem, and the staging directory is then only a directory on the
// node's filesystem, which must never be frozen.
func TestQuiesceOfAnAssignedVolumeFreezesNothing(t *testing.T) {
	e := newEnv(t)
	e.dev.SetReflink(true)
	e.restart()
	v := e.volume("ext4")
	e.stage(v)
	must(t, e.publish(v, v.target, direct))
	syncs := e.dev.Calls(devicetest.SyncDevice)
	undo, err := e.node.Quiesce(v.ID)
	must(t, err)
	undo()
	if log := e.dev.FreezeLog(); len(log) != 0 {
		t.Fatalf("froze: %+v", log)
	}
	if e.dev.Calls(devicetest.SyncDevice) != syncs+1 {
		t.Fatal("the device's page cache was not flushed for the copy")
	}
}

// A raw block volume in use is only flushed (nothing holds its writes):
// on a reflink pool its atomic copy is one instant; without reflink it is
// refused, saying why and what to do. Unstaged or detached, nothing writes
// it: no flush, no refusal.
func TestQuiesceOfBlockAndUnstagedVolumes(t *testing.T) {
	for _, reflink := range []bool{true, false} {
		t.Run(map[bool]string{true: "reflink", false: "no-reflink"}[reflink], func(t *testing.T) {
			e := newEnv(t)
			e.dev.SetReflink(reflink)
			e.restart()
			block, unstaged, detached := e.volume("ext4"), e.volume("ext4"), e.volume("ext4")
			must(t, e.node.Stage(ctx, stageBlock(block)))
			e.stage(detached)
			must(t, e.dev.Unmount(detached.staging))
			must(t, e.dev.DetachLoop(e.device(detached), e.pool.ImagePath(detached.ID)))
			for _, v := range []*volume{unstaged, detached} {
				undo, err := e.node.Quiesce(v.ID)
				must(t, err)
				undo()
			}
			undo, err := e.node.Quiesce(block.ID)
			if !reflink {
				wantErr(t, err, errkind.ErrInUse, "quiesce of a raw block volume in use on a pool without reflink")
				for _, says := range []string{block.ID, "raw block volume in use", "no reflink", "stop the pod", "XFS or btrfs"} {
					if !strings.Contains(err.Error(), says) {
						t.Errorf("the refusal %q does not say %q", err, says)
					}
				}
			} else {
				must(t, err)
				undo()
			}
			if log := e.dev.FreezeLog(); len(log) != 0 {
				t.Fatalf("froze: %+v", log)
			}
			if n, want := e.dev.Calls(devicetest.SyncDevice), map[bool]int{true: 1, false: 0}[reflink]; n != want {
				t.Fatalf("%d device flushes, want %d", n, want)
			}
		})
	}
}

// A group is one instant if all its members' writes are held while they
// are copied, or all but one, copied atomically meanwhile. Two raw block
// members in use are refused before anything is frozen or flushed, naming
// them; one with a mounted member is cut (the mounted one frozen, the
// block one flushed), and so are two that are not staged.
func TestQuiesceGroupWithBlockMembers(t *testing.T) {
	e := newEnv(t)
	e.dev.SetReflink(true)
	e.restart()
	a, b, m, idle := e.volume("ext4"), e.volume("ext4"), e.volume("ext4"), e.volume("ext4")
	must(t, e.node.Stage(ctx, stageBlock(a)))
	must(t, e.node.Stage(ctx, stageBlock(b)))
	dev := e.stage(m)

	_, err := e.node.QuiesceGroup([]string{a.ID, m.ID, b.ID}, time.Minute)
	wantErr(t, err, errkind.ErrInUse, "a group of two raw block volumes in use")
	for _, says := range []string{a.ID, b.ID, "raw block", "one instant", "stop the pods"} {
		if !strings.Contains(err.Error(), says) {
			t.Errorf("the refusal %q does not say %q", err, says)
		}
	}
	if log := e.dev.FreezeLog(); len(log) != 0 || e.dev.Calls(devicetest.SyncDevice) != 0 {
		t.Fatalf("the refused group froze %+v and flushed %d devices", log, e.dev.Calls(devicetest.SyncDevice))
	}

	undo, err := e.node.QuiesceGroup([]string{b.ID, m.ID, idle.ID}, time.Minute)
	must(t, err)
	if !e.dev.Frozen(dev) || e.dev.Calls(devicetest.SyncDevice) != 1 {
		t.Fatalf("a group of a mounted and a raw block volume: mounted frozen %v, %d flushes", e.dev.Frozen(dev), e.dev.Calls(devicetest.SyncDevice))
	}
	undo()
	e.onlyFroze(dev, 1)

	must(t, e.node.Unstage(ctx, a.ID, a.staging))
	must(t, e.node.Unstage(ctx, b.ID, b.staging))
	undo, err = e.node.QuiesceGroup([]string{a.ID, b.ID}, time.Minute)
	must(t, err)
	undo()
}

func TestQuiesceFreezeFailure(t *testing.T) {
	e := newEnv(t)
	v := e.volume("ext4")
	e.stage(v)
	e.dev.FailNext(devicetest.Freeze, unix.EIO)
	if _, err := e.node.Quiesce(v.ID); err == nil {
		t.Fatal("quiesce succeeded without a freeze")
	}
	if e.dev.OpenHandles() != 0 {
		t.Fatal("the handle of a failed freeze was left open")
	}
	// The copy of a snapshot whose freeze failed is not made.
	_, err := e.pool.CreateSnapshot(pool.SnapshotRequest{Name: "s", SourceID: v.ID, Quiesce: func(string) (func(), error) {
		e.dev.FailNext(devicetest.Freeze, unix.EIO)
		return e.node.Quiesce(v.ID)
	}})
	if err == nil || len(e.dev.Copies()) != 0 {
		t.Fatalf("snapshot: %v, copies %+v", err, e.dev.Copies())
	}
	if snaps, _ := e.pool.Store().Snapshots(); len(snaps) != 0 {
		t.Fatalf("snapshot records left: %d", len(snaps))
	}
}

// Without reflink a copy of an assigned volume would be torn by the guest's
// writes: refused, and nothing frozen.
func TestQuiesceOfAnAssignedVolumeOnACopyPool(t *testing.T) {
	e := newEnv(t)
	v := e.volume("ext4")
	e.stage(v)
	must(t, e.publish(v, v.target, direct))
	if _, err := e.node.Quiesce(v.ID); !errors.Is(err, errkind.ErrInUse) {
		t.Fatalf("quiesce of an assigned volume on a pool without reflink: %v, want in use", err)
	}
	if log := e.dev.FreezeLog(); len(log) != 0 {
		t.Fatalf("froze: %+v", log)
	}
}
