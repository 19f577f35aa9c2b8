package transfer

import (
	"bytes"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
)

// seedStream is a well-formed stream of an image of size bytes: a data
// frame, a chunk of zeros, a second data frame, the end.
func seedStream(size int64) []byte {
	var b bytes.Buffer
	w := newWriter(&b)
	d := []byte("podvol transfer fuzz seed")
	_ = w.data(0, d, checksum(d))
	_ = w.zero(4096, 8192)
	_ = w.data(size-int64(len(d)), d, checksum(d))
	_ = w.end()
	return b.Bytes()
}

// FuzzFrames feeds the frame decoder what a hostile or broken source could
// send after its 200: whatever it accepts stays inside the image and after
// the offset the pull resumes from, in order, each chunk of data matching
// its checksum, each frame costing the stream at least a byte (so a stream
// ends); and what it accepts, written again by the source's encoder, is
// decoded the same, its end verified.
func FuzzFrames(f *testing.F) {
	good := seedStream(1 << 20)
	f.Add(good, int64(1<<20), int64(0))
	f.Add(good, int64(1<<20), int64(4096))            // resumed past the first frame
	f.Add(good[:len(good)-5], int64(1<<20), int64(0)) // cut short
	f.Add(good, int64(1<<10), int64(0))               // frames outside the image
	corrupt := bytes.Clone(good)
	corrupt[dataHeader] ^= 1
	f.Add(corrupt, int64(1<<20), int64(0))
	var resumed bytes.Buffer // checks of what the copy holds, then data
	wr, d := newWriter(&resumed), []byte("podvol transfer fuzz seed")
	_ = wr.check(0, 4096, checksum(make([]byte, 4096)))
	_ = wr.zero(4096, 4096)
	_ = wr.data(8192, d, checksum(d))
	_ = wr.end()
	f.Add(resumed.Bytes(), int64(1<<20), int64(8192))
	f.Add(resumed.Bytes(), int64(1<<20), int64(4096)) // a check after the resume
	var fail bytes.Buffer
	_ = newWriter(&fail).fail("read 1048576 bytes at 0: input/output error")
	f.Add(fail.Bytes(), int64(1<<20), int64(0))
	f.Add([]byte{frameFail, 0xff, 0xff, 0xff, 0xff}, int64(1<<20), int64(0))
	f.Add([]byte{frameData, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0}, int64(1<<40), int64(0))
	f.Add([]byte{frameZero, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x10, 0, 0}, int64(1<<62), int64(0))
	f.Add([]byte("HTTP/1.1 200 OK\r\n"), int64(0), int64(0))

	buf := make([]byte, ChunkSize)
	f.Fuzz(func(t *testing.T, stream []byte, size, from int64) {
		if size < 0 || from < 0 || from > size {
			t.Skip() // never asked: a size is checked before, from is the target's own
		}
		// Every stream is checked, one that ends in a failure frame too:
		// the frames before it were accepted all the same.
		frames, last, _ := decodeAll(stream, size, from, buf)
		if len(frames) > len(stream) {
			t.Fatalf("%d frames decoded from %d bytes", len(frames), len(stream))
		}
		next := int64(0)
		for _, fr := range frames {
			if fr.length < 1 || fr.length > ChunkSize || fr.offset < next || fr.offset+fr.length > size {
				t.Fatalf("frame of %d bytes at %d accepted (next offset %d, image of %d bytes)", fr.length, fr.offset, next, size)
			}
			// Before the resume only checks of the copy, after it no check.
			if before := fr.offset < from; (before && (fr.kind == frameData || fr.offset+fr.length > from)) || (!before && fr.kind == frameCheck) {
				t.Fatalf("%c frame of %d bytes at %d accepted for a pull resumed from %d", fr.kind, fr.length, fr.offset, from)
			}
			if fr.kind == frameData && (int64(len(fr.data)) != fr.length || checksum(fr.data) != fr.sum) {
				t.Fatalf("data frame at %d accepted with %d bytes of data for its length %d, or a wrong checksum", fr.offset, len(fr.data), fr.length)
			}
			next = fr.offset + fr.length
		}
		if last.kind == frameFail && len(last.msg) > maxFailMsg {
			t.Fatalf("failure message of %d bytes accepted", len(last.msg))
		}

		// The source's encoder writes what was accepted, then its end:
		// the decoder reads it back frame for frame and verifies the end.
		var again bytes.Buffer
		w := newWriter(&again)
		for _, fr := range frames {
			switch fr.kind {
			case frameData:
				_ = w.data(fr.offset, fr.data, fr.sum)
			case frameCheck:
				_ = w.check(fr.offset, fr.length, fr.sum)
			default:
				_ = w.zero(fr.offset, fr.length)
			}
		}
		_ = w.end()
		back, end, err := decodeAll(again.Bytes(), size, from, buf)
		if !errors.Is(err, errStreamEnded) || end.kind != frameEnd {
			t.Fatalf("the frames accepted, encoded again, do not decode to a verified end: %v", err)
		}
		if len(back) != len(frames) {
			t.Fatalf("%d frames encoded again decode to %d", len(frames), len(back))
		}
		for i := range back {
			a, b := frames[i], back[i]
			if a.kind != b.kind || a.offset != b.offset || a.length != b.length || a.sum != b.sum || !bytes.Equal(a.data, b.data) {
				t.Fatalf("frame %d: %c %d+%d decodes again as %c %d+%d", i, a.kind, a.offset, a.length, b.kind, b.offset, b.length)
			}
		}
	})
}

// errStreamEnded: decodeAll reached an end frame, which verified.
var errStreamEnded = errors.New("end")

// decodeAll decodes stream's data and zero frames (each data frame's data
// copied out of buf), until an error, a failure frame (last, and a nil
// error) or the end (last, and errStreamEnded).
func decodeAll(stream []byte, size, from int64, buf []byte) (frames []frame, last frame, err error) {
	r := newReader(bytes.NewReader(stream), size, from)
	for {
		fr, err := r.read(buf)
		switch {
		case err != nil:
			return frames, fr, err
		case fr.kind == frameEnd:
			return frames, fr, errStreamEnded
		case fr.kind == frameFail:
			return frames, fr, nil
		}
		fr.data = bytes.Clone(fr.data)
		fr.buf = nil
		frames = append(frames, fr)
	}
}

// FuzzHeaders feeds both ends' header parsing what the other node could
// send: the target's reading of a source's 200 (the copy is sized from it,
// the identity kept in the store and sent back) and the source's reading of
// a pull's path and query (ids it opens files by). What either accepts is
// sane, and what a well-behaved peer sends is accepted as it was meant.
func FuzzHeaders(f *testing.F) {
	f.Add("268435456", "snap-0123456789abcdef01234567@1733220000000000000", "6291456", "", "", "/v1/images/snap-0123456789abcdef01234567", "namespace=team-a&name=data&uid=0b1c&from=0")
	f.Add("-1", "", "1", "x", "true", "/v1/images/../etc/shadow", "namespace=a&name=b&uid=c&from=-1")
	f.Add("9223372036854775807", "raw", "9223372036854775807", "pv-1@moving-1", "true", "/v1/images/pv-0123456789abcdef01234567", "namespace=a&name=b&uid=c&since="+strings.Repeat("x", 300))
	f.Add("10", "id with space", "11", "", "false", "/v1/images/", "")
	f.Add("0x10", "\x00", "", "", "", "/v1/images/Snap-1%2F..", "namespace=a&name=b&uid=c&from=99999999999999999999")

	f.Fuzz(func(t *testing.T, size, identity, data, since, more, path, query string) {
		h := http.Header{}
		for k, v := range map[string]string{headerSize: size, headerIdentity: identity, headerData: data, headerSince: since, headerMore: more} {
			if v != "" {
				h.Set(k, v)
			}
		}
		if a, err := answerOf(h); err == nil {
			if a.Size < 0 || a.data < 0 || a.data > a.Size || !printable(a.Identity) || len(a.Identity) > maxIdentity {
				t.Fatalf("answer %+v accepted from %q", a, h)
			}
		}
		// A source's answer is what its headers say.
		if n, err := strconv.ParseInt(size, 10, 64); err == nil && n >= 0 && printable(identity) {
			h := http.Header{}
			h.Set(headerSize, strconv.FormatInt(n, 10))
			h.Set(headerIdentity, identity)
			h.Set(headerData, strconv.FormatInt(n/2, 10))
			a, err := answerOf(h)
			if err != nil || a.Size != n || a.Identity != identity || a.data != n/2 {
				t.Fatalf("the answer of a well-behaved source (%q): %+v, %v", h, a, err)
			}
		}

		u := &url.URL{Path: path, RawQuery: query}
		if req, err := parseRequest(&http.Request{URL: u}); err == nil {
			if !sourceName.MatchString(req.Source) || strings.ContainsAny(req.Source, "/.") ||
				req.Claim.Namespace == "" || req.Claim.Name == "" || req.Claim.UID == "" || req.From < 0 || len(req.Since) > maxIdentity {
				t.Fatalf("request %+v accepted from %q?%q", req, path, query)
			}
			// What the puller would send for it is read back the same.
			p := &Pull{Source: req.Source, Claim: req.Claim}
			again, err := parseRequest(&http.Request{URL: p.url("node-a:9816", req.Since, req.From)})
			if err != nil || again != req {
				t.Fatalf("request %+v, sent again, reads %+v, %v", req, again, err)
			}
		}
	})
}
