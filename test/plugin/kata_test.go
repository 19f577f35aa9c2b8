package plugin_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/podvol/podvol/test/plugintest"
)

// runtime is a stand-in for the Kata runtime, written from the protocol's
// rules (not from Kata's code): it reads what the plugin wrote exactly as
// the runtime would, records a sandbox, and serves the shim's two endpoints.
type runtime struct {
	t         *testing.T
	root      string // direct-volumes directory
	sandboxes string // sandbox directory
	stats     string // JSON the shim answers for stats
	resizeErr string // the shim's answer to resize; "" means success
	asked     []string
}

func newRuntime(t *testing.T, dir string) *runtime {
	r := &runtime{t: t, root: filepath.Join(dir, "kata", "direct-volumes"), sandboxes: filepath.Join(dir, "kata", "sbs")}
	r.stats = `{"usage":[{"available":700,"total":1000,"used":300,"unit":1},{"available":60,"total":100,"used":40,"unit":2}],"volume_condition":{"message":"OK"}}`
	r.resizeErr = "resize not implemented by the agent"
	return r
}

func (r *runtime) args() []string {
	return []string{"--kata-direct-volumes-dir", r.root, "--kata-sandbox-dirs", filepath.Join(r.t.TempDir(), "none") + "," + r.sandboxes}
}

// read applies the runtime's reading rules to the bytes for target.
func (r *runtime) read(target string) map[string]json.RawMessage {
	t := r.t
	t.Helper()
	dir := filepath.Join(r.root, base64.URLEncoding.EncodeToString([]byte(target)))
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatalf("no direct-volume directory for %s: %v", target, err)
	}
	if fi.Mode().Perm() != 0o700 {
		t.Fatalf("directory mode %v, want 0700", fi.Mode().Perm())
	}
	file := filepath.Join(dir, "mountInfo.json")
	fi, err = os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("mountInfo.json mode %v, want 0600", fi.Mode().Perm())
	}
	raw, _ := os.ReadFile(file)
	m := map[string]json.RawMessage{}
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("mountInfo.json is not JSON: %v: %s", err, raw)
	}
	for k := range m {
		if !slices.Contains([]string{"volume-type", "device", "fstype", "metadata", "options"}, k) {
			t.Fatalf("mountInfo.json has key %q the runtime does not know: %s", k, raw)
		}
	}
	for _, k := range []string{"volume-type", "device", "fstype"} {
		if _, ok := m[k]; !ok {
			t.Fatalf("mountInfo.json lacks %q: %s", k, raw)
		}
	}
	if md, ok := m["metadata"]; ok {
		var meta map[string]string
		if err := json.Unmarshal(md, &meta); err != nil {
			t.Fatal(err)
		}
		for k := range meta {
			if !slices.Contains([]string{"fsGroup", "fsGroupChangePolicy", "encryptionKey", "createFilesystem"}, k) {
				t.Fatalf("metadata key %q is not one the runtime understands", k)
			}
		}
	}
	if o, ok := m["options"]; ok {
		var opts []string
		_ = json.Unmarshal(o, &opts)
		for _, h := range []string{"bind", "rbind"} {
			if slices.Contains(opts, h) {
				t.Fatalf("host-only option %q reached the guest: %v", h, opts)
			}
		}
	}
	return m
}

func str(t *testing.T, m map[string]json.RawMessage, k string) string {
	var s string
	if err := json.Unmarshal(m[k], &s); err != nil {
		t.Fatalf("%s: %v", k, err)
	}
	return s
}

// startSandbox records sandbox id for target and serves its shim.
func (r *runtime) startSandbox(target, id string) {
	t := r.t
	dir := filepath.Join(r.root, base64.URLEncoding.EncodeToString([]byte(target)))
	if err := os.WriteFile(filepath.Join(dir, id), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	sockDir := filepath.Join(r.sandboxes, id)
	if err := os.MkdirAll(sockDir, 0o700); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("unix", filepath.Join(sockDir, "shim-monitor.sock"))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /direct-volume/stats", func(w http.ResponseWriter, req *http.Request) {
		r.asked = append(r.asked, "stats "+req.URL.RawQuery)
		_, _ = io.WriteString(w, r.stats)
	})
	mux.HandleFunc("POST /direct-volume/resize", func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		r.asked = append(r.asked, "resize "+string(b))
		if r.resizeErr != "" {
			http.Error(w, r.resizeErr, http.StatusInternalServerError)
		}
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() { _ = srv.Close() })
}

func rwop(fs string) *csi.VolumeCapability {
	c := mountCap(fs, csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER)
	c.GetMount().MountFlags = []string{"noatime"}
	c.GetMount().VolumeMountGroup = "2000"
	return c
}

func (e *env) publishReq(id string, c *csi.VolumeCapability, target string) error {
	_, err := e.p.Node().NodePublishVolume(ctx(e.t), &csi.NodePublishVolumeRequest{
		VolumeId: id, StagingTargetPath: e.staging(id), TargetPath: target, VolumeCapability: c,
		Secrets:       map[string]string{"password": "hunter2-secret"},
		VolumeContext: map[string]string{"csi.storage.k8s.io/pod.name": "p", "csi.storage.k8s.io/pod.namespace": "default"},
	})
	return err
}

func TestDirectAssignedVolume(t *testing.T) {
	plugintest.RequireRoot(t)
	var rt *runtime
	e := newEnvArgs(t, func(dir string) []string { rt = newRuntime(t, dir); return rt.args() })
	c := rwop("ext4")
	id := e.create("kata", 64<<20, c, map[string]string{"directAssign": "always", "fsGroupChangePolicy": "OnRootMismatch"}).GetVolumeId()
	e.must("stage", e.stage(id, c))
	target := e.target(id)
	e.must("publish (direct)", e.publishReq(id, c, target))
	e.must("publish (direct) again", e.publishReq(id, c, target))

	// Nothing of the volume is mounted on the host; the target is an
	// empty directory.
	if _, mounts := plugintest.Leftovers(e.dir); len(mounts) != 0 {
		t.Fatalf("host mounts while assigned to a guest: %v", mounts)
	}
	if ents, err := os.ReadDir(target); err != nil || len(ents) != 0 {
		t.Fatalf("target %s: %v, entries %v", target, err, ents)
	}
	m := rt.read(target)
	dev := str(t, m, "device")
	if str(t, m, "volume-type") != "directvol" || str(t, m, "fstype") != "ext4" || !strings.HasPrefix(dev, "/dev/loop") {
		t.Fatalf("mountInfo: %v", m)
	}
	if b, _ := os.ReadFile("/sys/block/" + filepath.Base(dev) + "/loop/backing_file"); !strings.Contains(string(b), id) {
		t.Fatalf("device %s is not the volume's loop device (backing %q)", dev, b)
	}
	var meta map[string]string
	_ = json.Unmarshal(m["metadata"], &meta)
	if meta["fsGroup"] != "2000" || meta["fsGroupChangePolicy"] != "OnRootMismatch" {
		t.Fatalf("metadata %v", meta)
	}
	var opts []string
	_ = json.Unmarshal(m["options"], &opts)
	if !slices.Equal(opts, []string{"noatime"}) {
		t.Fatalf("options %v", opts)
	}
	raw, _ := os.ReadFile(filepath.Join(rt.root, base64.URLEncoding.EncodeToString([]byte(target)), "mountInfo.json"))
	if bytes.Contains(raw, []byte("hunter2")) {
		t.Fatal("a secret reached mountInfo.json")
	}

	// Before the sandbox starts, stats say so.
	_, err := e.p.Node().NodeGetVolumeStats(ctx(t), &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: target})
	wantCode(t, "stats without sandbox", err, codes.FailedPrecondition)
	if !strings.Contains(err.Error(), "not running in a sandbox yet") {
		t.Fatalf("stats without sandbox: %v", err)
	}

	// The guest mounts the device and writes (done here on the host, as the
	// guest would, while podvol has it unmounted).
	rt.startSandbox(target, "sandbox-1234")
	guest := filepath.Join(e.dir, "guest")
	_ = os.Mkdir(guest, 0o700)
	run(t, "mount", dev, guest)
	writeFile(t, filepath.Join(guest, "f"), "written in the guest")
	run(t, "umount", guest)

	st, err := e.p.Node().NodeGetVolumeStats(ctx(t), &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: target})
	e.must("stats through the shim", err)
	if u := st.GetUsage(); len(u) != 2 || u[0].GetTotal() != 1000 || u[0].GetUsed() != 300 || u[0].GetAvailable() != 700 || u[1].GetTotal() != 100 || u[1].GetUsed() != 40 {
		t.Fatalf("stats not passed through: %v", u)
	}
	if want := "stats path=" + url.PathEscape(dev); !slices.Contains(rt.asked, want) {
		t.Fatalf("shim was asked %v, want %q", rt.asked, want)
	}
	e.wantHealth(id)
	rt.stats = `{"usage":[],"volume_condition":{"abnormal":true,"message":"I/O errors on vdb"}}`
	n, err := e.p.Node().NodeGetVolumeHealth(ctx(t), &csi.NodeGetVolumeHealthRequest{VolumeId: id})
	e.must("health", err)
	if h := n.GetVolumeHealth().GetHealthStatuses(); len(h) != 1 || h[0].GetReason() != "RuntimeReportsAbnormal" || !strings.Contains(h[0].GetMessage(), "I/O errors on vdb") {
		t.Fatalf("health through the shim: %v", h)
	}

	// Online resize goes to the runtime, whose refusal is surfaced.
	_, err = e.expand(id, target, 128<<20)
	wantCode(t, "online resize of a direct volume", err, codes.FailedPrecondition)
	if !strings.Contains(err.Error(), "resize not implemented by the agent") {
		t.Fatalf("the runtime's answer is not in %v", err)
	}
	if want := fmt.Sprintf(`resize {"VolumePath":%q,"Size":%d}`, dev, 128<<20); !slices.Contains(rt.asked, want) {
		t.Fatalf("shim was asked %v, want %q", rt.asked, want)
	}

	// Unpublish ends the assignment: the directory goes (with the
	// runtime's sandbox file), and the host mounts the volume again.
	e.must("unpublish", e.unpublish(id))
	if _, err := os.Stat(filepath.Join(rt.root, base64.URLEncoding.EncodeToString([]byte(target)))); !os.IsNotExist(err) {
		t.Fatalf("direct-volume directory left: %v", err)
	}
	if got := readFile(t, filepath.Join(e.staging(id), "f")); got != "written in the guest" {
		t.Fatalf("data on the host after the assignment: %q", got)
	}
	// Offline growth of the unassigned volume works, and the data survives
	// unstage and stage.
	e.must("unstage", e.unstage(id))
	_, err = e.expand(id, e.staging(id), 128<<20)
	e.must("offline growth", err)
	e.must("restage", e.stage(id, c))
	if got := readFile(t, filepath.Join(e.staging(id), "f")); got != "written in the guest" {
		t.Fatalf("data after restage: %q", got)
	}
	e.must("unstage", e.unstage(id))
	e.must("delete", e.delete(id))
	e.assertClean()
}

func TestDirectAssignedBlockVolume(t *testing.T) {
	var rt *runtime
	e := newEnvArgs(t, func(dir string) []string { rt = newRuntime(t, dir); return rt.args() })
	c := blockCap()
	c.AccessMode.Mode = csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
	id := e.create("kata-block", 32<<20, c, map[string]string{"directAssign": "always"}).GetVolumeId()
	e.must("stage", e.stage(id, c))
	e.must("publish", e.publishReq(id, c, e.target(id)))
	m := rt.read(e.target(id))
	if str(t, m, "fstype") != "" || !strings.HasPrefix(str(t, m, "device"), "/dev/loop") {
		t.Fatalf("block mountInfo: %v", m)
	}
	if _, ok := m["metadata"]; ok {
		t.Fatalf("block volume has metadata: %v", m)
	}
	e.must("unpublish", e.unpublish(id))
	e.must("unstage", e.unstage(id))
	e.must("delete", e.delete(id))
	e.assertClean()
}

func TestDirectAssignRefusals(t *testing.T) {
	var rt *runtime
	e := newEnvArgs(t, func(dir string) []string {
		rt = newRuntime(t, dir)
		// An API server that is not there.
		kc := filepath.Join(dir, "kubeconfig")
		_ = os.WriteFile(kc, []byte("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\nusers: [{name: u, user: {token: x}}]\n"), 0o600)
		return append(rt.args(), "--kubeconfig", kc)
	})
	rwo := mountCap("", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	id := e.create("not-rwop", 64<<20, rwo, map[string]string{"directAssign": "always"}).GetVolumeId()
	e.must("stage", e.stage(id, rwo))
	err := e.publishReq(id, rwo, e.target(id))
	wantCode(t, "direct assignment without RWOP", err, codes.FailedPrecondition)
	if !strings.Contains(err.Error(), "ReadWriteOncePod") {
		t.Fatalf("message does not say why: %v", err)
	}
	e.must("unstage", e.unstage(id))

	c := rwop("")
	id = e.create("rwop", 64<<20, c, map[string]string{"directAssign": "always"}).GetVolumeId()
	e.must("stage", e.stage(id, c))
	e.must("publish", e.publishReq(id, c, e.target(id)))
	err = e.publishReq(id, c, filepath.Join(e.dir, "pods", "second"))
	wantCode(t, "second publication", err, codes.FailedPrecondition)
	e.must("unpublish", e.unpublish(id))
	e.must("unstage", e.unstage(id))

	id = e.create("auto", 64<<20, c, map[string]string{"directAssign": "auto"}).GetVolumeId()
	e.must("stage", e.stage(id, c))
	err = e.publishReq(id, c, e.target(id))
	wantCode(t, "auto with the API unreachable", err, codes.Unavailable)
	if !strings.Contains(err.Error(), "cannot read pod default/p") {
		t.Fatalf("message: %v", err)
	}
	if _, mounts := plugintest.Leftovers(e.dir); len(mounts) != 1 {
		t.Fatalf("a refused auto publish changed mounts: %v", mounts)
	}
	e.must("unstage", e.unstage(id))
	e.assertClean()
}

// TestDirectAssignCrashRecovery: killed between recording the assignment and
// writing it, the plugin rolls back on restart (staging mounted again); a
// foreign entry in the directory is left alone.
func TestDirectAssignCrashRecovery(t *testing.T) {
	var rt *runtime
	e := newEnvArgs(t, func(dir string) []string { rt = newRuntime(t, dir); return rt.args() })
	foreign := filepath.Join(rt.root, base64.URLEncoding.EncodeToString([]byte("/var/lib/kubelet/pods/x/volumes/other")))
	if err := os.MkdirAll(foreign, 0o700); err != nil {
		t.Fatal(err)
	}
	c := rwop("xfs")
	id := e.create("kata", 300<<20, c, map[string]string{"directAssign": "always"}).GetVolumeId()
	e.must("stage", e.stage(id, c))
	writeFile(t, filepath.Join(e.staging(id), "f"), "before")
	e.crash("direct-after-record", func() error { return e.publishReq(id, c, e.target(id)) })
	if m, _ := os.ReadFile("/proc/self/mountinfo"); !bytes.Contains(m, []byte(e.staging(id))) {
		t.Fatal("staging mount not restored after the rollback")
	}
	if _, err := os.Stat(foreign); err != nil {
		t.Fatalf("foreign entry removed: %v", err)
	}
	e.must("publish after restart", e.publishReq(id, c, e.target(id)))
	e.must("unpublish", e.unpublish(id))
	if got := readFile(t, filepath.Join(e.staging(id), "f")); got != "before" {
		t.Fatalf("data: %q", got)
	}
	e.must("unstage", e.unstage(id))
	e.assertClean()
}
