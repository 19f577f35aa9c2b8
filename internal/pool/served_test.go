package pool_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/podvol/podvol/internal/device/devicetest"
	"github.com/podvol/podvol/internal/pool"
)

// A start that would forget volumes is refused, naming what is wrong, and
// the refusal reads the directories only: pools swapped, a pool left out,
// a pool's disk not mounted (an empty directory in its place).
func TestCheckServed(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	for _, s := range []pool.Served{{Name: "default", Dir: a}, {Name: "fast", Dir: b}} {
		p, err := pool.Open(pool.Config{Name: s.Name, Dir: s.Dir, Capacity: 10 * GiB, Device: devicetest.New()})
		must(t, err)
		must(t, p.RecordServedWith([]string{"default", "fast"}))
		must(t, p.Close())
	}
	empty := filepath.Join(dir, "empty")
	must(t, os.Mkdir(empty, 0o700))
	for _, c := range []struct {
		name   string
		pools  []pool.Served
		forget []string
		want   string // "" for no error
	}{
		{"as before", []pool.Served{{"default", a}, {"fast", b}}, nil, ""},
		{"swapped", []pool.Served{{"default", b}, {"fast", a}}, nil, `directory ` + b + ` holds pool "fast", and is given as pool "default"`},
		{"left out", []pool.Served{{"default", a}}, nil, `pool "fast" was served before, together with pool default`},
		{"left out, forgotten", []pool.Served{{"default", a}}, []string{"fast"}, ""},
		{"disk not mounted", []pool.Served{{"default", a}, {"fast", empty}}, nil, `pool "fast" was served before (pool default's record says so), yet its directory ` + empty + ` holds no store`},
		{"a new pool", []pool.Served{{"default", a}, {"fast", b}, {"bulk", empty}}, nil, ""},
	} {
		err := pool.CheckServed(c.pools, c.forget)
		if (err == nil) != (c.want == "") || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
	if ents, _ := os.ReadDir(empty); len(ents) != 0 {
		t.Errorf("the checks wrote into %s: %v", empty, ents)
	}
	must(t, os.WriteFile(filepath.Join(a, "served-with"), nil, 0o600))
	if err := pool.CheckServed([]pool.Served{{"default", a}, {"fast", b}}, nil); err == nil || !strings.Contains(err.Error(), "is empty") {
		t.Errorf("an empty record: %v, want a refusal", err)
	}
}
