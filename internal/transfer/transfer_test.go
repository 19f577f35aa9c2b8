package transfer

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"

	"github.com/podvol/podvol/internal/errkind"
)

// ca signs node certificates the way podvol's signer does: one key pair,
// the node in the subject, usable by both ends.
type ca struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newCA(t testing.TB) *ca {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "podvol transfer test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &ca{cert: cert, key: key, pool: pool}
}

var serial int64 = 100

// creds issues a certificate with the common name cn, trusted by c's roots.
func (c *ca) creds(t testing.TB, cn string) creds {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	if err != nil {
		t.Fatal(err)
	}
	return creds{cert: &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, roots: c.pool}
}

type creds struct {
	cert  *tls.Certificate
	roots *x509.CertPool
}

func (c creds) Certificate() (*tls.Certificate, error) { return c.cert, nil }
func (c creds) Roots() (*x509.CertPool, error)         { return c.roots, nil }

// files serves images from a directory, as the pool would.
type files struct {
	dir    string
	mu     sync.Mutex
	opened int
	// bases are the images kept as bases of changes, by identity; more
	// the sources served with More.
	bases map[string]string
	more  map[string]bool
}

func (f *files) Open(_ context.Context, r Request) (Image, error) {
	source := r.Source
	f.mu.Lock()
	f.opened++
	f.mu.Unlock()
	file, err := os.Open(filepath.Join(f.dir, source+".img"))
	if errors.Is(err, os.ErrNotExist) {
		return Image{}, fmt.Errorf("image %s: %w", source, errkind.ErrNotFound)
	}
	if err != nil {
		return Image{}, err
	}
	fi, err := file.Stat()
	if err != nil {
		file.Close()
		return Image{}, err
	}
	img := Image{File: file, Size: fi.Size(), Identity: identity(fi)}
	f.mu.Lock()
	defer f.mu.Unlock()
	img.More = f.more[source]
	if path, ok := f.bases[r.Since]; ok && r.Since != "" {
		if img.Base, err = os.Open(path); err != nil {
			file.Close()
			return Image{}, err
		}
	}
	return img, nil
}

func identity(fi os.FileInfo) string {
	return fmt.Sprintf("%d:%d", fi.Sys().(*syscall.Stat_t).Ino, fi.ModTime().UnixNano())
}

// keepBase keeps source's image as the base of the changes to come, under
// its identity, and returns that.
func (f *files) keepBase(t *testing.T, source string) string {
	t.Helper()
	path := filepath.Join(f.dir, source+".img")
	kept := filepath.Join(f.dir, source+".base.img")
	if err := os.Rename(path, kept); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(kept)
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.bases == nil {
		f.bases = map[string]string{}
	}
	f.bases[identity(fi)] = kept
	return identity(fi)
}

// authz records what it was asked and answers err; move marks every
// request a migration's.
type authz struct {
	mu   sync.Mutex
	seen []Request
	err  error
	move bool
}

func (a *authz) Authorize(_ context.Context, r *Request) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.seen = append(a.seen, *r)
	r.Move = a.move
	return a.err
}

// serve runs h on 127.0.0.1 with c's credentials until the test ends.
func serve(t testing.TB, c creds, h http.Handler) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, lis, c, h) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return lis.Addr().String()
}

const testClaimUID = "0b1c2d3e-0000-4000-8000-000000000001"

var testClaim = Claim{Namespace: "team-a", Name: "data", UID: testClaimUID}

type extent struct {
	off  int64
	data []byte
}

func random(n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return b
}

// makeImage writes a sparse image of size with data at the extents.
func makeImage(t testing.TB, path string, size int64, ext []extent) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	for _, e := range ext {
		if _, err := f.WriteAt(e.data, e.off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

func fileSum(t *testing.T, path string) [32]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return [32]byte(h.Sum(nil))
}

func allocated(t *testing.T, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// fixture is a source node (node-a) serving dir's images, and the
// credentials of the node that pulls (node-b).
type fixture struct {
	dir    string
	ca     *ca
	images *files
	authz  *authz
	addr   string
	target creds
	server *Server
}

func newFixture(t testing.TB, limiter *rate.Limiter, wrap func(http.Handler) http.Handler) *fixture {
	t.Helper()
	fx := &fixture{dir: t.TempDir(), ca: newCA(t), authz: &authz{}}
	fx.images = &files{dir: fx.dir}
	fx.server = &Server{Images: fx.images, Authorizer: fx.authz, Limiter: limiter}
	var h http.Handler = fx.server
	if wrap != nil {
		h = wrap(h)
	}
	fx.addr = serve(t, fx.ca.creds(t, CommonName("node-a")), h)
	fx.target = fx.ca.creds(t, CommonName("node-b"))
	return fx
}

func (fx *fixture) pull(t testing.TB, source string, dst *os.File) *Pull {
	return &Pull{Client: Client(fx.target, "node-a"), Address: fx.addr, Source: source, Claim: testClaim, Dst: dst}
}

func openDst(t testing.TB) (*os.File, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "copy.img")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f, path
}

// A 256 MiB image holding 6 MiB moves 5 MiB of data and a 1 MiB chunk of
// zeros as its length: the copy is equal, as sparse as the source, and
// the source was asked by the caller's node with the claim.
func TestPullMovesOnlyTheData(t *testing.T) {
	fx := newFixture(t, nil, nil)
	src := filepath.Join(fx.dir, "snap-1.img")
	makeImage(t, src, 256<<20, []extent{
		{10 << 20, random(3 << 20)},
		{50 << 20, make([]byte, 1<<20)}, // written zeros: allocated, sent as a length
		{200 << 20, random(2 << 20)},
		{256<<20 - 4096, random(4096)},
	})
	dst, dstPath := openDst(t)
	p := fx.pull(t, "snap-1", dst)
	var last Progress
	var checkpoints []Checkpoint
	p.Progress = func(pr Progress) { last = pr }
	p.Checkpoint = func(c Checkpoint) error { checkpoints = append(checkpoints, c); return nil }
	p.SyncEvery = 2 << 20
	res, err := p.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if fileSum(t, src) != fileSum(t, dstPath) {
		t.Fatal("the copy differs from the source")
	}
	wantSent := int64(5<<20 + 4096)
	if served := fx.server.SentBytes(); served != wantSent {
		t.Errorf("the source counts %d bytes sent, want %d", served, wantSent)
	}
	if res.Sent != wantSent || res.Zeros != 1<<20 {
		t.Errorf("sent %d bytes of data and %d of zeros, want %d and %d", res.Sent, res.Zeros, wantSent, 1<<20)
	}
	if got, most := allocated(t, dstPath), wantSent+(1<<20); got > most {
		t.Errorf("the copy allocates %d bytes, want at most %d (the data)", got, most)
	}
	if res.Verified != 256<<20 || res.Size != 256<<20 || res.Identity == "" {
		t.Errorf("result %+v, want verified to the size", res.Checkpoint)
	}
	if last.Done != last.Total || last.Total != wantSent+1<<20 {
		t.Errorf("last progress %d of %d, want all of %d", last.Done, last.Total, wantSent+1<<20)
	}
	if len(checkpoints) < 3 || checkpoints[len(checkpoints)-1].Verified != 256<<20 {
		t.Errorf("checkpoints %+v: want several, the last at the end", checkpoints)
	}
	for i := 1; i < len(checkpoints); i++ {
		if checkpoints[i].Verified <= checkpoints[i-1].Verified {
			t.Errorf("checkpoints go backwards: %+v", checkpoints)
		}
	}
	want := Request{Caller: "node-b", Source: "snap-1", Claim: testClaim, Version: Version}
	if len(fx.authz.seen) != 1 || fx.authz.seen[0] != want {
		t.Errorf("authorizer asked %+v, want once %+v", fx.authz.seen, want)
	}
}

// abortAfter serves until n bytes of the body are written, then drops the
// connection, as a source node that restarts does.
func abortAfter(n int) func(http.Handler) http.Handler {
	return func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h.ServeHTTP(&cutWriter{ResponseWriter: w, left: n}, r)
		})
	}
}

type cutWriter struct {
	http.ResponseWriter
	left int
}

func (c *cutWriter) Write(b []byte) (int, error) {
	if len(b) > c.left {
		_, _ = c.ResponseWriter.Write(b[:c.left])
		panic(http.ErrAbortHandler)
	}
	c.left -= len(b)
	return c.ResponseWriter.Write(b)
}

// A source that stops mid-stream fails the pull; the pull resumes from its
// last checkpoint, moves only what is left, and the copy is equal.
func TestPullResumesAfterTheSourceStops(t *testing.T) {
	var once sync.Once
	cut := abortAfter(5<<20 + 100)
	fx := newFixture(t, nil, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			first := false
			once.Do(func() { first = true })
			if first {
				cut(h).ServeHTTP(w, r)
				return
			}
			h.ServeHTTP(w, r)
		})
	})
	src := filepath.Join(fx.dir, "snap-2.img")
	makeImage(t, src, 64<<20, []extent{{0, random(12 << 20)}, {40 << 20, random(4 << 20)}})
	dst, dstPath := openDst(t)
	var cp Checkpoint
	p := fx.pull(t, "snap-2", dst)
	p.SyncEvery = 1 << 20
	p.Checkpoint = func(c Checkpoint) error { cp = c; return nil }
	if _, err := p.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "unexpected EOF") {
		t.Fatalf("first pull: %v, want the stream cut", err)
	}
	if cp.Verified < 4<<20 || cp.Verified > 6<<20 {
		t.Fatalf("checkpoint after the cut at %d, want about 5 MiB", cp.Verified)
	}
	p.Resume, p.Checkpoint = cp, nil
	res, err := p.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if res.Resumed != cp.Verified || res.Sent != 16<<20-cp.Verified {
		t.Errorf("resumed at %d sending %d bytes, want %d and %d", res.Resumed, res.Sent, cp.Verified, 16<<20-cp.Verified)
	}
	if fileSum(t, src) != fileSum(t, dstPath) {
		t.Fatal("the resumed copy differs from the source")
	}
}

// damage overwrites n bytes of f at off with garbage.
func damage(t *testing.T, f *os.File, off int64, n int) {
	t.Helper()
	if _, err := f.WriteAt(bytes.Repeat([]byte{0xa5}, n), off); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

// A resumed pull checks what the copy holds before the offset it resumes
// from against the source (check frames: the stream's digest covers the
// whole image, not only what the last attempt sent): a copy damaged there
// since the attempt that wrote it, in its data or in a hole, fails the
// pull, whose checkpoint then goes back to the damage, and the next
// attempt pulls from there and makes the copy whole. What an earlier
// attempt wrote past its checkpoint (garbage where the image has a hole)
// does not survive either.
func TestResumedPullChecksWhatTheCopyHolds(t *testing.T) {
	for _, c := range []struct {
		name string
		at   int64 // where the copy is damaged
		// found: where the resumed pull finds the damage (the start of
		// the checked chunk of data, the first byte in a hole), its
		// checkpoint back there; 0: the damage is past the checkpoint,
		// and simply undone.
		found int64
	}{
		{"data before the checkpoint", 1<<20 + 100, 1 << 20},
		{"a hole before the checkpoint", 2<<20 + 512<<10, 2<<20 + 512<<10},
		{"a hole past the checkpoint", 20 << 20, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			var once sync.Once
			cut := abortAfter(5<<20 + 100)
			fx := newFixture(t, nil, func(h http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					first := false
					once.Do(func() { first = true })
					if first {
						cut(h).ServeHTTP(w, r)
						return
					}
					h.ServeHTTP(w, r)
				})
			})
			// The cut comes after the extent at 3 MiB: the resumed pull's
			// first frame is at 40 MiB, after a hole.
			src := filepath.Join(fx.dir, "snap-r.img")
			makeImage(t, src, 64<<20, []extent{{0, random(2 << 20)}, {3 << 20, random(3 << 20)}, {40 << 20, random(4 << 20)}})
			dst, dstPath := openDst(t)
			var cp Checkpoint
			p := fx.pull(t, "snap-r", dst)
			p.SyncEvery = 1 << 20
			p.Checkpoint = func(c Checkpoint) error { cp = c; return nil }
			if _, err := p.Run(context.Background()); err == nil {
				t.Fatal("the first pull was not cut")
			}
			if cp.Verified < 4<<20 || cp.Verified > 6<<20 {
				t.Fatalf("checkpoint after the cut at %d, want 4 to 6 MiB", cp.Verified)
			}
			damage(t, dst, c.at, 4096)
			p.Resume = cp
			res, err := p.Run(context.Background())
			if c.found > 0 {
				if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("the copy's bytes from offset %d", c.found)) || !strings.Contains(err.Error(), "differ from the source's") {
					t.Fatalf("a resumed pull over a copy damaged at %d: %v, want the damage found at %d", c.at, err, c.found)
				}
				if cp.Verified != c.found {
					t.Fatalf("checkpoint at %d after the damage was found, want it back at %d", cp.Verified, c.found)
				}
				p.Resume = cp
				if res, err = p.Run(context.Background()); err != nil {
					t.Fatal(err)
				}
				if res.Resumed != c.found {
					t.Errorf("the pull after the damage resumed at %d, want %d", res.Resumed, c.found)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if fileSum(t, src) != fileSum(t, dstPath) {
				t.Fatal("the resumed copy differs from the source")
			}
		})
	}
}

// A pull resumed from inside a hole (a checkpoint after the damage found
// there) whose copy holds written zeros before it checks them and writes
// what follows as the source has it.
func TestResumedPullFromAHole(t *testing.T) {
	fx := newFixture(t, nil, nil)
	src := filepath.Join(fx.dir, "snap-h.img")
	makeImage(t, src, 32<<20, []extent{{0, random(4096)}, {16 << 20, random(2 << 20)}})
	img, err := fx.images.Open(context.Background(), Request{Source: "snap-h"})
	if err != nil {
		t.Fatal(err)
	}
	img.File.Close()
	head := make([]byte, 1<<20)
	f, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadAt(head, 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	dst, dstPath := openDst(t)
	if err := dst.Truncate(32 << 20); err != nil {
		t.Fatal(err)
	}
	if _, err := dst.WriteAt(head, 0); err != nil { // zeros written: data, not a hole
		t.Fatal(err)
	}
	p := fx.pull(t, "snap-h", dst)
	p.Resume = Checkpoint{Identity: img.Identity, Size: 32 << 20, Verified: 1 << 20}
	var checking []Progress
	p.Progress = func(pr Progress) {
		if pr.Done == 0 {
			checking = append(checking, pr)
		}
	}
	res, err := p.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(checking) == 0 || checking[0].Resumed != 1<<20 || checking[0].Checked != 4096 {
		t.Errorf("progress while checking the copy: %+v, want the check of the first 4 KiB of 1 MiB", checking)
	}
	if res.Resumed != 1<<20 || res.Sent != 2<<20 {
		t.Errorf("resumed at %d sending %d, want 1 MiB and the 2 MiB after", res.Resumed, res.Sent)
	}
	if fileSum(t, src) != fileSum(t, dstPath) {
		t.Fatal("the resumed copy differs from the source")
	}
}

// A target that stops (its context ends: the plugin restarts) resumes from
// its checkpoint too.
func TestPullResumesAfterTheTargetStops(t *testing.T) {
	fx := newFixture(t, nil, nil)
	src := filepath.Join(fx.dir, "snap-3.img")
	makeImage(t, src, 32<<20, []extent{{1 << 20, random(20 << 20)}})
	dst, dstPath := openDst(t)
	ctx, cancel := context.WithCancel(context.Background())
	var cp Checkpoint
	p := fx.pull(t, "snap-3", dst)
	p.SyncEvery = 1 << 20
	p.Checkpoint = func(c Checkpoint) error {
		cp = c
		if c.Verified >= 8<<20 {
			cancel()
		}
		return nil
	}
	if _, err := p.Run(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("pull: %v, want it cancelled", err)
	}
	if cp.Verified < 8<<20 {
		t.Fatalf("checkpoint %d, want at least 8 MiB", cp.Verified)
	}
	p.Resume, p.Checkpoint = cp, nil
	res, err := p.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if res.Resumed != cp.Verified {
		t.Errorf("resumed at %d, want %d", res.Resumed, cp.Verified)
	}
	if fileSum(t, src) != fileSum(t, dstPath) {
		t.Fatal("the resumed copy differs from the source")
	}
}

// A checkpoint of another image (the source's snapshot was cut again) is
// not resumed: the pull starts again, and nothing of the old copy is left,
// holes included.
func TestPullStartsAgainWhenTheImageChanged(t *testing.T) {
	fx := newFixture(t, nil, nil)
	src := filepath.Join(fx.dir, "snap-4.img")
	makeImage(t, src, 16<<20, []extent{{8 << 20, random(1 << 20)}})
	dst, dstPath := openDst(t)
	if _, err := dst.WriteAt(bytes.Repeat([]byte{0xAA}, 16<<20), 0); err != nil {
		t.Fatal(err)
	}
	p := fx.pull(t, "snap-4", dst)
	p.Resume = Checkpoint{Identity: "an-older-cut", Size: 16 << 20, Verified: 12 << 20}
	res, err := p.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if res.Resumed != 0 {
		t.Errorf("resumed at %d, want a new start", res.Resumed)
	}
	if fileSum(t, src) != fileSum(t, dstPath) {
		t.Fatal("the copy keeps bytes of the old one")
	}
}

// rawSource answers a pull with a stream the test makes.
func rawSource(size int64, body []byte) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(headerVersion, strconv.Itoa(Version))
		w.Header().Set(headerSize, strconv.FormatInt(size, 10))
		w.Header().Set(headerIdentity, "raw")
		w.Header().Set(headerData, "1")
		_, _ = w.Write(body)
	})
}

// A chunk altered after its digest was taken, or a stream whose digest
// does not cover what arrived, fails the pull before the chunk counts as
// verified.
func TestPullRefusesCorruptStreams(t *testing.T) {
	c := newCA(t)
	good := random(4096)
	altered := func() []byte {
		var b bytes.Buffer
		w := newWriter(&b)
		if err := w.data(0, good, checksum(good)); err != nil {
			t.Fatal(err)
		}
		raw := b.Bytes()
		raw[len(raw)-1] ^= 1
		_ = w.end()
		return b.Bytes()
	}()
	dropped := func() []byte {
		var sent, all bytes.Buffer
		ws, wa := newWriter(&sent), newWriter(&all)
		_ = wa.data(0, good, checksum(good))
		_ = ws.data(8192, good, checksum(good))
		_ = wa.data(8192, good, checksum(good))
		ws.digest, ws.total = wa.digest, wa.total // the end of the stream with both
		_ = ws.end()
		return sent.Bytes()
	}()
	for name, c2 := range map[string]struct {
		body []byte
		want string
	}{
		"altered": {altered, "does not match its checksum"},
		"dropped": {dropped, "described 8192 bytes of the image"},
	} {
		t.Run(name, func(t *testing.T) {
			addr := serve(t, c.creds(t, CommonName("node-a")), rawSource(16384, c2.body))
			dst, _ := openDst(t)
			var cps []Checkpoint
			p := &Pull{Client: Client(c.creds(t, CommonName("node-b")), "node-a"), Address: addr, Source: "snap-x", Claim: testClaim, Dst: dst,
				Checkpoint: func(cp Checkpoint) error { cps = append(cps, cp); return nil }}
			_, err := p.Run(context.Background())
			if err == nil || !strings.Contains(err.Error(), c2.want) {
				t.Fatalf("pull: %v, want %q", err, c2.want)
			}
			for _, cp := range cps {
				if cp.Verified == 16384 {
					t.Errorf("checkpoint %+v counts the corrupt stream as verified", cp)
				}
			}
		})
	}
}

// Only a node with a certificate of the signer, asking its own source,
// for a pull the authorizer allows, gets data.
func TestPullRefusals(t *testing.T) {
	fx := newFixture(t, nil, nil)
	makeImage(t, filepath.Join(fx.dir, "snap-5.img"), 1<<20, []extent{{0, random(4096)}})
	get := func(t *testing.T, client *http.Client, source string) error {
		t.Helper()
		dst, _ := openDst(t)
		_, err := (&Pull{Client: client, Address: fx.addr, Source: source, Claim: testClaim, Dst: dst}).Run(context.Background())
		return err
	}
	t.Run("no client certificate", func(t *testing.T) {
		noCert := creds{cert: &tls.Certificate{}, roots: fx.ca.pool}
		if err := get(t, Client(noCert, "node-a"), "snap-5"); err == nil {
			t.Fatal("a client without a certificate pulled")
		}
	})
	t.Run("certificate of another signer", func(t *testing.T) {
		other := newCA(t).creds(t, CommonName("node-b"))
		other.roots = fx.ca.pool
		if err := get(t, Client(other, "node-a"), "snap-5"); err == nil {
			t.Fatal("a certificate of another signer pulled")
		}
	})
	t.Run("server is not the node asked", func(t *testing.T) {
		err := get(t, Client(fx.target, "node-c"), "snap-5")
		if err == nil || !strings.Contains(err.Error(), "names node node-a, not node-c") {
			t.Fatalf("pull from a server of the wrong node: %v", err)
		}
	})
	t.Run("certificate names no node", func(t *testing.T) {
		err := get(t, Client(fx.ca.creds(t, "system:admin"), "node-a"), "snap-5")
		if !errors.Is(err, errkind.ErrDenied) {
			t.Fatalf("pull with a certificate naming no node: %v, want denied", err)
		}
	})
	t.Run("path outside the images", func(t *testing.T) {
		for _, source := range []string{"..%2Fetc%2Fshadow", "snap-5%2F..%2F..", "Snap-5"} {
			err := get(t, Client(fx.target, "node-a"), source)
			if !errors.Is(err, errkind.ErrInvalid) && !errors.Is(err, errkind.ErrNotFound) {
				t.Errorf("pull of %q: %v, want refused", source, err)
			}
		}
	})
	t.Run("authorizer refuses", func(t *testing.T) {
		fx.authz.err = fmt.Errorf("claim team-a/data is not bound for node-b: %w", errkind.ErrDenied)
		defer func() { fx.authz.err = nil }()
		before := fx.images.opened
		err := get(t, Client(fx.target, "node-a"), "snap-5")
		if !errors.Is(err, errkind.ErrDenied) || !strings.Contains(err.Error(), "not bound for node-b") {
			t.Fatalf("refused pull: %v", err)
		}
		if fx.images.opened != before {
			t.Error("the image was opened for a refused pull")
		}
	})
	t.Run("allowed", func(t *testing.T) {
		if err := get(t, Client(fx.target, "node-a"), "snap-5"); err != nil {
			t.Fatal(err)
		}
	})
}

// Both ends check the transfer protocol's version: a caller that announces
// none (a plugin older than versions, which would ignore Podvol-More and
// switch a migration after its first copy) or another one is refused
// before the image is opened, with what to do, and the server's Mismatch
// hears of it; a source that answers with none or another one is refused
// before a frame is read.
func TestVersionSkewIsRefused(t *testing.T) {
	fx := newFixture(t, nil, nil)
	makeImage(t, filepath.Join(fx.dir, "snap-v.img"), 1<<20, []extent{{0, random(4096)}})
	var mismatches []error
	fx.server.Mismatch = func(_ context.Context, r Request, err error) {
		if r.Caller != "node-b" || r.Claim != testClaim {
			t.Errorf("Mismatch told of %+v", r)
		}
		mismatches = append(mismatches, err)
	}
	get := func(t *testing.T, version string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, "https://"+fx.addr+Path+"snap-v?namespace=team-a&name=data&uid="+testClaimUID, nil)
		if err != nil {
			t.Fatal(err)
		}
		if version != "" {
			req.Header.Set(headerVersion, version)
		}
		resp, err := Client(fx.target, "node-a").Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	for _, c := range []struct {
		name, version string
		move          bool
		want          []string
	}{
		{"a migration's pull without a version", "", true, []string{"node node-b's plugin announced no transfer protocol version", "too old to take a migration's copy", "claim team-a/data waits", "upgrade the podvol node plugins"}},
		{"a restore's pull without a version", "", false, []string{"node node-b's plugin announced no transfer protocol version", "upgrade the podvol node plugins"}},
		{"a newer caller", strconv.Itoa(Version + 1), true, []string{fmt.Sprintf("speaks transfer protocol version %d, this node version %d", Version+1, Version), "upgrade the podvol node plugins"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			fx.authz.move = c.move
			defer func() { fx.authz.move = false }()
			opened, told := fx.images.opened, len(mismatches)
			code, body := get(t, c.version)
			if code != http.StatusUpgradeRequired {
				t.Fatalf("answered %d (%s), want %d", code, body, http.StatusUpgradeRequired)
			}
			for _, w := range c.want {
				if !strings.Contains(body, w) {
					t.Errorf("answer %q does not say %q", body, w)
				}
			}
			if fx.images.opened != opened {
				t.Error("the image was opened for a refused pull")
			}
			if len(mismatches) != told+1 || !errors.Is(mismatches[len(mismatches)-1], ErrVersion) {
				t.Errorf("Mismatch heard %v", mismatches[told:])
			}
		})
	}
	t.Run("a pull of this version passes", func(t *testing.T) {
		dst, _ := openDst(t)
		p := fx.pull(t, "snap-v", dst)
		fx.server.Mismatch = nil
		fx.authz.move = true
		defer func() { fx.authz.move = false }()
		// A caller that announces the version passes.
		if _, err := p.Run(context.Background()); err != nil {
			t.Fatalf("a pull of this version: %v", err)
		}
	})
	for _, c := range []struct{ name, version, want string }{
		{"a source without a version", "", "answered with transfer protocol version none"},
		{"a newer source", strconv.Itoa(Version + 1), fmt.Sprintf("answered with transfer protocol version %d, this node speaks version %d", Version+1, Version)},
		{"a source that refuses this version", "refuse", "426 Upgrade Required: node node-b's plugin speaks"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ca := newCA(t)
			// A stream that is right in every other way.
			var body bytes.Buffer
			w, data := newWriter(&body), random(4096)
			_ = w.data(0, data, checksum(data))
			_ = w.end()
			addr := serve(t, ca.creds(t, CommonName("node-a")), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if got := r.Header.Get(headerVersion); got != strconv.Itoa(Version) {
					t.Errorf("the pull announced version %q, want %d", got, Version)
				}
				if c.version == "refuse" {
					http.Error(w, callerSpeaks(Request{Caller: "node-b", Version: Version + 1}).Error(), http.StatusUpgradeRequired)
					return
				}
				if c.version != "" {
					w.Header().Set(headerVersion, c.version)
				}
				w.Header().Set(headerSize, "4096")
				w.Header().Set(headerIdentity, "old")
				w.Header().Set(headerData, "4096")
				w.Header().Set(headerMore, "true")
				_, _ = w.Write(body.Bytes())
			}))
			dst, _ := openDst(t)
			var cps []Checkpoint
			p := &Pull{Client: Client(ca.creds(t, CommonName("node-b")), "node-a"), Address: addr, Source: "snap-v", Claim: testClaim, Dst: dst,
				Checkpoint: func(cp Checkpoint) error { cps = append(cps, cp); return nil }}
			_, err := p.Run(context.Background())
			if !errors.Is(err, ErrVersion) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "upgrade the podvol node plugins") {
				t.Fatalf("pull: %v, want ErrVersion saying %q", err, c.want)
			}
			if len(cps) != 0 {
				t.Errorf("checkpoints %+v of a refused source", cps)
			}
		})
	}
}

// The bandwidth limit is taken for each chunk of data, not for zeros: with
// a budget of one chunk and no refill, 2 MiB of zeros and one chunk of
// data arrive and nothing more (the pull is stopped 300 ms after that; the
// rest would be on its way by then without the limit).
func TestBandwidthLimitChargesData(t *testing.T) {
	fx := newFixture(t, rate.NewLimiter(0, ChunkSize), nil)
	makeImage(t, filepath.Join(fx.dir, "snap-6.img"), 8<<20, []extent{
		{0, make([]byte, 2<<20)}, {2 << 20, random(3 << 20)},
	})
	dst, _ := openDst(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	var last Progress
	p := fx.pull(t, "snap-6", dst)
	p.Progress = func(pr Progress) {
		mu.Lock()
		defer mu.Unlock()
		last = pr
		if pr.Done == 3<<20 {
			time.AfterFunc(300*time.Millisecond, cancel)
		}
	}
	if _, err := p.Run(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("pull: %v, want it held by the limit until cancelled", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if last.Done != 3<<20 {
		t.Errorf("received %d bytes, want 2 MiB of zeros and 1 MiB of data", last.Done)
	}
}

// A checkpoint whose copy is gone (an empty file where the checkpoint
// verified 4 MiB) is not trusted, and a checkpoint beyond the end of the
// source's image (cut again, smaller) is not refused for good: both pulls
// start again and copy the image whole.
func TestPullStartsAgainWhenTheCheckpointCannotHold(t *testing.T) {
	fx := newFixture(t, nil, nil)
	src := filepath.Join(fx.dir, "snap-7.img")
	makeImage(t, src, 8<<20, []extent{{0, random(6 << 20)}})
	img, err := fx.images.Open(context.Background(), Request{Source: "snap-7"})
	if err != nil {
		t.Fatal(err)
	}
	img.File.Close()
	for name, resume := range map[string]Checkpoint{
		"copy lost":    {Identity: img.Identity, Size: 8 << 20, Verified: 4 << 20},
		"image shrank": {Identity: "older", Size: 64 << 20, Verified: 32 << 20},
	} {
		t.Run(name, func(t *testing.T) {
			dst, dstPath := openDst(t)
			if name == "image shrank" {
				if err := dst.Truncate(64 << 20); err != nil {
					t.Fatal(err)
				}
			}
			p := fx.pull(t, "snap-7", dst)
			p.Resume = resume
			res, err := p.Run(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if res.Resumed != 0 || res.Sent != 6<<20 {
				t.Errorf("resumed at %d sending %d, want a whole copy", res.Resumed, res.Sent)
			}
			if fileSum(t, src) != fileSum(t, dstPath) {
				t.Fatal("the copy differs from the source")
			}
		})
	}
}

// A copy pulled whole, Since which the source has changed (an extent
// rewritten, one deleted, one added, one kept), becomes the new image with
// one more pull: the deleted extent is a hole again in the copy, and the
// stream says when the source will have more. On a filesystem that shares
// no blocks (the unit tests' tmpfs) every data extent counts as changed;
// TestPullSinceSendsOnlyWhatChanged shows what a reflink pool saves.
func TestPullSinceAppliesChanges(t *testing.T) {
	fx := newFixture(t, nil, nil)
	kept := random(2 << 20)
	makeImage(t, filepath.Join(fx.dir, "vol.img"), 64<<20, []extent{{0, random(4 << 20)}, {16 << 20, random(4 << 20)}, {40 << 20, kept}})
	fx.images.more = map[string]bool{"vol": true}
	dst, dstPath := openDst(t)
	first, err := fx.pull(t, "vol", dst).Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !first.More {
		t.Fatal("the source served More, the pull did not say so")
	}
	base := fx.images.keepBase(t, "vol")
	if first.Identity != base {
		t.Fatalf("the pull holds %q, the source kept %q", first.Identity, base)
	}
	next := filepath.Join(fx.dir, "vol.img")
	makeImage(t, next, 64<<20, []extent{{0, random(4 << 20)}, {40 << 20, kept}, {50 << 20, random(1 << 20)}})
	fx.images.more = nil
	p := fx.pull(t, "vol", dst)
	p.Resume = Holding(first.Checkpoint)
	var cps []Checkpoint
	p.Checkpoint = func(cp Checkpoint) error { cps = append(cps, cp); return nil }
	res, err := p.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if res.More || res.Base != base || res.Verified != 64<<20 {
		t.Errorf("result %+v, want the new image's whole, changed from %s, no more", res.Checkpoint, base)
	}
	if fileSum(t, next) != fileSum(t, dstPath) {
		t.Fatal("the copy differs from the changed image")
	}
	if got, want := allocated(t, dstPath), allocated(t, next); got > want {
		t.Errorf("the copy holds %d bytes, the image %d: the deleted extent was not given back", got, want)
	}
	if res.Zeros < 4<<20 {
		t.Errorf("%d bytes sent as zeros, want the deleted extent's 4 MiB at least", res.Zeros)
	}
	seen := fx.authz.seen[len(fx.authz.seen)-1]
	if seen.Since != base {
		t.Errorf("the source was asked since %q, want %q", seen.Since, base)
	}
	if len(cps) == 0 || cps[len(cps)-1].Base != base {
		t.Errorf("checkpoints %+v do not say what the changes apply to", cps)
	}
}

// A pull of changes that stops half-way resumes Since the same base from
// where it stopped; and when the source no longer holds the base (or
// serves another image), the copy is pulled again whole, never left half
// changed.
func TestPullSinceResumesOrStartsAgain(t *testing.T) {
	fx := newFixture(t, nil, nil)
	makeImage(t, filepath.Join(fx.dir, "vol.img"), 32<<20, []extent{{0, random(8 << 20)}})
	dst, dstPath := openDst(t)
	first, err := fx.pull(t, "vol", dst).Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	base := fx.images.keepBase(t, "vol")
	next := filepath.Join(fx.dir, "vol.img")
	makeImage(t, next, 32<<20, []extent{{0, random(8 << 20)}, {16 << 20, random(8 << 20)}})
	img, err := fx.images.Open(context.Background(), Request{Source: "vol"})
	if err != nil {
		t.Fatal(err)
	}
	img.File.Close()
	// As a pull of the changes stopped after 10 MiB would have left it:
	// the first 10 MiB of the new image over the base.
	part := make([]byte, 10<<20)
	src, err := os.Open(next)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.ReadAt(part, 0); err != nil {
		t.Fatal(err)
	}
	src.Close()
	if _, err := dst.WriteAt(part, 0); err != nil {
		t.Fatal(err)
	}
	stopped := Checkpoint{Identity: img.Identity, Size: 32 << 20, Verified: 10 << 20, Base: first.Identity}

	p := fx.pull(t, "vol", dst)
	p.Resume = stopped
	res, err := p.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if res.Resumed != 10<<20 || res.Sent != 8<<20 {
		t.Errorf("resumed at %d sending %d, want 10 MiB and the 8 MiB of data after", res.Resumed, res.Sent)
	}
	if fileSum(t, next) != fileSum(t, dstPath) {
		t.Fatal("the resumed copy differs from the changed image")
	}

	// The base is gone on the source: the same checkpoint starts again.
	fx.images.mu.Lock()
	delete(fx.images.bases, base)
	fx.images.mu.Unlock()
	dst2, dstPath2 := openDst(t)
	if _, err := dst2.WriteAt(part, 0); err != nil {
		t.Fatal(err)
	}
	if err := dst2.Truncate(32 << 20); err != nil {
		t.Fatal(err)
	}
	p = fx.pull(t, "vol", dst2)
	p.Resume = stopped
	res, err = p.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if res.Resumed != 0 || res.Sent != 16<<20 || res.Base != "" {
		t.Errorf("resumed at %d sending %d since %q, want the whole image again", res.Resumed, res.Sent, res.Base)
	}
	if fileSum(t, next) != fileSum(t, dstPath2) {
		t.Fatal("the copy pulled again differs from the image")
	}
}

// A resumed pull of changes checks the changes it applied before the
// offset it resumes from (here, without reflink, every extent of the new
// image counts as changed): a copy damaged there is found, and the next
// attempt applies them again from the damage.
func TestPullSinceResumedChecksTheChangesApplied(t *testing.T) {
	fx := newFixture(t, nil, nil)
	makeImage(t, filepath.Join(fx.dir, "vol.img"), 32<<20, []extent{{0, random(8 << 20)}})
	dst, dstPath := openDst(t)
	first, err := fx.pull(t, "vol", dst).Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	fx.images.keepBase(t, "vol")
	next := filepath.Join(fx.dir, "vol.img")
	makeImage(t, next, 32<<20, []extent{{0, random(8 << 20)}, {16 << 20, random(8 << 20)}})
	img, err := fx.images.Open(context.Background(), Request{Source: "vol"})
	if err != nil {
		t.Fatal(err)
	}
	img.File.Close()
	// A pull of the changes stopped after 10 MiB, and the copy damaged
	// since at 5 MiB.
	part := make([]byte, 10<<20)
	src, err := os.Open(next)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.ReadAt(part, 0); err != nil {
		t.Fatal(err)
	}
	src.Close()
	if _, err := dst.WriteAt(part, 0); err != nil {
		t.Fatal(err)
	}
	damage(t, dst, 5<<20+100, 4096)
	var cp Checkpoint
	p := fx.pull(t, "vol", dst)
	p.Resume = Checkpoint{Identity: img.Identity, Size: 32 << 20, Verified: 10 << 20, Base: first.Identity}
	p.Checkpoint = func(c Checkpoint) error { cp = c; return nil }
	if _, err := p.Run(context.Background()); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("the copy's bytes from offset %d", 5<<20)) {
		t.Fatalf("a resumed pull of changes over a copy damaged at 5 MiB: %v, want the damage found", err)
	}
	if cp.Verified != 5<<20 || cp.Base != first.Identity || cp.Identity != img.Identity {
		t.Fatalf("checkpoint %+v after the damage was found, want the changes verified up to 5 MiB", cp)
	}
	p.Resume = cp
	res, err := p.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if res.Resumed != 5<<20 {
		t.Errorf("resumed at %d, want 5 MiB", res.Resumed)
	}
	if fileSum(t, next) != fileSum(t, dstPath) {
		t.Fatal("the copy differs from the changed image")
	}
}

// On a reflink filesystem (XFS on a loop device), the changes between two
// snapshots of one file are what was written between them: 1 MiB
// rewritten and 2 MiB deleted of 32 MiB move as 1 MiB of data and 2 MiB
// of zeros.
func TestPullSinceSendsOnlyWhatChanged(t *testing.T) {
	dir := xfsReflink(t)
	fx := newFixture(t, nil, nil)
	fx.images.dir = dir
	live := filepath.Join(dir, "live.img")
	makeImage(t, live, 64<<20, []extent{{0, random(32 << 20)}})
	snapshot := func() {
		t.Helper()
		path := filepath.Join(dir, "vol.img")
		src, err := os.Open(live)
		if err != nil {
			t.Fatal(err)
		}
		defer src.Close()
		dst, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		defer dst.Close()
		if err := unix.IoctlFileClone(int(dst.Fd()), int(src.Fd())); err != nil {
			t.Fatalf("reflink: %v", err)
		}
	}
	snapshot()
	dst, dstPath := openDst(t)
	first, err := fx.pull(t, "vol", dst).Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	fx.images.keepBase(t, "vol")
	f, err := os.OpenFile(live, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(random(1<<20), 4<<20); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 10<<20, 2<<20); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	snapshot()
	p := fx.pull(t, "vol", dst)
	p.Resume = Holding(first.Checkpoint)
	res, err := p.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if res.Sent != 1<<20 || res.Zeros != 2<<20 {
		t.Errorf("sent %d bytes of data and %d of zeros, want 1 MiB and 2 MiB", res.Sent, res.Zeros)
	}
	if fileSum(t, filepath.Join(dir, "vol.img")) != fileSum(t, dstPath) {
		t.Fatal("the copy differs from the second snapshot")
	}
}

// xfsReflink mounts an XFS filesystem with reflink on a loop device for
// the length of the test.
func xfsReflink(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: an XFS filesystem on a loop device shows what reflinks share")
	}
	img := filepath.Join(t.TempDir(), "xfs.img")
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(512 << 20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if out, err := exec.Command("mkfs.xfs", "-q", "-m", "reflink=1", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.xfs: %v: %s", err, out)
	}
	dir := t.TempDir()
	out, err := exec.Command("losetup", "--find", "--show", img).Output()
	if err != nil {
		t.Fatalf("losetup: %v", err)
	}
	loop := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "-d", loop).CombinedOutput(); err != nil {
			t.Errorf("detach %s: %v: %s", loop, err, out)
		}
	})
	if err := unix.Mount(loop, dir, "xfs", 0, ""); err != nil {
		t.Fatalf("mount %s: %v", loop, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// BenchmarkPull is a pull of 256 MiB of random data over the loopback,
// both ends in this process, the image in the page cache: the CPU a
// transfer costs per byte (TLS, checksums, system calls), which is what
// bounds it on nodes whose disks and network are faster than their CPUs.
// go test -run - -bench Pull ./internal/transfer
func BenchmarkPull(b *testing.B) {
	fx := newFixture(b, nil, nil)
	src := filepath.Join(fx.dir, "snap-1.img")
	const size = 256 << 20
	makeImage(b, src, size, []extent{{0, random(size)}})
	b.SetBytes(size)
	for b.Loop() {
		dst, _ := openDst(b)
		p := fx.pull(b, "snap-1", dst)
		p.SyncEvery = 64 << 20
		res, err := p.Run(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		if res.Sent != size {
			b.Fatalf("sent %d bytes, want %d", res.Sent, size)
		}
		dst.Close()
		os.Remove(dst.Name())
	}
}

// A copy that holds a whole image (a migration's pre-copy) is recorded as
// changing before the first byte of the next pull reaches it: a record
// that still says "the copy is that image" is true (the target keeps such
// a copy when its source is lost).
func TestPullRecordsTheChangeBeforeWriting(t *testing.T) {
	fx := newFixture(t, nil, nil)
	makeImage(t, filepath.Join(fx.dir, "vol.img"), 32<<20, []extent{{0, random(4 << 20)}})
	fx.images.more = map[string]bool{"vol": true}
	dst, dstPath := openDst(t)
	pre := fx.pull(t, "vol", dst)
	var preCPs []Checkpoint
	pre.Checkpoint = func(cp Checkpoint) error { preCPs = append(preCPs, cp); return nil }
	first, err := pre.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// A pull the source says has more is recorded as held, never as the
	// source's last image complete.
	if n := len(preCPs); n == 0 || preCPs[n-1] != Holding(first.Checkpoint) {
		t.Fatalf("the checkpoints of a pull with more to come: %+v, want the last one %+v", preCPs, Holding(first.Checkpoint))
	}
	held := fileSum(t, dstPath)
	base := fx.images.keepBase(t, "vol")
	makeImage(t, filepath.Join(fx.dir, "vol.img"), 32<<20, []extent{{0, random(4 << 20)}, {8 << 20, random(1 << 20)}})
	fx.images.more = nil
	p := fx.pull(t, "vol", dst)
	p.Resume = Holding(first.Checkpoint)
	var firstCP *Checkpoint
	var heldThen bool
	p.Checkpoint = func(cp Checkpoint) error {
		if firstCP == nil {
			firstCP, heldThen = &cp, fileSum(t, dstPath) == held
		}
		return nil
	}
	if _, err := p.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if firstCP == nil || firstCP.Identity == "" || firstCP.Identity == base || firstCP.Base != base || firstCP.Verified != 0 || !heldThen {
		t.Fatalf("first checkpoint %+v (the copy unchanged then: %v); want the new image's, on base %s at 0, before the copy changed", firstCP, heldThen, base)
	}
}
