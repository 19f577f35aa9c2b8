package transfer

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// hostileText is what a hostile source would have a target write into its
// events and logs: terminal escapes, lines of its own, a bidi override,
// bytes that are not UTF-8, and length.
var hostileText = "\x1b[2J\x1b[31mfake\r\nE0101 00:00:00 forged log line\u202egnp.exe\xff\xfe" + strings.Repeat("x", 3000)

// checkText fails unless s, a pull's error, is fit for an event: valid
// UTF-8 with no control or format characters, the source's words bounded.
func checkText(t *testing.T, what, s string) {
	t.Helper()
	if !utf8.ValidString(s) {
		t.Errorf("%s: not UTF-8: %q", what, s)
	}
	for _, r := range s {
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) {
			t.Errorf("%s: carries %U: %q", what, r, s)
			break
		}
	}
	if len(s) > maxPeerText+300 {
		t.Errorf("%s: %d bytes, want the source's part at most %d", what, len(s), maxPeerText)
	}
}

// What a source says reaches the claim's events and this node's log
// through the pull's error: its refusal's body, its failure frame and a
// malformed header (quoted whole by net/http's error) are cut to
// maxPeerText and carry no control or format characters.
func TestPullBoundsTheSourcesText(t *testing.T) {
	c := newCA(t)
	for name, h := range map[string]http.Handler{
		"refusal": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, hostileText, http.StatusForbidden)
		}),
		"failure frame": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set(headerSize, "4096")
			w.Header().Set(headerIdentity, "raw")
			w.Header().Set(headerData, "1")
			_ = newWriter(w).fail(hostileText)
		}),
		"identity": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set(headerSize, "4096")
			w.Header().Set(headerIdentity, "snap-1@1\x1b[31m"+strings.Repeat("y", 3000))
			w.Header().Set(headerData, "1")
			_ = newWriter(w).end()
		}),
	} {
		t.Run(name, func(t *testing.T) {
			addr := serve(t, c.creds(t, CommonName("node-a")), h)
			dst, _ := openDst(t)
			p := &Pull{Client: Client(c.creds(t, CommonName("node-b")), "node-a"), Address: addr, Source: "snap-x", Claim: testClaim, Dst: dst}
			res, err := p.Run(context.Background())
			if err == nil {
				t.Fatalf("pull from a hostile source: no error (identity %q)", res.Identity)
			}
			checkText(t, "the pull's error", err.Error())
		})
	}
}
