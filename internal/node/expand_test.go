package node_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/podvol/podvol/internal/device/devicetest"
	"github.com/podvol/podvol/internal/directvolume"
	"github.com/podvol/podvol/internal/errkind"
	"github.com/podvol/podvol/internal/size"
)

// Growth of a direct-assigned volume in kubelet's order: published, then
// NodeExpandVolume at the target before a sandbox has taken it. The
// filesystem grows on the host, unmounted (xfs at a private mount that is
// gone again), so the guest gets it; once a sandbox has the volume, growth
// goes to the runtime, and without one answering it is refused as before.
func TestExpandAssignedBeforeSandbox(t *testing.T) {
	e := newEnv(t)
	for _, fs := range []string{"ext4", "xfs"} {
		v := e.volume(fs)
		e.stage(v)
		must(t, e.publish(v, v.target, direct))
		got, err := e.node.Expand(ctx, v.ID, v.target, 768*size.MiB)
		if err != nil || got != 768*size.MiB {
			t.Fatalf("%s: expand before the sandbox: %d, %v", fs, got, err)
		}
		if m := e.dev.MountTable(); len(m) != 0 {
			t.Fatalf("%s: mounts left while assigned: %+v", fs, m)
		}
		if ents, _ := os.ReadDir(filepath.Join(e.poolDir, "growing")); len(ents) != 0 {
			t.Fatalf("%s: private growth mounts left: %v", fs, ents)
		}
		if r := e.record(v.ID); r.GrowFs {
			t.Fatalf("%s: growth still pending", fs)
		}
		// Repeated: nothing to do, the same answer.
		if got, err := e.node.Expand(ctx, v.ID, v.target, 768*size.MiB); err != nil || got != 768*size.MiB {
			t.Fatalf("%s: repeated expand: %d, %v", fs, got, err)
		}

		// A sandbox has taken it: the runtime's business; here no shim
		// answers, so the refusal of old.
		must(t, os.WriteFile(filepath.Join(directvolume.Dir(e.shim.Root, v.target), "sandbox-1"), nil, 0o600))
		_, err = e.node.Expand(ctx, v.ID, v.target, size.GiB)
		wantErr(t, err, errkind.ErrInUse, fs+": growth once a sandbox has the volume")
		if !strings.Contains(err.Error(), "not running in a sandbox yet") {
			t.Fatalf("%s: %v", fs, err)
		}
		if m := e.dev.MountTable(); len(m) != 0 {
			t.Fatalf("%s: the host mounted a volume a sandbox has: %+v", fs, m)
		}
		if r := e.record(v.ID); !r.GrowFs {
			t.Fatalf("%s: the refused growth is not pending for the next host stage", fs)
		}

		// The assignment ends: the host stage grows what the guest could not.
		must(t, e.node.Unpublish(ctx, v.ID, v.target))
		if st, _ := e.dev.Statfs(v.staging); st.TotalBytes != size.GiB {
			t.Fatalf("%s: filesystem is %d bytes after the assignment", fs, st.TotalBytes)
		}
		must(t, e.node.Unstage(ctx, v.ID, v.staging))
	}
	e.clean()
}

// A failed xfs growth at the private mount leaves no mount behind, keeps the
// growth pending, and the retry does it; a private mount that a crash left is
// removed at the next start before anything else.
func TestExpandAssignedXFSFailureAndRecovery(t *testing.T) {
	e := newEnv(t)
	v := e.volume("xfs")
	dev := e.stage(v)
	must(t, e.publish(v, v.target, direct))
	e.dev.FailNext(devicetest.GrowOnline, errors.New("xfs_growfs: boom"))
	_, err := e.node.Expand(ctx, v.ID, v.target, 768*size.MiB)
	if err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("expand with a failing xfs_growfs: %v", err)
	}
	if m := e.dev.MountTable(); len(m) != 0 {
		t.Fatalf("mounts left after the failure: %+v", m)
	}
	if r := e.record(v.ID); !r.GrowFs {
		t.Fatal("the failed growth is not pending")
	}
	got, err := e.node.Expand(ctx, v.ID, v.target, 768*size.MiB)
	if err != nil || got != 768*size.MiB {
		t.Fatalf("retry: %d, %v", got, err)
	}

	// What a crash at the private mount leaves: the mount.
	grow := filepath.Join(e.poolDir, "growing", v.ID)
	must(t, os.MkdirAll(grow, 0o700))
	must(t, e.dev.Mount(ctx, dev, grow, "xfs", []string{"nouuid"}))
	e.restart()
	must(t, e.node.Recover(ctx))
	if m := e.dev.MountTable(); len(m) != 0 {
		t.Fatalf("mounts left after recovery: %+v", m)
	}
	if _, err := os.Stat(grow); !os.IsNotExist(err) {
		t.Fatalf("private growth directory left: %v", err)
	}
	must(t, e.node.Unpublish(ctx, v.ID, v.target))
	must(t, e.node.Unstage(ctx, v.ID, v.staging))
	e.clean()
}
