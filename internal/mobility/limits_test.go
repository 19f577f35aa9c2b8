package mobility

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/podvol/podvol/internal/store"
)

// A source busy with as many pulls as it serves at once (503, as
// transfer.Server answers) is not a failure: the pull waits and comes back,
// and the claim's events say the source is busy, not that an attempt
// failed.
func TestImportWaitsForABusySource(t *testing.T) {
	n := setup(t)
	var refused atomic.Int32
	busy := func(w http.ResponseWriter, r *http.Request) bool {
		if refused.Add(1) > 2 {
			return false
		}
		w.Header().Set("Retry-After", "10")
		http.Error(w, "this node serves 8 pulls at once, the most it serves", http.StatusServiceUnavailable)
		return true
	}
	n.front.Store(&busy)
	n.im.RetryMin = 300 * time.Millisecond // long enough to be seen
	v := n.restore(t, "restored", 96<<20, "ext4")
	got, said := n.wait(t, v)
	if got == nil {
		t.Fatalf("the pull from a busy source was given up: %v (%v)", n.im.Failed("restored"), said)
	}
	sawBusy := false
	for _, s := range said {
		if strings.Contains(s, "failed") {
			t.Fatalf("a busy source reads as a failure: %q", s)
		}
		sawBusy = sawBusy || strings.Contains(s, "busy") && strings.Contains(s, "later")
	}
	if !sawBusy {
		t.Errorf("no status said the source was busy and the pull would come back later: %q", said)
	}
}

// Each pull holds its buffers (8 MiB) on the target too: an Importer runs
// at most MaxPulls at once, the others waiting their turn (and saying so).
func TestImportBoundsConcurrentPulls(t *testing.T) {
	n := setup(t)
	n.im.MaxPulls = 1
	var active, most atomic.Int32
	slow := func(w http.ResponseWriter, r *http.Request) bool {
		now := active.Add(1)
		for m := most.Load(); now > m; m = most.Load() {
			if most.CompareAndSwap(m, now) {
				break
			}
		}
		// Long enough for pulls let run together to overlap.
		time.Sleep(200 * time.Millisecond)
		active.Add(-1)
		return false
	}
	n.front.Store(&slow)
	var vols []*store.Volume
	for _, name := range []string{"r1", "r2", "r3"} {
		vols = append(vols, n.restore(t, name, 96<<20, "ext4"))
	}
	// While the first runs, the others say they wait their turn.
	var said []string
	waited := false
	for deadline := time.Now().Add(5 * time.Second); !waited && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		for _, v := range vols {
			s := n.im.Ensure(n.dst, v)
			said = append(said, s)
			waited = waited || strings.Contains(s, "waiting for one of the 1 pulls this node runs at once")
		}
	}
	if !waited {
		t.Errorf("no status said a pull waited its turn: %q", said[max(0, len(said)-6):])
	}
	for _, v := range vols {
		if got, _ := n.wait(t, v); got == nil {
			t.Fatalf("pull %s was given up: %v", v.Name, n.im.Failed(v.Name))
		}
	}
	if m := most.Load(); m != 1 {
		t.Fatalf("%d pulls ran at once, with at most 1 allowed", m)
	}
}
