package transfer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// limitedSource is node-a serving dir's images, with these limits.
func limitedSource(t *testing.T, maxPulls, perCaller int, idle time.Duration) *fixture {
	t.Helper()
	fx := &fixture{dir: t.TempDir(), ca: newCA(t), authz: &authz{}}
	fx.images = &files{dir: fx.dir}
	fx.server = &Server{Images: fx.images, Authorizer: fx.authz, MaxPulls: maxPulls, MaxPullsPerCaller: perCaller, IdleTimeout: idle}
	fx.addr = serve(t, fx.ca.creds(t, CommonName("node-a")), fx.server)
	fx.target = fx.ca.creds(t, CommonName("node-b"))
	return fx
}

// open starts a pull as node and leaves its stream unread (a caller that
// stops reading, or many that start at once): the stream, closed when the
// test ends if not before.
func (fx *fixture) open(t *testing.T, node, source string) (io.ReadCloser, error) {
	t.Helper()
	p := &Pull{Client: Client(fx.ca.creds(t, CommonName(node)), "node-a"), Address: fx.addr, Source: source, Claim: testClaim}
	req, err := http.NewRequest(http.MethodGet, p.url(fx.addr, "", 0).String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(headerVersion, fmt.Sprint(Version))
	resp, err := p.Client.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, errorOf(resp)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp.Body, nil
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// Each pull a source serves holds readDepth chunks (8 MiB) for as long as
// it streams: a source serves at most MaxPulls at once, MaxPullsPerCaller
// to one node; the rest are refused at once with a status the puller takes
// for "busy, retry later" (ErrBusy), and the source's memory stays bounded
// however many pulls are asked for. Closing a stream frees its slot.
func TestServerBoundsConcurrentPulls(t *testing.T) {
	fx := limitedSource(t, 3, 2, 0)
	makeImage(t, filepath.Join(fx.dir, "snap-7.img"), 32<<20, []extent{{0, random(32 << 20)}})
	before := heapInUse()

	var open []io.ReadCloser
	for _, node := range []string{"node-b", "node-b", "node-c"} {
		body, err := fx.open(t, node, "snap-7")
		if err != nil {
			t.Fatalf("pull %d, by %s, under the limits: %v", len(open)+1, node, err)
		}
		open = append(open, body)
	}
	if _, err := fx.open(t, "node-b", "snap-7"); !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "node-b") {
		t.Fatalf("a third pull by node-b (2 per node): %v, want busy, naming the node", err)
	}
	// Many more, by many nodes: each refused, none holding memory.
	for i := range 45 {
		if _, err := fx.open(t, fmt.Sprintf("node-x%d", i), "snap-7"); !errors.Is(err, ErrBusy) {
			t.Fatalf("pull %d beyond the 3 at once: %v, want busy", i+4, err)
		}
	}
	grown := int64(heapInUse()) - int64(before)
	t.Logf("heap in use grew by %d MiB with 3 pulls served and 46 refused", grown>>20)
	if limit := int64(5 * readDepth * ChunkSize); grown > limit {
		t.Fatalf("the heap grew by %d MiB with 3 pulls served at once: more than %d MiB", grown>>20, limit>>20)
	}
	// The puller's error says to come back.
	dst, _ := openDst(t)
	_, err := fx.pull(t, "snap-7", dst).Run(context.Background())
	if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "try again later") {
		t.Fatalf("a pull while the source is busy: %v, want busy, try again later", err)
	}
	// A stream closed frees its slot.
	open[2].Close()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		body, err := fx.open(t, "node-d", "snap-7")
		if err == nil {
			_, _ = io.Copy(io.Discard, body)
			break
		}
		if !errors.Is(err, ErrBusy) || time.Now().After(deadline) {
			t.Fatalf("a pull after a stream was closed: %v", err)
		}
	}
}

// A caller that stops reading does not keep its slot: the source gives a
// pull whose writes make no progress for its IdleTimeout up.
func TestServerDropsAPullNotRead(t *testing.T) {
	fx := limitedSource(t, 1, 1, 300*time.Millisecond)
	makeImage(t, filepath.Join(fx.dir, "snap-8.img"), 64<<20, []extent{{0, random(64 << 20)}})
	if _, err := fx.open(t, "node-b", "snap-8"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for deadline := start.Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		body, err := fx.open(t, "node-c", "snap-8")
		if err == nil {
			body.Close()
			t.Logf("the slot of the pull not read was free after %s", time.Since(start).Round(time.Millisecond))
			return
		}
		if !errors.Is(err, ErrBusy) || time.Now().After(deadline) {
			t.Fatalf("a pull while the only slot is held by a caller that does not read: %v after %s", err, time.Since(start))
		}
	}
}
