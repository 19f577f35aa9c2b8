package main

import (
	"maps"
	"strconv"
	"strings"
	"testing"

	"github.com/podvol/podvol/internal/pool"
)

func TestPoolSpecs(t *testing.T) {
	for _, c := range []struct {
		flags      []string
		poolDir    string
		poolDirSet bool
		capacity   string
		want       string // name=dir:capacity, space-separated; or the error's text
	}{
		{nil, "/var/lib/podvol", false, "", "default=/var/lib/podvol:0"},
		{nil, "/p", true, "1Gi", "default=/p:1073741824"},
		{[]string{"fast=/nvme/podvol,capacity=2Gi"}, "/var/lib/podvol", false, "", "fast=/nvme/podvol:2147483648"},
		{[]string{"fast=/nvme"}, "/p", true, "", "fast=/nvme:0 default=/p:0"},
		{[]string{"default=/a", "fast=/b"}, "/var/lib/podvol", false, "", "default=/a:0 fast=/b:0"},
		{[]string{"fast=/b"}, "/var/lib/podvol", false, "1Gi", "--capacity is the capacity of the pool named default, which is not given"},
		// --capacity is the default pool's however it is given (the
		// chart gives it as --pool default=...).
		{[]string{"default=/a", "fast=/b,capacity=2Gi"}, "", false, "1Gi", "default=/a:1073741824 fast=/b:2147483648"},
		{[]string{"default=/a,capacity=2Gi"}, "", false, "1Gi", "the default pool's capacity is given twice"},
		{[]string{"fast=/b,node-label=disk=nvme,node-label=zone=a,capacity=1Gi"}, "", false, "", "fast=/b:1073741824"},
		{[]string{"fast=/b,node-label=disk"}, "", false, "", "want node-label=KEY=VALUE"},
		{[]string{"default=/a"}, "/p", true, "", "pool default is given twice: by --pool-dir and by --pool"},
		{[]string{"fast=/a", "fast=/b"}, "", false, "", "pool fast is given twice"},
		{[]string{"a=/x", "b=/x/"}, "", false, "", "have one directory, /x"},
		{[]string{"a=/x", "b=/x/y"}, "", false, "", "one's directory is inside the other's"},
		{[]string{"a=/xy", "b=/x"}, "", false, "", "a=/xy:0 b=/x:0"},
		{[]string{"Fast=/x"}, "", false, "", "must be 1 to 16 lower-case letters and digits"},
		{[]string{"default-2=/x"}, "", false, "", "must be 1 to 16 lower-case letters and digits"},
		{[]string{"fast=rel/dir"}, "", false, "", "must be an absolute path"},
		{[]string{"fast=/x,size=1Gi"}, "", false, "", `unknown option "size=1Gi"`},
		{[]string{"fast"}, "", false, "", "want NAME=DIR[,capacity=SIZE][,node-label=KEY=VALUE]..."},
		{[]string{"fast=/x,capacity=lots"}, "", false, "", "want a positive quantity"},
	} {
		specs, err := poolSpecs(c.flags, c.poolDir, c.poolDirSet, c.capacity)
		var got string
		if err != nil {
			got = err.Error()
		} else {
			var parts []string
			for _, s := range specs {
				parts = append(parts, s.name+"="+s.dir+":"+strconv.FormatInt(s.capacity, 10))
			}
			got = strings.Join(parts, " ")
		}
		// Specs are spelled name=dir:capacity, whose "=/" no error has.
		wantSpecs := strings.Contains(c.want, "=/")
		if (err == nil) != wantSpecs || (wantSpecs && got != c.want) || !strings.Contains(got, c.want) {
			t.Errorf("poolSpecs(%q, %q, %v, %q) = %q, want %q", c.flags, c.poolDir, c.poolDirSet, c.capacity, got, c.want)
		}
	}
}

// A pool with node labels is served only on nodes that have them all.
func TestOnThisNode(t *testing.T) {
	specs, err := poolSpecs([]string{"default=/a", "fast=/b,node-label=disk=nvme,node-label=zone=a", "bulk=/c,node-label=disk=hdd"}, "", false, "")
	if err != nil {
		t.Fatal(err)
	}
	if !needsNodeLabels(specs) {
		t.Fatal("needsNodeLabels: false")
	}
	for _, c := range []struct {
		labels map[string]string
		want   string
	}{
		{nil, "default"},
		{map[string]string{"disk": "nvme"}, "default"},
		{map[string]string{"disk": "nvme", "zone": "a"}, "default fast"},
		{map[string]string{"disk": "hdd", "zone": "a"}, "default bulk"},
	} {
		var got []string
		for _, s := range onThisNode(specs, c.labels) {
			got = append(got, s.name)
		}
		if strings.Join(got, " ") != c.want {
			t.Errorf("node labels %v: pools %v, want %s", c.labels, got, c.want)
		}
	}
}

func TestParseForget(t *testing.T) {
	if got, err := parseForget(" fast, slow ,"); err != nil || strings.Join(got, " ") != "fast slow" {
		t.Errorf("parseForget: %v %v", got, err)
	}
	if _, err := parseForget("fast,Slow"); err == nil || !strings.Contains(err.Error(), `"Slow" is no pool's name`) {
		t.Errorf("parseForget of a bad name: %v", err)
	}
}

// A capacity given above its pool's room is refused with the room's figure,
// pools on one filesystem are added up, a pool with none given passes, and
// --force-capacity lets each through.
func TestCheckCapacities(t *testing.T) {
	const mi = 1 << 20
	// 900 MiB free, nothing held, 16 MiB kept for the store: 876 MiB.
	room := pool.Room{Free: 900 * mi, Store: 16 * mi, BlockSize: 4096}
	if got := room.Bytes(); got != 876*mi {
		t.Fatalf("room %d MiB, want 876", got/mi)
	}
	spec := func(name string, capacity int64) poolSpec {
		return poolSpec{name: name, dir: "/" + name, capacity: capacity}
	}
	for _, c := range []struct {
		specs []poolSpec
		fs    []uint64
		want  string // "" or the error's text
	}{
		{[]poolSpec{spec("default", 0)}, []uint64{1}, ""},
		{[]poolSpec{spec("default", 876*mi)}, []uint64{1}, ""},
		{[]poolSpec{spec("default", 877*mi)}, []uint64{1}, "pool default: its capacity, 877Mi, is more than the filesystem holding /default can give its volumes, 876 MiB: 900 MiB free less the filesystem's reserves, plus 0 MiB the pool's images hold, less 23 MiB kept back"},
		{[]poolSpec{spec("default", 2<<30)}, []uint64{1}, "give a capacity of at most 876Mi (or none"},
		// Each on a filesystem of its own: each within its room.
		{[]poolSpec{spec("a", 800*mi), spec("b", 800*mi)}, []uint64{1, 2}, ""},
		// On one: together. The free space counts once, both stores.
		{[]poolSpec{spec("a", 450*mi), spec("b", 450*mi)}, []uint64{1, 1}, "pools a (450Mi), b (450Mi) are on one filesystem and given 900Mi together, more than it can give their volumes, 860 MiB:"},
		{[]poolSpec{spec("a", 400*mi), spec("c", 100*mi), spec("b", 460*mi)}, []uint64{1, 2, 1}, ""},
	} {
		rooms := make([]pool.Room, len(c.specs))
		for i := range rooms {
			rooms[i] = room
		}
		reduced, err := checkCapacities(c.specs, rooms, c.fs, false, false)
		if (err == nil) != (c.want == "") || err != nil && !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v on filesystems %v: %v, want %q", c.specs, c.fs, err, c.want)
		}
		if err == nil && len(reduced) > 0 {
			t.Errorf("%v on filesystems %v: reduced %v", c.specs, c.fs, reduced)
		}
		if reduced, err := checkCapacities(c.specs, rooms, c.fs, false, true); err != nil || len(reduced) > 0 {
			t.Errorf("%v forced: %v, reduced %v", c.specs, err, reduced)
		}
	}
}

// Pools that hold volumes start whatever their capacities: a pool given
// more than its filesystem can give is served with that, pools on one
// filesystem share it in proportion to what they were given, the others
// keep theirs; --force-capacity keeps every capacity as given.
func TestCheckCapacitiesOfPoolsHoldingVolumes(t *testing.T) {
	const mi = 1 << 20
	room := pool.Room{Free: 900 * mi, Store: 16 * mi, BlockSize: 4096} // 876 MiB
	spec := func(name string, capacity int64) poolSpec {
		return poolSpec{name: name, dir: "/" + name, capacity: capacity}
	}
	for _, c := range []struct {
		specs []poolSpec
		fs    []uint64
		rooms []pool.Room
		want  map[int]int64
	}{
		{[]poolSpec{spec("default", 877*mi)}, []uint64{1}, []pool.Room{room}, map[int]int64{0: 876 * mi}},
		// A filesystem full of other files: nothing more is admitted.
		{[]poolSpec{spec("default", 877*mi)}, []uint64{1}, []pool.Room{{Free: 10 * mi, Store: 16 * mi}}, map[int]int64{0: 0}},
		{[]poolSpec{spec("a", 800*mi), spec("b", 2000*mi), spec("c", 0)}, []uint64{1, 2, 3}, []pool.Room{room, room, room}, map[int]int64{1: 876 * mi}},
		// 860 MiB for both (one free space, two stores): a third and
		// two, in whole MiB.
		{[]poolSpec{spec("a", 300*mi), spec("b", 600*mi)}, []uint64{1, 1}, []pool.Room{room, room}, map[int]int64{0: 286 * mi, 1: 573 * mi}},
		// Exabytes given: the share does not overflow (half the room of
		// 1 PiB free less its maps, 1065353215 MiB).
		{[]poolSpec{spec("a", 1<<60), spec("b", 1<<60)}, []uint64{1, 1}, []pool.Room{{Free: 1 << 50, BlockSize: 4096}, {Free: 1 << 50, BlockSize: 4096}}, map[int]int64{0: 532676607 * mi, 1: 532676607 * mi}},
	} {
		reduced, err := checkCapacities(c.specs, c.rooms, c.fs, true, false)
		if err != nil || !maps.Equal(reduced, c.want) {
			t.Errorf("%v holding volumes: %v, reduced %v; want %v", c.specs, err, reduced, c.want)
		}
		if reduced, err := checkCapacities(c.specs, c.rooms, c.fs, true, true); err != nil || len(reduced) > 0 {
			t.Errorf("%v forced: %v, reduced %v", c.specs, err, reduced)
		}
	}
}
