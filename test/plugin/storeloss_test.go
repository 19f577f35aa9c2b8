package plugin_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moby/sys/mountinfo"

	"github.com/podvol/podvol/internal/store"
	"github.com/podvol/podvol/test/plugintest"
)

// TestLostStoreDeletesNothing: with podvol.db missing, or replaced by an
// empty one, the plugin refuses to start and deletes no image; it adopts
// the images back on request, with their data, and deletes unknown images
// only when told to, never a file it did not make.
func TestLostStoreDeletesNothing(t *testing.T) {
	e := newEnv(t, defaultOpts)
	a := e.create("pvc-a", 64<<20, rwo, nil).GetVolumeId()
	b := e.create("pvc-b", 300<<20, mountCap("xfs", rwo.GetAccessMode().GetMode()), nil).GetVolumeId()
	for _, id := range []string{a, b} {
		e.up(id, rwo)
		writeFile(t, filepath.Join(e.target(id), "f"), "data of "+id)
		e.must("unpublish", e.unpublish(id))
		e.must("unstage", e.unstage(id))
	}
	e.p.Stop()
	images := e.images()
	db := filepath.Join(e.p.PoolDir, "podvol.db")
	args := []string{"--endpoint", e.p.Endpoint, "--node-id", node, "--pool-dir", e.p.PoolDir, "--capacity", "200Gi", "--force-capacity"}

	refused := func(what string) {
		t.Helper()
		out, err := plugintest.RunOnce(t, args...)
		if err == nil || !strings.Contains(out, "Nothing was deleted") || !strings.Contains(out, "--unknown-images=adopt") || !strings.Contains(out, a) {
			t.Fatalf("%s: plugin start: err=%v, want a refusal that explains; output:\n%s", what, err, out)
		}
		if got := e.images(); !slices.Equal(got, images) {
			t.Fatalf("%s: images %v after the refused start, want %v", what, got, images)
		}
	}
	if err := os.Remove(db); err != nil {
		t.Fatal(err)
	}
	refused("store missing")
	// The refused start above must not have left a store behind that would
	// let the next start go ahead; make an empty one on purpose.
	_ = os.Remove(db)
	s, err := store.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	refused("store empty")

	// Junk and foreign files beside the images.
	stray := filepath.Join(e.p.PoolDir, "volumes", "pv-0123456789abcdef01234567.img")
	foreign := filepath.Join(e.p.PoolDir, "volumes", "operator-notes.txt")
	probe := filepath.Join(e.p.PoolDir, "volumes", ".reflink-probe-123")
	for _, f := range []string{foreign, probe} {
		writeFile(t, f, "x")
	}

	e.p = plugintest.Start(t, plugintest.Options{Dir: e.dir, NodeID: node, Args: []string{"--unknown-images=adopt"}})
	if ids := e.volumeIDs(); !slices.Contains(ids, a) || !slices.Contains(ids, b) {
		t.Fatalf("adopted volumes %v, want %s and %s", ids, a, b)
	}
	for _, id := range []string{a, b} {
		e.up(id, rwo)
		if got := readFile(t, filepath.Join(e.target(id), "f")); got != "data of "+id {
			t.Fatalf("adopted volume %s holds %q", id, got)
		}
		e.down(id)
	}
	if _, err := os.Stat(probe); !os.IsNotExist(err) {
		t.Fatalf("scratch file of a reflink probe left: %v", err)
	}
	e.p.Stop()

	writeFile(t, stray, "an image without a record")
	e.p = plugintest.Start(t, plugintest.Options{Dir: e.dir, NodeID: node, Args: []string{"--unknown-images=delete"}})
	if _, err := os.Stat(stray); !os.IsNotExist(err) {
		t.Fatalf("unknown image not deleted with --unknown-images=delete: %v", err)
	}
	if got := readFile(t, foreign); got != "x" {
		t.Fatalf("a file podvol did not make was touched: %q", got)
	}
	e.assertClean()
}

// A direct-assigned volume adopted after podvol.db was lost is still handed
// to its microVM, not mounted on the host (issue 25, item 8): its
// parameters are kept on its image, not only in the lost store.
func TestAdoptedDirectVolumeStaysDirect(t *testing.T) {
	plugintest.RequireRoot(t)
	var rt *runtime
	e := newEnvArgs(t, func(dir string) []string { rt = newRuntime(t, dir); return rt.args() })
	c := rwop("ext4")
	id := e.create("kata", 64<<20, c, map[string]string{"directAssign": "always"}).GetVolumeId()
	e.must("stage", e.stage(id, c))
	e.must("publish (direct)", e.publishReq(id, c, e.target(id)))
	rt.read(e.target(id))
	e.must("unpublish", e.unpublish(id))
	e.must("unstage", e.unstage(id))
	e.p.Stop()
	if err := os.Remove(filepath.Join(e.p.PoolDir, "podvol.db")); err != nil {
		t.Fatal(err)
	}

	e.p = plugintest.Start(t, plugintest.Options{Dir: e.dir, NodeID: node, Args: append(rt.args(), "--unknown-images=adopt")})
	e.must("stage the adopted volume", e.stage(id, c))
	e.must("publish the adopted volume", e.publishReq(id, c, e.target(id)))
	if ms, _ := mountinfo.GetMounts(mountinfo.SingleEntryFilter(e.target(id))); len(ms) != 0 {
		t.Fatalf("the adopted direct-assigned volume was mounted on the host at %s (%s), not handed to its microVM", e.target(id), ms[0].Source)
	}
	if m := rt.read(e.target(id)); str(t, m, "volume-type") != "directvol" {
		t.Fatalf("mountInfo of the adopted volume: %v", m)
	}
	e.must("unpublish", e.unpublish(id))
	e.must("unstage", e.unstage(id))
	e.must("delete", e.delete(id))
	e.assertClean()
}
