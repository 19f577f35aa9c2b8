package plugin_test

import (
	"io"
	"net/http"
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
	e.create("b", 200<<20, rwo, nil)
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
		// Every podvol series names its node.
		`podvol_pool_capacity_bytes{node="node-1"} 1.073741824e+10`,
		`podvol_pool_allocated_bytes{node="node-1"} 4.194304e+08`, // two volumes and a snapshot of the first
		`podvol_pool_free_bytes{node="node-1"} 1.031798784e+10`,
		`podvol_volumes{kind="persistent",node="node-1"} 2`,
		`podvol_volumes{kind="inline",node="node-1"} 0`,
		`podvol_snapshots{node="node-1"} 1`,
		`podvol_csi_operation_duration_seconds_count{code="OK",method="CreateSnapshot",node="node-1"} 1`,
		`podvol_csi_operation_duration_seconds_count{code="OK",method="CreateVolume",node="node-1"} 2`,
		`podvol_csi_operation_duration_seconds_count{code="OK",method="DeleteVolume",node="node-1"} 1`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if t.Failed() {
		t.Logf("metrics:\n%s", m)
	}
}
