package pool_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/podvol/podvol/internal/device/devicetest"
	"github.com/podvol/podvol/internal/pool"
)

func TestIDs(t *testing.T) {
	const hex = "0123456789abcdef01234567"
	for _, c := range []struct {
		id, pool          string
		volume, snap, grp bool
	}{
		{"pv-" + hex, pool.DefaultName, true, false, false}, // made before pools had names
		{"snap-" + hex, pool.DefaultName, false, true, false},
		{"group-" + hex, pool.DefaultName, false, false, true},
		{"pv-fast-" + hex, "fast", true, false, false},
		{"snap-nvme0-" + hex, "nvme0", false, true, false},
		{"group-a-" + hex, "a", false, false, true},
		{"pv-default-" + hex, "", false, false, false}, // one spelling per id
		{"pv-Fast-" + hex, "", false, false, false},
		{"pv-" + strings.Repeat("a", 17) + "-" + hex, "", false, false, false},
		{"pv--" + hex, "", false, false, false},
		{"pv-fast-" + hex[1:], "", false, false, false},
		{"pv-../x-" + hex, "", false, false, false},
		{"vol-fast-" + hex, "", false, false, false},
	} {
		name, ok := pool.PoolOf(c.id)
		if name != c.pool || ok != (c.pool != "") {
			t.Errorf("PoolOf(%q) = %q, %v; want %q", c.id, name, ok, c.pool)
		}
		if pool.ValidID(c.id) != c.volume || pool.ValidSnapshotID(c.id) != c.snap || pool.ValidGroupID(c.id) != c.grp {
			t.Errorf("%q: volume %v snapshot %v group %v; want %v %v %v", c.id,
				pool.ValidID(c.id), pool.ValidSnapshotID(c.id), pool.ValidGroupID(c.id), c.volume, c.snap, c.grp)
		}
	}
}

// A named pool's ids say its name; the default pool's keep today's form;
// neither takes the other's ids for its own.
func TestNamedPoolIDs(t *testing.T) {
	dir := t.TempDir()
	if _, err := pool.Open(pool.Config{Name: "Fast", Dir: filepath.Join(dir, "x"), Device: devicetest.New()}); err == nil || !strings.Contains(err.Error(), "pool name") {
		t.Fatalf("a pool named Fast: %v, want a refusal of the name", err)
	}
	open := func(name string) *pool.Pool {
		p, err := pool.Open(pool.Config{Name: name, Dir: filepath.Join(dir, name+"-pool"), Capacity: 10 * GiB, Device: devicetest.New()})
		must(t, err)
		t.Cleanup(func() { must(t, p.Close()) })
		return p
	}
	def, fast := open(""), open("fast")
	if def.Name() != pool.DefaultName || fast.Name() != "fast" {
		t.Fatalf("names %q %q", def.Name(), fast.Name())
	}
	for _, c := range []struct {
		p      *pool.Pool
		prefix string
		other  *pool.Pool
	}{{def, "pv-", fast}, {fast, "pv-fast-", def}} {
		v, err := c.p.CreateVolume(ctx, pool.CreateRequest{Name: "v", SizeBytes: 64 * MiB, FsType: "ext4"})
		must(t, err)
		if !strings.HasPrefix(v.ID, c.prefix) || !pool.ValidID(v.ID) || !c.p.Owns(v.ID) || c.other.Owns(v.ID) {
			t.Errorf("pool %s made volume %q: want prefix %q, owned by it alone", c.p.Name(), v.ID, c.prefix)
		}
		s, err := c.p.CreateSnapshot(pool.SnapshotRequest{Name: "s", SourceID: v.ID})
		must(t, err)
		if name, _ := pool.PoolOf(s.ID); name != c.p.Name() || !pool.ValidSnapshotID(s.ID) {
			t.Errorf("pool %s made snapshot %q", c.p.Name(), s.ID)
		}
		if _, err := c.other.ReadyVolume(v.ID); err == nil {
			t.Errorf("pool %s finds pool %s's volume %s", c.other.Name(), c.p.Name(), v.ID)
		}
	}
}
