package node_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/podvol/podvol/internal/device"
	"github.com/podvol/podvol/internal/store"
)

// crashAt rewrites a stage record as a crash would have left it.
func (e *env) crashAt(v *volume, state string) {
	e.t.Helper()
	_, err := e.pool.Store().Update(v.ID, func(r *store.Volume) error {
		r.Stage.State = state
		return nil
	})
	must(e.t, err)
}

// A stage caught half-way (loop device and mount made, record still
// "staging") is rolled back at start; kubelet's retry stages afresh.
func TestRecoverRollsBackHalfMadeStages(t *testing.T) {
	e := newEnv(t)
	mounted, attached := e.volume("ext4"), e.volume("ext4")
	e.stage(mounted)
	e.crashAt(mounted, store.Staging)
	// Crashed after the loop device, before the mount.
	e.stage(attached)
	must(t, e.dev.Unmount(attached.staging))
	e.crashAt(attached, store.Staging)

	e.restart()
	must(t, e.node.Recover(ctx))
	e.clean()
	for _, v := range []*volume{mounted, attached} {
		if r := e.record(v.ID); r.Stage != nil {
			t.Fatalf("stage record of %s: %+v", v.ID, r.Stage)
		}
	}
	dev := e.stage(mounted)
	e.mountedFrom(mounted.staging, dev)
}

// A reboot takes every loop device and mount: staged volumes get theirs
// back before the plugin serves, and publications whose bind mount is gone
// are forgotten (kubelet publishes again).
func TestRecoverRestoresStagesAfterReboot(t *testing.T) {
	e := newEnv(t)
	fs, block := e.volume("ext4"), e.volume("ext4")
	e.stage(fs)
	must(t, e.publish(fs, fs.target))
	must(t, e.node.Stage(ctx, stageBlock(block)))
	e.dev.Reboot()

	e.restart()
	must(t, e.node.Recover(ctx))
	dev := e.device(fs)
	e.mountedFrom(fs.staging, dev)
	if r := e.record(fs.ID); len(r.Publications) != 0 {
		t.Fatalf("publication of a gone bind mount kept: %v", r.Publications)
	}
	if b := e.device(block); e.dev.LoopBackingFile(b) != e.pool.ImagePath(block.ID) {
		t.Fatalf("block volume not attached again: %s", b)
	}
	e.notMounted(block.staging)
	if n := len(e.dev.MountTable()); n != 1 {
		t.Fatalf("mounts after recovery: %+v", e.dev.MountTable())
	}
}

// A crash while a snapshot's copy runs leaves the filesystem frozen and
// every writer in the pod hanging; the restart thaws it.
func TestRecoverThawsAFrozenFilesystem(t *testing.T) {
	e := newEnv(t)
	v := e.volume("xfs")
	dev := e.stage(v)
	// The crashed process's descriptor is gone; the freeze is not.
	h, err := e.dev.OpenFilesystemOn(v.staging, dev)
	must(t, err)
	must(t, h.Freeze())
	must(t, h.Close())

	e.restart()
	must(t, e.node.Recover(ctx))
	if e.dev.Frozen(dev) {
		t.Fatal("still frozen after recovery")
	}
	e.mountedFrom(v.staging, dev)
}

// Publications caught half-way are kept if their bind mount exists.
func TestRecoverInterruptedPublish(t *testing.T) {
	e := newEnv(t)
	v := e.volume("ext4")
	e.stage(v)
	done, lost := v.target, e.targetPath()
	must(t, e.publish(v, done))
	must(t, e.publish(v, lost))
	must(t, e.dev.Unmount(lost))
	_, err := e.pool.Store().Update(v.ID, func(r *store.Volume) error {
		for _, p := range r.Publications {
			p.State = store.Publishing
		}
		return nil
	})
	must(t, err)

	e.restart()
	must(t, e.node.Recover(ctx))
	r := e.record(v.ID)
	if p := r.Publications[done]; p == nil || p.State != store.Published {
		t.Fatalf("publication with its mount: %+v", p)
	}
	if p := r.Publications[lost]; p != nil {
		t.Fatalf("publication without its mount kept: %+v", p)
	}
}

// Loop devices of pool images that no stage owns are detached at start;
// another program's loop device is none of the plugin's business, and
// neither is a mounted one.
func TestRecoverDetachesOrphanLoops(t *testing.T) {
	e := newEnv(t)
	orphan, staged := e.volume("ext4"), e.volume("ext4")
	stagedDev := e.stage(staged)
	orphanDev, err := e.dev.AttachLoop(e.pool.ImagePath(orphan.ID), device.LoopOptions{})
	must(t, err)
	foreign := filepath.Join(t.TempDir(), "someone-elses.img")
	must(t, os.WriteFile(foreign, make([]byte, 1<<20), 0o600))
	foreignDev, err := e.dev.AttachLoop(foreign, device.LoopOptions{})
	must(t, err)

	e.restart()
	must(t, e.node.Recover(ctx))
	if b := e.dev.LoopBackingFile(orphanDev); b != "" {
		t.Fatalf("orphan %s still serves %s", orphanDev, b)
	}
	if e.dev.LoopBackingFile(foreignDev) != foreign {
		t.Fatal("another program's loop device was detached")
	}
	if e.dev.LoopBackingFile(stagedDev) != e.pool.ImagePath(staged.ID) {
		t.Fatal("a staged volume's loop device was detached")
	}
	e.mountedFrom(staged.staging, stagedDev)
}

// An assignment recorded but never written (a crash in between) is rolled
// back: the staging mount comes back.
func TestRecoverInterruptedDirectAssignment(t *testing.T) {
	e := newEnv(t)
	v := e.volume("ext4")
	dev := e.stage(v)
	must(t, e.publish(v, v.target, direct))
	_, err := e.pool.Store().Update(v.ID, func(r *store.Volume) error {
		r.Publications[v.target].State = store.Publishing
		return nil
	})
	must(t, err)
	must(t, os.RemoveAll(e.shim.Root)) // never written

	e.restart()
	must(t, e.node.Recover(ctx))
	e.mountedFrom(v.staging, dev)
	if r := e.record(v.ID); len(r.Publications) != 0 {
		t.Fatalf("publications: %v", r.Publications)
	}
}
