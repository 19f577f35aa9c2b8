package transfer

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/podvol/podvol/internal/errkind"
)

// hostileSource is a source that speaks the protocol badly: it answers
// 200 with the headers it is given (none at all if stallFirst: it stalls
// before answering), writes body, and then stalls, holding the connection
// open, until the test ends.
func hostileSource(t *testing.T, c *ca, header map[string]string, body []byte, stallFirst bool) string {
	t.Helper()
	release := make(chan struct{})
	addr := serve(t, c.creds(t, CommonName("node-a")), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !stallFirst {
			w.Header().Set(headerVersion, strconv.Itoa(Version))
			for k, v := range header {
				w.Header().Set(k, v)
			}
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write(body)
			w.(http.Flusher).Flush()
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { close(release) }) // before the server stops
	return addr
}

func frames(t *testing.T, fn func(w *writer)) []byte {
	t.Helper()
	var b bytes.Buffer
	fn(newWriter(&b))
	return b.Bytes()
}

// A source is another node, which may be compromised: whatever it says,
// the target writes nothing past the claim's capacity (an image announced
// larger is refused before the copy is touched), and a source that stops
// sending fails the pull after the idle timeout, with what it had sent
// kept for the next attempt.
func TestPullBoundsAHostileSource(t *testing.T) {
	c := newCA(t)
	const claimBytes = 64 << 20
	chunk := random(4096)
	run := func(t *testing.T, addr string) (*os.File, []Checkpoint, time.Duration, error) {
		t.Helper()
		dst, _ := openDst(t)
		var cps []Checkpoint
		p := &Pull{Client: Client(c.creds(t, CommonName("node-b")), "node-a"), Address: addr, Source: "snap-x", Claim: testClaim, Dst: dst,
			MaxSize: claimBytes, IdleTimeout: 300 * time.Millisecond,
			Checkpoint: func(cp Checkpoint) error { cps = append(cps, cp); return nil }}
		// Bounded here only so that a pull that hangs fails the test.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		start := time.Now()
		_, err := p.Run(ctx)
		return dst, cps, time.Since(start), err
	}

	t.Run("announces an image larger than the claim", func(t *testing.T) {
		addr := hostileSource(t, c, map[string]string{headerSize: strconv.Itoa(1 << 30), headerIdentity: "big", headerData: "4096"},
			frames(t, func(w *writer) { _ = w.data(100<<20, chunk, checksum(chunk)) }), false)
		dst, cps, _, err := run(t, addr)
		fi, serr := dst.Stat()
		if serr != nil {
			t.Fatal(serr)
		}
		if fi.Size() != 0 || len(cps) != 0 {
			t.Fatalf("the copy was sized to %d bytes for a claim of %d, %d checkpoints recorded (pull: %v)", fi.Size(), claimBytes, len(cps), err)
		}
		if !errors.Is(err, errkind.ErrOutOfRange) || !strings.Contains(err.Error(), "1073741824 bytes") {
			t.Fatalf("pull of an image larger than the claim: %v, want out of range, saying the size", err)
		}
	})
	t.Run("sends a frame past the image it announced", func(t *testing.T) {
		addr := hostileSource(t, c, map[string]string{headerSize: strconv.Itoa(claimBytes), headerIdentity: "edge", headerData: "8192"},
			frames(t, func(w *writer) {
				_ = w.data(claimBytes-4096, chunk, checksum(chunk))
				_ = w.data(claimBytes, chunk, checksum(chunk))
			}), false)
		dst, _, _, err := run(t, addr)
		if err == nil || !strings.Contains(err.Error(), "outside the image") {
			t.Fatalf("pull of a frame past the image: %v", err)
		}
		if fi, _ := dst.Stat(); fi.Size() != claimBytes {
			t.Fatalf("the copy is %d bytes, want the claim's %d", fi.Size(), claimBytes)
		}
	})
	t.Run("stalls before answering", func(t *testing.T) {
		addr := hostileSource(t, c, nil, nil, true)
		_, _, took, err := run(t, addr)
		if !errors.Is(err, ErrIdle) || took > 5*time.Second {
			t.Fatalf("pull from a source that never answers: %v after %s, want it idle after 300ms", err, took)
		}
	})
	// What a source writes reaches the claim's events (the pull's error):
	// bounded, one line, no terminal escapes.
	noise := strings.Repeat("line\n\x1b[2J\x00", 400)
	text := func(t *testing.T, err error) {
		t.Helper()
		if err == nil || len(err.Error()) > 1024 || strings.ContainsAny(err.Error(), "\n\x1b\x00") {
			t.Fatalf("the pull's error carries the source's text unbounded (%d bytes): %q", len(err.Error()), err)
		}
	}
	t.Run("fails with a long message", func(t *testing.T) {
		addr := hostileSource(t, c, map[string]string{headerSize: strconv.Itoa(8 << 20), headerIdentity: "fails", headerData: "4096"},
			frames(t, func(w *writer) { _ = w.fail(noise) }), false)
		_, _, _, err := run(t, addr)
		text(t, err)
		if !strings.Contains(err.Error(), "the source failed: line") {
			t.Fatalf("the source's message is not in the error: %v", err)
		}
	})
	t.Run("refuses with a long message", func(t *testing.T) {
		addr := serve(t, c.creds(t, CommonName("node-a")), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, noise, http.StatusForbidden)
		}))
		_, _, _, err := run(t, addr)
		text(t, err)
		if !errors.Is(err, errkind.ErrDenied) {
			t.Fatalf("a refusal: %v, want denied", err)
		}
	})
	t.Run("stalls mid-stream", func(t *testing.T) {
		addr := hostileSource(t, c, map[string]string{headerSize: strconv.Itoa(8 << 20), headerIdentity: "slow", headerData: strconv.Itoa(2 << 20)},
			frames(t, func(w *writer) {
				_ = w.data(0, chunk, checksum(chunk))
				_ = w.data(1<<20, chunk, checksum(chunk))
			}), false)
		_, cps, took, err := run(t, addr)
		if !errors.Is(err, ErrIdle) || took > 5*time.Second {
			t.Fatalf("pull from a source that stalls: %v after %s, want it idle after 300ms", err, took)
		}
		if !strings.Contains(err.Error(), "no data from the source") {
			t.Errorf("the error does not say the source stalled: %v", err)
		}
		if len(cps) == 0 || cps[len(cps)-1].Verified != 1<<20+4096 {
			t.Errorf("checkpoints %+v: want what arrived before the stall kept", cps)
		}
	})
}
