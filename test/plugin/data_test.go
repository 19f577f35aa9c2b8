package plugin_test

import (
	"bytes"
	"crypto/rand"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/podvol/podvol/test/plugintest"
)

func (e *env) snapshot(name, source string) *csi.Snapshot {
	e.t.Helper()
	r, err := e.p.Controller().CreateSnapshot(ctx(e.t), &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: source})
	e.must("CreateSnapshot "+name, err)
	return r.GetSnapshot()
}

func (e *env) createFrom(name string, size int64, c *csi.VolumeCapability, src *csi.VolumeContentSource) (*csi.Volume, error) {
	r, err := e.p.Controller().CreateVolume(ctx(e.t), &csi.CreateVolumeRequest{
		Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: size},
		VolumeCapabilities: []*csi.VolumeCapability{c}, VolumeContentSource: src,
	})
	return r.GetVolume(), err
}

func fromSnapshot(id string) *csi.VolumeContentSource {
	return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: id}}}
}

func fromVolume(id string) *csi.VolumeContentSource {
	return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: id}}}
}

func statfs(t *testing.T, path string) (total int64) {
	var s unix.Statfs_t
	if err := unix.Statfs(path, &s); err != nil {
		t.Fatal(err)
	}
	return int64(s.Blocks) * s.Bsize
}

// TestSnapshotAndCloneContent: a snapshot and a clone hold exactly the
// source's data at that moment; later writes on either side stay there; a
// snapshot outlives its source; a restore into a larger volume has a grown
// filesystem. On the ext4 root (sparse copy) and on an XFS pool (reflink).
func TestSnapshotAndCloneContent(t *testing.T) {
	for _, pool := range []string{"", "xfs"} {
		for _, fs := range []string{"ext4", "xfs"} {
			name := "copy-pool/" + fs
			if pool == "xfs" {
				name = "reflink-pool/" + fs
			}
			t.Run(name, func(t *testing.T) {
				e := newEnv(t, plugintest.Options{PoolDir: pool})
				want := "sparse copies"
				if pool == "xfs" {
					want = "share extents"
				}
				if !bytes.Contains([]byte(e.p.Log()), []byte(want)) {
					t.Fatalf("plugin did not log that copies %s:\n%s", want, e.p.Log())
				}
				c := mountCap(fs, csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
				a := e.create("a", 400<<20, c, nil).GetVolumeId()
				e.up(a, c)
				blob := make([]byte, 8<<20)
				_, _ = rand.Read(blob)
				writeFile(t, filepath.Join(e.target(a), "blob"), string(blob))
				writeFile(t, filepath.Join(e.target(a), "f"), "v1")

				// Taken while published and just written: the freeze
				// makes it consistent without unmounting.
				s := e.snapshot("s1", a).GetSnapshotId()
				writeFile(t, filepath.Join(e.target(a), "f"), "v2")
				clone, err := e.createFrom("clone", 400<<20, c, fromVolume(a))
				e.must("clone", err)
				if clone.GetContentSource().GetVolume().GetVolumeId() != a {
					t.Fatalf("clone does not name its source: %v", clone.GetContentSource())
				}
				restored, err := e.createFrom("restored", 800<<20, c, fromSnapshot(s))
				e.must("restore", err)
				_, err = e.createFrom("too-small", 300<<20, c, fromSnapshot(s))
				wantCode(t, "restore into a smaller volume", err, codes.OutOfRange)

				for _, id := range []string{clone.GetVolumeId(), restored.GetVolumeId()} {
					e.up(id, c)
				}
				check := func(id, file, want string) {
					t.Helper()
					if got := readFile(t, filepath.Join(e.target(id), file)); got != want {
						t.Fatalf("%s/%s: %q, want %q", id, file, got, want)
					}
				}
				check(restored.GetVolumeId(), "f", "v1")
				check(clone.GetVolumeId(), "f", "v2")
				check(restored.GetVolumeId(), "blob", string(blob))
				check(clone.GetVolumeId(), "blob", string(blob))
				if total := statfs(t, e.target(restored.GetVolumeId())); total < 700<<20 {
					t.Fatalf("restored volume's filesystem is %d bytes: not grown to the 800 MiB volume", total)
				}

				writeFile(t, filepath.Join(e.target(restored.GetVolumeId()), "f"), "restored-only")
				writeFile(t, filepath.Join(e.target(clone.GetVolumeId()), "f"), "clone-only")
				check(a, "f", "v2")
				writeFile(t, filepath.Join(e.target(a), "f"), "source-only")
				check(restored.GetVolumeId(), "f", "restored-only")
				check(clone.GetVolumeId(), "f", "clone-only")

				// The snapshot outlives its source.
				e.down(a)
				again, err := e.createFrom("again", 400<<20, c, fromSnapshot(s))
				e.must("restore after the source is gone", err)
				e.up(again.GetVolumeId(), c)
				check(again.GetVolumeId(), "f", "v1")

				for _, id := range []string{clone.GetVolumeId(), restored.GetVolumeId(), again.GetVolumeId()} {
					e.down(id)
				}
				_, err = e.p.Controller().DeleteSnapshot(ctx(t), &csi.DeleteSnapshotRequest{SnapshotId: s})
				e.must("DeleteSnapshot", err)
				e.assertClean()
				if imgs := e.images(); len(imgs) > 0 {
					t.Fatalf("images left: %v", imgs)
				}
			})
		}
	}
}

// TestCrashWhileFrozen: a plugin killed during a snapshot's copy leaves the
// filesystem frozen; the restart thaws it and rolls the snapshot back.
func TestCrashWhileFrozen(t *testing.T) {
	e := newEnv(t, defaultOpts)
	a := e.create("a", 64<<20, rwo, nil).GetVolumeId()
	e.up(a, rwo)
	e.crash("copy-while-quiesced", func() error {
		_, err := e.p.Controller().CreateSnapshot(ctx(t), &csi.CreateSnapshotRequest{Name: "s", SourceVolumeId: a})
		return err
	})
	done := make(chan error, 1)
	go func() {
		done <- os.WriteFile(filepath.Join(e.target(a), "after"), []byte("x"), 0o644)
	}()
	select {
	case err := <-done:
		e.must("write after restart", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the filesystem is still frozen after the restart")
	}
	r, err := e.p.Controller().ListSnapshots(ctx(t), &csi.ListSnapshotsRequest{})
	e.must("ListSnapshots", err)
	ents, _ := os.ReadDir(filepath.Join(e.p.PoolDir, "snapshots"))
	if len(r.GetEntries())+len(ents) > 0 {
		t.Fatalf("half-made snapshot left: %v, files %v", r.GetEntries(), ents)
	}
	e.down(a)
	e.assertClean()
}

func (e *env) expand(id, path string, size int64) (int64, error) {
	r, err := e.p.Node().NodeExpandVolume(ctx(e.t), &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: path, CapacityRange: &csi.CapacityRange{RequiredBytes: size}})
	return r.GetCapacityBytes(), err
}

func TestExpandXFSOnline(t *testing.T) {
	e := newEnv(t, defaultOpts)
	c := mountCap("xfs", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	id := e.create("x", 300<<20, c, nil).GetVolumeId()
	e.up(id, c)
	writeFile(t, filepath.Join(e.target(id), "f"), "kept")
	before := statfs(t, e.target(id))
	got, err := e.expand(id, e.target(id), 600<<20)
	e.must("expand published xfs", err)
	if got != 600<<20 {
		t.Fatalf("capacity %d", got)
	}
	if after := statfs(t, e.target(id)); after < before+250<<20 {
		t.Fatalf("filesystem %d -> %d bytes: not grown online", before, after)
	}
	if readFile(t, filepath.Join(e.target(id), "f")) != "kept" {
		t.Fatal("data lost")
	}
	_, err = e.expand(id, e.target(id), 500<<20)
	wantCode(t, "shrink", err, codes.OutOfRange)
	e.down(id)
	e.assertClean()
}

func TestExpandExt4(t *testing.T) {
	e := newEnv(t, plugintest.Options{Capacity: "2Gi"})
	c := mountCap("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	id := e.create("e", 200<<20, c, nil).GetVolumeId()
	e.up(id, c)
	writeFile(t, filepath.Join(e.target(id), "f"), "kept")
	before := statfs(t, e.target(id))

	// Published: online growth, which this host may forbid.
	_, err := e.expand(id, e.target(id), 300<<20)
	if hasCapSysResource() {
		e.must("online ext4 growth", err)
	} else {
		wantCode(t, "online ext4 growth without CAP_SYS_RESOURCE", err, codes.FailedPrecondition)
		if !bytes.Contains([]byte(err.Error()), []byte("CAP_SYS_RESOURCE")) {
			t.Fatalf("the refusal does not name the reason: %v", err)
		}
	}
	// Staged but not published (kubelet expands between stage and
	// publish): offline growth, everywhere.
	e.must("unpublish", e.unpublish(id))
	_, err = e.expand(id, e.staging(id), 400<<20)
	e.must("offline ext4 growth", err)
	e.must("publish", e.publish(id, c))
	if after := statfs(t, e.target(id)); after < before+150<<20 {
		t.Fatalf("filesystem %d -> %d bytes: not grown", before, after)
	}
	// Not staged at all: the image grows now, the filesystem at the next
	// stage.
	e.must("unpublish", e.unpublish(id))
	e.must("unstage", e.unstage(id))
	_, err = e.expand(id, e.staging(id), 600<<20)
	e.must("expand unstaged", err)
	e.up(id, c)
	if after := statfs(t, e.target(id)); after < 500<<20 {
		t.Fatalf("filesystem is %d bytes after growth while unstaged", after)
	}
	if readFile(t, filepath.Join(e.target(id), "f")) != "kept" {
		t.Fatal("data lost")
	}
	// Growth beyond the pool names the numbers.
	_, err = e.expand(id, e.target(id), 3<<30)
	wantCode(t, "growth beyond the pool", err, codes.ResourceExhausted)
	if !bytes.Contains([]byte(err.Error()), []byte("free")) {
		t.Fatalf("no numbers in %v", err)
	}
	e.down(id)
	e.assertClean()
}

func TestExpandBlock(t *testing.T) {
	e := newEnv(t, defaultOpts)
	c := blockCap()
	id := e.create("b", 32<<20, c, nil).GetVolumeId()
	e.up(id, c)
	_, err := e.expand(id, e.target(id), 64<<20)
	e.must("expand block", err)
	st, err := e.p.Node().NodeGetVolumeStats(ctx(t), &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: e.target(id)})
	e.must("stats", err)
	if got := st.GetUsage()[0].GetTotal(); got != 64<<20 {
		t.Fatalf("device is %d bytes after growth", got)
	}
	e.down(id)
	e.assertClean()
}

func hasCapSysResource() bool {
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range bytes.Split(b, []byte("\n")) {
		if v, ok := bytes.CutPrefix(l, []byte("CapEff:")); ok {
			var bits uint64
			for _, ch := range bytes.TrimSpace(v) {
				bits <<= 4
				switch {
				case ch >= '0' && ch <= '9':
					bits |= uint64(ch - '0')
				default:
					bits |= uint64(ch-'a') + 10
				}
			}
			return bits&(1<<24) != 0
		}
	}
	return false
}
