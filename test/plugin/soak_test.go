package plugin_test

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/podvol/podvol/test/plugintest"
)

// make soak runs 200 trials; make test a bounded run. The seed is logged so
// that a failing sequence can be replayed exactly.
var (
	soakTrials = flag.Int("soak.trials", 8, "trials of TestSoak: each a random sequence of CSI calls with the plugin killed at a random failpoint")
	soakSeed   = flag.Uint64("soak.seed", 0, "seed of TestSoak's random choices (0: from the clock)")
)

// soakFailpoints are the failpoints TestSoak arms, one at random per trial.
// Every failpoint in the code is either here or in soakSkipped, with why:
// TestSoakKnowsEveryFailpoint checks it.
var soakFailpoints = []string{
	"create-after-record", "create-after-image",
	"stage-after-record", "stage-after-loop", "stage-after-mount",
	"publish-after-record", "direct-after-record",
	"snapshot-after-record", "copy-while-quiesced",
	"grow-after-record", "grow-offline-after-unmount",
	"delete-after-mark", "delete-after-image",
}

var soakSkipped = map[string]string{
	// The soak makes no group snapshots (yet): TestCrashDuringGroupSnapshot
	// kills the plugin at each of these.
	"group-after-record":         "group snapshots: TestCrashDuringGroupSnapshot",
	"group-while-frozen":         "group snapshots: TestCrashDuringGroupSnapshot",
	"group-delete-after-members": "group snapshots: TestCrashDuringGroupSnapshot",
	"grow-assigned-after-mount":  "growth of a volume a sandbox holds needs the Kata runtime's resize endpoint: TestCrashDuringAssignedGrowth covers it",
}

// TestSoakKnowsEveryFailpoint fails when a failpoint is added to the code
// and the soak does not arm it (nor says why not).
func TestSoakKnowsEveryFailpoint(t *testing.T) {
	re := regexp.MustCompile(`failpoint\.Hit\("([a-z0-9-]+)"\)`)
	var inCode []string
	internal := os.DirFS("../../internal")
	err := fs.WalkDir(internal, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return err
		}
		b, err := fs.ReadFile(internal, p)
		for _, m := range re.FindAllSubmatch(b, -1) {
			inCode = append(inCode, string(m[1]))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(inCode) == 0 {
		t.Fatal("no failpoint found in internal/: the pattern is wrong")
	}
	for _, fp := range inCode {
		if _, skipped := soakSkipped[fp]; !skipped && !slices.Contains(soakFailpoints, fp) {
			t.Errorf("failpoint %q is in the code but TestSoak never arms it: add it to soakFailpoints (or soakSkipped, with why)", fp)
		}
	}
	for _, fp := range soakFailpoints {
		if !slices.Contains(inCode, fp) {
			t.Errorf("soakFailpoints has %q, which is not in the code", fp)
		}
	}
}

// soakVolume is what the soak knows of a volume: the model its checks
// compare the plugin with.
type soakVolume struct {
	id, name  string
	kind      string // xfs, ext4, block, direct
	size      int64
	staged    bool
	published bool
	marker    string // the data last written through the target ("" none)
}

type soakSnapshot struct {
	id, name, kind string
	size           int64
	marker         string
}

type soak struct {
	*env
	t      *testing.T
	rng    *rand.Rand
	rt     *runtime
	vols   []*soakVolume
	snaps  []*soakSnapshot
	n      int    // names made so far
	armed  string // the failpoint of this trial
	hit    bool   // the plugin died at it
	calls  int
	checks int
	// history is the calls of the last trials, printed when a check fails.
	history []string
}

// TestSoak: random sequences of CSI calls (create, clone, restore, stage,
// publish, direct assignment, snapshot, expand, unpublish, unstage, delete)
// with the plugin SIGKILLed at a random failpoint in each trial, or between
// two calls when the sequence never reached it; after each restart the CO's
// retry of the interrupted call must succeed, and the invariants hold: the
// ledger equals a recount of the records, the records are exactly the
// images, each staged volume has exactly one loop device and nothing else
// is attached, each mount is one the records account for, each published
// target is its volume's own filesystem (or device), holding what was last
// written through it.
func TestSoak(t *testing.T) {
	plugintest.RequireRoot(t)
	seed := *soakSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay: go test ./test/plugin -run 'TestSoak$' -soak.seed=%d -soak.trials=%d)", seed, seed, *soakTrials)
	s := &soak{t: t, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))} //nolint:gosec // a sequence replayable from its seed, not a secret
	dir := plugintest.TempDir(t)
	s.rt = newRuntime(t, dir)
	s.env = start(t, plugintest.Options{Dir: dir, NodeID: node, PoolDir: plugintest.XFSPool(t, dir, 16<<30), Args: s.rt.args()})
	// A failed run may leave a filesystem frozen (what the soak looks
	// for): thaw every staged one first, or the test directory's cleanup
	// could not unmount it and its loop devices would stay.
	t.Cleanup(func() {
		for _, v := range s.vols {
			if f, err := os.Open(s.staging(v.id)); err == nil {
				_, _, _ = unix.Syscall(unix.SYS_IOCTL, f.Fd(), fithaw, 0)
				f.Close()
			}
		}
	})
	crashes := 0
	for trial := 1; trial <= *soakTrials; trial++ {
		s.armed = soakFailpoints[s.rng.IntN(len(soakFailpoints))]
		s.hit = false
		s.p.Restart("PODVOL_FAILPOINTS=" + s.armed)
		steps := 3 + s.rng.IntN(10)
		for i := 0; i < steps && !s.hit; i++ {
			s.step()
		}
		if s.hit {
			crashes++
		} else {
			s.p.Restart() // SIGKILL between two calls
		}
		s.check(fmt.Sprintf("trial %d (failpoint %s, hit %v)", trial, s.armed, s.hit))
		s.history = append(s.history, fmt.Sprintf("-- trial %d checked", trial))
	}
	// Everything goes, as a CO would take it down.
	for _, v := range slices.Clone(s.vols) {
		s.teardown(v)
	}
	for _, sn := range slices.Clone(s.snaps) {
		s.deleteSnapshot(sn)
	}
	s.check("after deleting everything")
	if imgs := s.images(); len(imgs) > 0 {
		t.Fatalf("images left after deleting every volume: %v", imgs)
	}
	t.Logf("%d trials, %d calls, %d died at their failpoint, %d invariant checks passed", *soakTrials, s.calls, crashes, s.checks)
}

// poolDir is the XFS pool the plugin was started on.
func (s *soak) poolDir() string { return filepath.Join(s.dir, "xfs-pool") }

// call runs one CSI call as a CO would: when the plugin dies at the armed
// failpoint, it is started again without it and the call is retried until
// it succeeds. Any other error fails the test.
func (s *soak) call(what string, f func() error) {
	s.t.Helper()
	s.calls++
	s.history = append(s.history, what)
	if len(s.history) > 60 {
		s.history = s.history[len(s.history)-60:]
	}
	for attempt := 0; ; attempt++ {
		err := f()
		if err == nil {
			return
		}
		if status.Code(err) == codes.Unavailable && s.p.WaitExit(10*time.Second) && attempt == 0 && !s.hit {
			s.hit = true
			s.history = append(s.history, "  (died at "+s.armed+"; restarted, retrying)")
			s.p.Restart()
			continue
		}
		s.t.Fatalf("%s (failpoint %s armed, hit %v): %v\nplugin log:\n%s", what, s.armed, s.hit, err, s.p.Log())
	}
}

func (s *soak) capability(kind string) *csi.VolumeCapability {
	switch kind {
	case "block":
		return blockCap()
	case "direct":
		return rwop("ext4")
	default:
		return mountCap(kind, csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	}
}

func (s *soak) newName() string { s.n++; return fmt.Sprintf("soak-%d", s.n) }

// step makes one random call that is valid for the model's state.
func (s *soak) step() {
	var unstaged, staged, published, sources []*soakVolume
	for _, v := range s.vols {
		switch {
		case v.published:
			published = append(published, v)
		case v.staged:
			staged = append(staged, v)
		default:
			unstaged = append(unstaged, v)
		}
		if v.kind != "direct" { // a guest's filesystem cannot be frozen from the host
			sources = append(sources, v)
		}
	}
	pick := func(vs []*soakVolume) *soakVolume { return vs[s.rng.IntN(len(vs))] }
	type op struct {
		ok bool
		do func()
	}
	ops := []op{
		{len(s.vols) < 5, s.create},
		{len(s.vols) < 6 && len(sources) > 0, func() { s.clone(pick(sources)) }},
		{len(s.vols) < 6 && len(s.snaps) > 0, func() { s.restore(s.snaps[s.rng.IntN(len(s.snaps))]) }},
		{len(unstaged) > 0, func() { s.stage(pick(unstaged)) }},
		{len(staged) > 0, func() { s.publish(pick(staged)) }},
		{len(published) > 0, func() { s.unpublish(pick(published)) }},
		{len(staged) > 0, func() { s.unstage(pick(staged)) }},
		{len(s.snaps) < 4 && len(sources) > 0, func() { s.snapshot(pick(sources)) }},
		{len(s.vols) > 0, func() { s.expand(pick(s.vols)) }},
		{len(unstaged) > 0, func() { s.delete(pick(unstaged)) }},
		{len(s.snaps) > 0, func() { s.deleteSnapshot(s.snaps[s.rng.IntN(len(s.snaps))]) }},
	}
	ops = slices.DeleteFunc(ops, func(o op) bool { return !o.ok })
	ops[s.rng.IntN(len(ops))].do()
}

func (s *soak) create() {
	kind := []string{"xfs", "ext4", "block", "direct"}[s.rng.IntN(4)]
	size := int64(64 << 20)
	if kind == "xfs" {
		size = 320 << 20 // mkfs.xfs's smallest
	}
	var params map[string]string
	if kind == "direct" {
		params = map[string]string{"directAssign": "always"}
	}
	name := s.newName()
	var v *csi.Volume
	s.call("CreateVolume "+name+" ("+kind+")", func() (err error) {
		r, err := s.p.Controller().CreateVolume(ctx(s.t), &csi.CreateVolumeRequest{
			Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: size},
			VolumeCapabilities: []*csi.VolumeCapability{s.capability(kind)}, Parameters: params,
		})
		v = r.GetVolume()
		return err
	})
	s.vols = append(s.vols, &soakVolume{id: v.GetVolumeId(), name: name, kind: kind, size: v.GetCapacityBytes()})
}

func (s *soak) clone(src *soakVolume) {
	name := s.newName()
	var v *csi.Volume
	s.call("CreateVolume "+name+" from volume "+src.name, func() (err error) {
		v, err = s.createFrom(name, src.size, s.capability(src.kind), fromVolume(src.id))
		return err
	})
	s.vols = append(s.vols, &soakVolume{id: v.GetVolumeId(), name: name, kind: src.kind, size: v.GetCapacityBytes(), marker: src.marker})
}

func (s *soak) restore(sn *soakSnapshot) {
	name := s.newName()
	var v *csi.Volume
	s.call("CreateVolume "+name+" from snapshot "+sn.name, func() (err error) {
		v, err = s.createFrom(name, sn.size, s.capability(sn.kind), fromSnapshot(sn.id))
		return err
	})
	s.vols = append(s.vols, &soakVolume{id: v.GetVolumeId(), name: name, kind: sn.kind, size: v.GetCapacityBytes(), marker: sn.marker})
}

func (s *soak) snapshot(v *soakVolume) {
	name := s.newName()
	var sn *csi.Snapshot
	s.call("CreateSnapshot "+name+" of "+v.name, func() error {
		r, err := s.p.Controller().CreateSnapshot(ctx(s.t), &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: v.id})
		sn = r.GetSnapshot()
		return err
	})
	s.snaps = append(s.snaps, &soakSnapshot{id: sn.GetSnapshotId(), name: name, kind: v.kind, size: v.size, marker: v.marker})
}

func (s *soak) stage(v *soakVolume) {
	s.call("NodeStageVolume "+v.name, func() error { return s.env.stage(v.id, s.capability(v.kind)) })
	v.staged = true
}

func (s *soak) publish(v *soakVolume) {
	if v.kind == "direct" {
		s.call("NodePublishVolume (direct) "+v.name, func() error { return s.publishReq(v.id, s.capability(v.kind), s.target(v.id)) })
		v.published = true
		return
	}
	s.call("NodePublishVolume "+v.name, func() error { return s.env.publish(v.id, s.capability(v.kind)) })
	v.published = true
	s.checkData(v)
	v.marker = fmt.Sprintf("%s/%d", v.name, s.calls)
	s.writeMarker(v)
}

func (s *soak) unpublish(v *soakVolume) {
	s.call("NodeUnpublishVolume "+v.name, func() error { return s.env.unpublish(v.id) })
	v.published = false
}

func (s *soak) unstage(v *soakVolume) {
	s.call("NodeUnstageVolume "+v.name, func() error { return s.env.unstage(v.id) })
	v.staged = false
}

func (s *soak) delete(v *soakVolume) {
	s.call("DeleteVolume "+v.name, func() error { return s.env.delete(v.id) })
	s.vols = slices.DeleteFunc(s.vols, func(o *soakVolume) bool { return o == v })
}

func (s *soak) deleteSnapshot(sn *soakSnapshot) {
	s.call("DeleteSnapshot "+sn.name, func() error {
		_, err := s.p.Controller().DeleteSnapshot(ctx(s.t), &csi.DeleteSnapshotRequest{SnapshotId: sn.id})
		return err
	})
	s.snaps = slices.DeleteFunc(s.snaps, func(o *soakSnapshot) bool { return o == sn })
}

// expand grows a volume by 64 MiB as Kubernetes does (ControllerExpandVolume,
// then NodeExpandVolume at the target or, staged, at the staging path), where
// this host allows it: ext4 grows online only with CAP_SYS_RESOURCE, and a
// direct-assigned volume a sandbox holds grows through the runtime.
func (s *soak) expand(v *soakVolume) {
	if (v.kind == "ext4" && v.published && !hasCapSysResource()) || (v.kind == "direct" && v.published) {
		return
	}
	size := v.size + 64<<20
	s.call("ControllerExpandVolume "+v.name, func() error {
		_, err := s.p.Controller().ControllerExpandVolume(ctx(s.t), &csi.ControllerExpandVolumeRequest{
			VolumeId: v.id, CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapability: s.capability(v.kind),
		})
		return err
	})
	path := s.staging(v.id)
	if v.published {
		path = s.target(v.id)
	}
	s.call("NodeExpandVolume "+v.name, func() error { _, err := s.env.expand(v.id, path, size); return err })
	v.size = size
}

// teardown takes a volume down and deletes it.
func (s *soak) teardown(v *soakVolume) {
	if v.published {
		s.unpublish(v)
	}
	if v.staged {
		s.unstage(v)
	}
	s.delete(v)
}

func (s *soak) writeMarker(v *soakVolume) {
	if v.kind == "block" {
		f, err := os.OpenFile(s.target(v.id), os.O_WRONLY, 0)
		if err != nil {
			s.t.Fatal(err)
		}
		defer f.Close()
		buf := make([]byte, 4096)
		copy(buf, v.marker)
		if _, err := f.WriteAt(buf, 0); err != nil {
			s.t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			s.t.Fatal(err)
		}
		return
	}
	writeFile(s.t, filepath.Join(s.target(v.id), "marker"), v.marker)
}

// checkData reads what was last written through the volume's target.
func (s *soak) checkData(v *soakVolume) {
	s.t.Helper()
	var got string
	if v.kind == "block" {
		if v.marker == "" {
			return // a new block volume holds whatever the image held: zeros
		}
		f, err := os.Open(s.target(v.id))
		if err != nil {
			s.t.Fatal(err)
		}
		buf := make([]byte, 4096)
		_, err = f.ReadAt(buf, 0)
		f.Close()
		if err != nil {
			s.t.Fatal(err)
		}
		got = string(bytes.TrimRight(buf, "\x00"))
	} else {
		b, err := os.ReadFile(filepath.Join(s.target(v.id), "marker"))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			s.t.Fatal(err)
		}
		got = string(b)
	}
	if got != v.marker {
		s.t.Fatalf("volume %s (%s) holds %q through its target, want %q: data lost or another volume's", v.name, v.kind, got, v.marker)
	}
}

// check compares the plugin and the machine with the model.
func (s *soak) check(when string) {
	t := s.t
	t.Helper()
	fail := func(format string, a ...any) {
		t.Helper()
		var model []string
		for _, v := range s.vols {
			model = append(model, fmt.Sprintf("%s=%s(%s staged=%v published=%v)", v.name, v.id, v.kind, v.staged, v.published))
		}
		t.Fatalf("%s: %s\nmodel: %s\nlast calls:\n  %s\nplugin log:\n%s", when, fmt.Sprintf(format, a...), strings.Join(model, " "), strings.Join(s.history, "\n  "), s.p.Log())
	}
	// The records are the model's, and the images are the records'.
	lv, err := s.p.Controller().ListVolumes(ctx(t), &csi.ListVolumesRequest{})
	if err != nil {
		fail("ListVolumes: %v", err)
	}
	ls, err := s.p.Controller().ListSnapshots(ctx(t), &csi.ListSnapshotsRequest{})
	if err != nil {
		fail("ListSnapshots: %v", err)
	}
	var recorded, want, wantImages []string
	var sum int64
	for _, en := range lv.GetEntries() {
		recorded = append(recorded, en.GetVolume().GetVolumeId())
		sum += en.GetVolume().GetCapacityBytes()
	}
	for _, v := range s.vols {
		want = append(want, v.id)
		wantImages = append(wantImages, "volumes/"+v.id+".img")
	}
	for _, en := range ls.GetEntries() {
		recorded = append(recorded, en.GetSnapshot().GetSnapshotId())
		sum += en.GetSnapshot().GetSizeBytes()
	}
	for _, sn := range s.snaps {
		want = append(want, sn.id)
		wantImages = append(wantImages, "snapshots/"+strings.SplitN(sn.id, "@", 2)[0]+".img")
	}
	sort.Strings(recorded)
	sort.Strings(want)
	if !slices.Equal(recorded, want) {
		fail("records %v, want %v", recorded, want)
	}
	var images []string
	for _, d := range []string{"volumes", "snapshots"} {
		ents, _ := os.ReadDir(filepath.Join(s.poolDir(), d))
		for _, en := range ents {
			images = append(images, d+"/"+en.Name())
		}
	}
	sort.Strings(images)
	sort.Strings(wantImages)
	if !slices.Equal(images, wantImages) {
		fail("pool holds %v, want exactly the records' images %v", images, wantImages)
	}
	// The ledger equals the recount.
	c, err := s.p.Controller().GetCapacity(ctx(t), &csi.GetCapacityRequest{})
	if err != nil {
		fail("GetCapacity: %v", err)
	}
	if alloc := int64(200<<30) - c.GetAvailableCapacity(); alloc != sum {
		fail("the ledger counts %d bytes allocated, the records %d", alloc, sum)
	}
	// One loop device per staged volume, none for anything else.
	loops, mounts := plugintest.Leftovers(s.dir)
	loops = slices.DeleteFunc(loops, func(l string) bool { return strings.HasSuffix(l, "/xfs-pool.img)") })
	mounts = slices.DeleteFunc(mounts, func(m string) bool { return m == s.poolDir() })
	var wantLoops, wantMounts []string
	devOf := map[string]string{} // volume id -> its loop device
	for _, v := range s.vols {
		if !v.staged {
			continue
		}
		img := filepath.Join(s.poolDir(), "volumes", v.id+".img")
		for _, l := range loops {
			if strings.HasSuffix(l, "("+img+")") {
				devOf[v.id] = strings.Fields(l)[0]
			}
		}
		wantLoops = append(wantLoops, img)
		// A direct-assigned volume is mounted at its staging path until
		// it is handed over to a sandbox; then nothing of it is.
		if v.kind == "xfs" || v.kind == "ext4" || (v.kind == "direct" && !v.published) {
			wantMounts = append(wantMounts, s.staging(v.id))
		}
		if v.published && v.kind != "direct" {
			wantMounts = append(wantMounts, s.target(v.id))
		}
	}
	var backing []string
	for _, l := range loops {
		f := strings.Fields(l)[1]
		backing = append(backing, strings.TrimSuffix(strings.TrimPrefix(f, "("), ")"))
	}
	sort.Strings(backing)
	sort.Strings(wantLoops)
	if !slices.Equal(backing, wantLoops) {
		fail("loop devices of %v, want one for each staged volume: %v", loops, wantLoops)
	}
	sort.Strings(mounts)
	sort.Strings(wantMounts)
	if !slices.Equal(mounts, wantMounts) {
		fail("mounts %v, want %v", mounts, wantMounts)
	}
	// Nothing is left frozen: a freeze of our own succeeds (and is undone)
	// where the plugin thawed, and fails with EBUSY where it did not.
	for _, v := range s.vols {
		if v.staged && (v.kind == "xfs" || v.kind == "ext4" || (v.kind == "direct" && !v.published)) {
			if err := freezeProbe(s.staging(v.id)); err != nil {
				fail("volume %s: %v", v.name, err)
			}
		}
	}
	// Each published target is its own volume, holding its data.
	for _, v := range s.vols {
		if !v.published {
			continue
		}
		if v.kind == "direct" {
			if m := s.rt.read(s.target(v.id)); str(t, m, "device") != devOf[v.id] {
				fail("direct volume %s is handed over as %s, its loop device is %s", v.name, str(t, m, "device"), devOf[v.id])
			}
			continue
		}
		if got, want := deviceOf(t, s.target(v.id), v.kind == "block"), rdev(t, devOf[v.id]); got != want {
			fail("target of %s is device %d:%d, its loop device %s is %d:%d", v.name, unix.Major(got), unix.Minor(got), devOf[v.id], unix.Major(want), unix.Minor(want))
		}
		s.checkData(v)
	}
	s.checks++
}

// deviceOf is the device a published target is: the device node a block
// target is bound to, or the filesystem's device a mount target shows.
func deviceOf(t *testing.T, target string, block bool) uint64 {
	t.Helper()
	if block {
		return rdev(t, target)
	}
	ms, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(target))
	if err != nil || len(ms) == 0 {
		t.Fatalf("%s is not a mount point: %v", target, err)
	}
	m := ms[len(ms)-1]
	return unix.Mkdev(uint32(m.Major), uint32(m.Minor))
}

func rdev(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatalf("stat %s: %v", path, err)
	}
	return st.Rdev
}

// FIFREEZE and FITHAW: _IOWR('X', 119/120, int), which x/sys/unix lacks.
const fifreeze, fithaw = 0xC0045877, 0xC0045878

// freezeProbe tells whether the filesystem mounted at path is frozen: the
// kernel refuses a second freeze with EBUSY. One that is not is frozen and
// thawed again at once.
func freezeProbe(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fifreeze, 0)
	if errno != 0 {
		err = errno
	}
	if errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("its filesystem at %s is left frozen: every writer in the pod would hang", path)
	}
	if err != nil {
		return fmt.Errorf("freeze %s: %w", path, err)
	}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fithaw, 0); errno != 0 {
		return fmt.Errorf("thaw %s after a probe: %w", path, errno)
	}
	return nil
}
