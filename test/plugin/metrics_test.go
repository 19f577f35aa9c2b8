package plugin_test

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/podvol/podvol/test/plugintest"
)

func TestMetricsAndHealthz(t *testing.T) {
	e := newEnv(t, plugintest.Options{Capacity: "10Gi", Args: []string{"--metrics-address", "127.0.0.1:0"}})
	addr := ""
	re := regexp.MustCompile(`"Serving metrics" address="([^"]+)"`)
	for deadline := time.Now().Add(10 * time.Second); addr == "" && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if m := re.FindStringSubmatch(e.p.Log()); m != nil {
			addr = m[1]
		}
	}
	if addr == "" {
		t.Fatalf("no metrics address in the log:\n%s", e.p.Log())
	}
	a := e.create("a", 100<<20, rwo, nil)
	b := e.create("b", 200<<20, rwo, nil)
	e.snapshot("s", a.GetVolumeId())
	_ = e.delete("pv-000000000000000000000000")

	get := func(path string) string {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %s %s", path, resp.Status, b)
		}
		return string(b)
	}
	if h := get("/healthz"); strings.TrimSpace(h) != "ok" {
		t.Fatalf("healthz: %q", h)
	}
	m := get("/metrics")
	for _, want := range []string{
		// Every podvol series names its node, a pool's its pool.
		`podvol_pool_capacity_bytes{node="node-1",pool="default"} 1.073741824e+10`,
		`podvol_pool_allocated_bytes{node="node-1",pool="default"} 4.194304e+08`, // two volumes and a snapshot of the first
		`podvol_pool_free_bytes{node="node-1",pool="default"} 1.031798784e+10`,
		`podvol_volumes{kind="persistent",node="node-1",pool="default"} 2`,
		`podvol_volumes{kind="inline",node="node-1",pool="default"} 0`,
		`podvol_snapshots{node="node-1",pool="default"} 1`,
		`podvol_csi_operation_duration_seconds_count{code="OK",method="CreateSnapshot",node="node-1"} 1`,
		`podvol_csi_operation_duration_seconds_count{code="OK",method="CreateVolume",node="node-1"} 2`,
		`podvol_csi_operation_duration_seconds_count{code="OK",method="DeleteVolume",node="node-1"} 1`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	for _, want := range []*regexp.Regexp{
		// The images' written blocks (mkfs wrote some) and what their
		// filesystem has left.
		regexp.MustCompile(`\npodvol_pool_used_bytes\{node="node-1",pool="default"\} [1-9]`),
		regexp.MustCompile(`\npodvol_pool_filesystem_available_bytes\{node="node-1",pool="default"\} [1-9]`),
	} {
		if !want.MatchString(m) {
			t.Errorf("metrics lack %s", want)
		}
	}
	// A healthy pool has no condition; a volume whose image is gone has
	// the one NodeGetVolumeHealth reports, with its severity, until the
	// image is back.
	if strings.Contains(m, "podvol_volume_health_condition{") {
		t.Errorf("healthy volumes have a health condition")
	}
	img := filepath.Join(e.p.PoolDir, "volumes", b.GetVolumeId()+".img")
	e.must("move the image away", os.Rename(img, img+".away"))
	lost := get("/metrics")
	e.must("move the image back", os.Rename(img+".away", img))
	want := fmt.Sprintf(`podvol_volume_health_condition{node="node-1",pool="default",reason="ImageMissing",severity="DataLoss",volume=%q} 1`, b.GetVolumeId())
	if !strings.Contains(lost, want) {
		t.Errorf("metrics lack %s:\n%s", want, grep(lost, "podvol_volume_health"))
	}
	if again := get("/metrics"); strings.Contains(again, "podvol_volume_health_condition{") {
		t.Errorf("the condition outlived the image's return:\n%s", grep(again, "podvol_volume_health"))
	}
	if t.Failed() {
		t.Logf("metrics:\n%s", m)
	}
}

// grep returns the lines of s that contain sub.
func grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
