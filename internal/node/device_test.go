package node_test

import (
	"strings"
	"testing"

	"github.com/podvol/podvol/internal/node"
)

// A Node made without a machine fails at once: a test that forgets the fake
// must not attach loop devices and mount on the host.
func TestNewWithoutDeviceFails(t *testing.T) {
	e := newEnv(t)
	defer func() {
		r := recover()
		if r == nil {
			t.Fatal("node.New with no device returned a Node that acts on the host")
		}
		if !strings.Contains(fmtAny(r), "device") {
			t.Fatalf("the failure does not say what is missing: %v", r)
		}
	}()
	node.New(e.pool, e.shim, nil)
}

func fmtAny(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	if err, ok := v.(error); ok {
		return err.Error()
	}
	return ""
}
