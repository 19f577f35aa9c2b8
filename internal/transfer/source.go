package transfer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"
	"k8s.io/klog/v2"

	"github.com/podvol/podvol/internal/errkind"
)

// Path is where a source serves its images: Path + the source id.
const Path = "/v1/images/"

// Server serves images to the nodes that may pull them.
type Server struct {
	Images     Images
	Authorizer Authorizer
	// Mismatch, if not nil, is told of each authorized pull refused
	// because its caller does not speak Version (so that the claim's user
	// learns it: the caller may be too old to say why it fails).
	Mismatch func(ctx context.Context, r Request, err error)
	// Limiter, if not nil, is shared by every pull this server serves: the
	// node's bandwidth for transfers. Its burst must be at least ChunkSize.
	Limiter *rate.Limiter
	// MaxPulls bounds the pulls served at once, MaxPullsPerCaller those
	// of one caller (a node); 0: no bound. Each pull holds readDepth
	// chunks (8 MiB) of this node's memory while it streams, and its
	// caller's authorization costs API requests: one past either bound is
	// refused at once (503, or 429 for one caller's), which the puller
	// reads as ErrBusy and retries later.
	MaxPulls, MaxPullsPerCaller int
	// IdleTimeout, if not 0, ends a pull whose writes make no progress
	// for that long (its caller stopped reading), freeing its slot.
	IdleTimeout time.Duration

	sent atomic.Int64

	mu       sync.Mutex
	serving  int
	byCaller map[string]int
}

// ErrBusy: the source serves as many pulls as it may at once (in all, or
// to this node). Not a failure: the puller tries again later.
var ErrBusy = errors.New("the source node is busy: try again later")

// busyRetry is the Retry-After of a refusal for being busy, in seconds:
// about what a pull of a few GiB takes.
const busyRetry = 10

// take gives caller a slot for one pull, or says why not (the status to
// answer with, and the message): release frees it.
func (s *Server) take(caller string) (release func(), status int, msg string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.MaxPullsPerCaller > 0 && s.byCaller[caller] >= s.MaxPullsPerCaller:
		return nil, http.StatusTooManyRequests, fmt.Sprintf("this node serves %d pulls to node %s at once, the most it serves one node", s.byCaller[caller], caller)
	case s.MaxPulls > 0 && s.serving >= s.MaxPulls:
		return nil, http.StatusServiceUnavailable, fmt.Sprintf("this node serves %d pulls at once, the most it serves", s.serving)
	}
	if s.byCaller == nil {
		s.byCaller = map[string]int{}
	}
	s.serving++
	s.byCaller[caller]++
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.serving--
		if s.byCaller[caller]--; s.byCaller[caller] == 0 {
			delete(s.byCaller, caller)
		}
	}, 0, ""
}

// SentBytes is the data (not zeros) sent to pulls so far.
func (s *Server) SentBytes() int64 { return s.sent.Load() }

// ServeHTTP answers one pull. The caller's node comes from its verified
// client certificate; a connection without one never gets here (the TLS
// handshake refuses it) but is refused again, in case the server was set up
// without ServerTLS.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
		http.Error(w, "a node's transfer certificate is required", http.StatusUnauthorized)
		return
	}
	caller, err := NodeOf(r.TLS.VerifiedChains[0][0])
	if err != nil {
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	if r.Method != http.MethodGet {
		http.Error(w, "pulls are GET", http.StatusMethodNotAllowed)
		return
	}
	req, err := parseRequest(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if !strings.HasPrefix(r.URL.Path, Path) {
		http.NotFound(w, r)
		return
	}
	req.Caller = caller
	log := klog.FromContext(r.Context()).WithValues("caller", caller, "source", req.Source, "claim", req.Claim.String(), "from", req.From)
	// Before the authorizer, whose API requests the bound covers too.
	release, status, msg := s.take(caller)
	if release == nil {
		log.Info("Refused a pull: busy", "why", msg)
		w.Header().Set("Retry-After", strconv.Itoa(busyRetry))
		http.Error(w, msg, status)
		return
	}
	defer release()
	if err := s.Authorizer.Authorize(r.Context(), &req); err != nil {
		log.Info("Refused a pull", "err", err)
		http.Error(w, err.Error(), statusOf(err))
		return
	}
	// After the authorizer: it marks a migration, whose refusal says
	// more, and only a caller allowed the data learns anything.
	if err := callerSpeaks(req); err != nil {
		log.Info("Refused a pull", "err", err)
		if s.Mismatch != nil {
			s.Mismatch(r.Context(), req, err)
		}
		http.Error(w, err.Error(), http.StatusUpgradeRequired)
		return
	}
	img, err := s.Images.Open(r.Context(), req)
	if err != nil {
		log.Info("Cannot serve a pull", "err", err)
		http.Error(w, err.Error(), statusOf(err))
		return
	}
	defer img.File.Close()
	if img.Base != nil {
		defer img.Base.Close()
	}
	if req.From > img.Size {
		http.Error(w, fmt.Sprintf("from %d is beyond the image's %d bytes", req.From, img.Size), http.StatusRequestedRangeNotSatisfiable)
		return
	}
	// From 0 whatever the request's from: what comes before it is sent as
	// checks of what the caller's copy holds (Version 2).
	var spans []span
	if img.Base != nil {
		spans, err = changedSpans(img.File, img.Base, 0, img.Size)
	} else {
		err = extents(img.File, 0, img.Size, func(start, end int64) error {
			spans = append(spans, span{start: start, end: end})
			return nil
		})
	}
	spans = checksBefore(spans, req.From)
	if err != nil {
		log.Error(err, "Cannot list the image's data")
		http.Error(w, fmt.Sprintf("listing the data of %s: %v", req.Source, err), http.StatusInternalServerError)
		return
	}
	total := spanBytes(spans, false)
	h := w.Header()
	h.Set("Content-Type", "application/vnd.podvol.transfer")
	h.Set(headerVersion, strconv.Itoa(Version))
	h.Set(headerSize, strconv.FormatInt(img.Size, 10))
	h.Set(headerIdentity, img.Identity)
	h.Set(headerData, strconv.FormatInt(total, 10))
	if img.Base != nil {
		// What follows is a change of the image the caller holds; without
		// this header, the image itself.
		h.Set(headerSince, req.Since)
	}
	if img.More {
		h.Set(headerMore, "true")
	}
	w.WriteHeader(http.StatusOK)
	log.V(2).Info("Serving a pull", "bytes", total, "since", req.Since, "changes", img.Base != nil, "more", img.More)
	var out io.Writer = w
	if s.IdleTimeout > 0 {
		out = deadlines{w, http.NewResponseController(w), s.IdleTimeout}
	}
	fw := newWriter(out)
	if err := s.stream(r.Context(), img, spans, fw); err != nil {
		// The caller may be gone (its context ends the stream); if not, it
		// learns why the stream ends early.
		log.Info("A pull ended early", "err", err)
		_ = fw.fail(err.Error())
		return
	}
	if err := fw.end(); err != nil {
		log.Info("A pull ended early", "err", err)
	}
}

// deadlines gives each write to w idle to be taken: a caller that stops
// reading does not keep its slot and buffers. (A writer that has no
// deadlines, a test's wrapper, is written to as it is.)
type deadlines struct {
	w    io.Writer
	rc   *http.ResponseController
	idle time.Duration
}

func (d deadlines) Write(b []byte) (int, error) {
	_ = d.rc.SetWriteDeadline(time.Now().Add(d.idle))
	return d.w.Write(b)
}

// stream writes the image's spans: each in chunks, a chunk of zeros as its
// length alone. Chunks are read and hashed in a goroutine of its own
// (chunks), up to readDepth ahead of the network.
func (s *Server) stream(ctx context.Context, img Image, spans []span, w *writer) error {
	ctx, cancel := context.WithCancel(ctx)
	in, free := chunks(ctx, img, spans)
	defer func() {
		// The reader stops at its next chunk; the file is closed once
		// this returns, so wait for it (its sends never block).
		cancel()
		for range in {
		}
	}()
	for c := range in {
		if c.err != nil {
			return c.err
		}
		switch {
		case c.zero:
			if err := w.zero(c.pos, c.n); err != nil {
				return err
			}
		case c.check:
			// No data crosses the network: not charged to the limit.
			if err := w.check(c.pos, c.n, c.sum); err != nil {
				return err
			}
		default:
			if s.Limiter != nil {
				if err := s.Limiter.WaitN(ctx, int(c.n)); err != nil {
					return fmt.Errorf("bandwidth limit: %w", err)
				}
			}
			if err := w.data(c.pos, c.buf[:c.n], c.sum); err != nil {
				return err
			}
			s.sent.Add(c.n)
		}
		if c.buf != nil {
			free <- c.buf
		}
	}
	return ctx.Err()
}

// readDepth is how many chunks the source reads ahead of what it sends.
const readDepth = 8

// chunk is a piece of an image read for sending, or, check, for a check
// of the caller's copy (its checksum alone is sent).
type chunk struct {
	pos, n int64
	zero   bool
	check  bool
	sum    uint32
	buf    []byte
	err    error
}

// chunks reads img's spans in chunks of at most ChunkSize, each with its
// checksum (none for zeros), into buffers taken from free, and sends them
// in order (a check span's chunks as checks); an error is the last chunk
// sent. The channel is closed after
// the last. A hole span is sent as chunks of zeros, unread and without a
// buffer. The receiver gives each chunk's buf, if any, back to free; every
// chunk read holds one, so a send never blocks, and waiting for a buffer
// stops when ctx ends.
func chunks(ctx context.Context, img Image, spans []span) (<-chan chunk, chan<- []byte) {
	// Room for every buffer's chunk and the error after them.
	out := make(chan chunk, readDepth+1)
	bufs := make(chan []byte, readDepth)
	for range readDepth {
		bufs <- make([]byte, ChunkSize)
	}
	go func() {
		defer close(out)
		fd := int(img.File.Fd())
		if len(spans) > 0 {
			// The pages read are not kept: a snapshot read once for a
			// move should not push a running pod's data out of the page
			// cache.
			_ = unix.Fadvise(fd, spans[0].start, 0, unix.FADV_SEQUENTIAL)
		}
		err := func() error {
			for _, sp := range spans {
				for pos := sp.start; pos < sp.end; {
					n := min(sp.end-pos, ChunkSize)
					if sp.hole {
						select {
						case out <- chunk{pos: pos, n: n, zero: true}:
						case <-ctx.Done():
							return ctx.Err()
						}
						pos += n
						continue
					}
					var buf []byte
					select {
					case buf = <-bufs:
					case <-ctx.Done():
						return ctx.Err()
					}
					b := buf[:n]
					if _, err := img.File.ReadAt(b, pos); err != nil {
						return fmt.Errorf("read %d bytes at %d: %w", n, pos, err)
					}
					// The checksum first, as the read returned the
					// bytes: it covers them from here to the target's
					// check (wire.go, castagnoli).
					sum := checksum(b)
					_ = unix.Fadvise(fd, pos, n, unix.FADV_DONTNEED)
					c := chunk{pos: pos, n: n, buf: buf, sum: sum, check: sp.check}
					if bytes.Equal(b, zeros[:n]) {
						c.zero, c.check, c.sum = true, false, 0
					}
					out <- c
					pos += n
				}
			}
			return nil
		}()
		if err != nil {
			out <- chunk{err: err}
		}
	}()
	return out, bufs
}

var zeros = make([]byte, ChunkSize)

// extents calls fn for each data extent of f between off and size, in
// order, the first one cut to start at off.
func extents(f *os.File, off, size int64, fn func(start, end int64) error) error {
	fd := int(f.Fd())
	for off < size {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // only a hole is left
		}
		if err != nil {
			return fmt.Errorf("SEEK_DATA at %d: %w", off, err)
		}
		if data >= size {
			return nil
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("SEEK_HOLE at %d: %w", data, err)
		}
		hole = min(hole, size)
		if err := fn(data, hole); err != nil {
			return err
		}
		off = hole
	}
	return nil
}

func parseRequest(r *http.Request) (Request, error) {
	q := r.URL.Query()
	req := Request{
		Source: r.URL.Path[min(len(Path), len(r.URL.Path)):],
		Claim:  Claim{Namespace: q.Get("namespace"), Name: q.Get("name"), UID: q.Get("uid")},
	}
	if !sourceName.MatchString(req.Source) {
		return req, fmt.Errorf("source %q is not an image id", req.Source)
	}
	if req.Claim.Namespace == "" || req.Claim.Name == "" || req.Claim.UID == "" {
		return req, fmt.Errorf("a pull names its claim: namespace, name and uid")
	}
	if v := r.Header.Get(headerVersion); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return req, fmt.Errorf("transfer protocol version %q is not a version", v)
		}
		req.Version = n
	}
	req.Since = q.Get("since")
	if len(req.Since) > 256 {
		return req, fmt.Errorf("since is %d bytes long: not an image identity", len(req.Since))
	}
	if v := q.Get("from"); v != "" {
		from, err := strconv.ParseInt(v, 10, 64)
		if err != nil || from < 0 {
			return req, fmt.Errorf("from %q is not an offset", v)
		}
		req.From = from
	}
	return req, nil
}

func statusOf(err error) int {
	switch {
	case errors.Is(err, errkind.ErrDenied):
		return http.StatusForbidden
	case errors.Is(err, errkind.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, errkind.ErrInvalid):
		return http.StatusBadRequest
	case errors.Is(err, errkind.ErrInUse):
		return http.StatusTooEarly
	}
	return http.StatusInternalServerError
}

// ErrVersion: the two ends of a pull do not speak the same transfer
// protocol (Version). Retrying helps once the node plugins are upgraded.
var ErrVersion = errors.New("the nodes' plugins speak different transfer protocol versions")

// upgrade is what to do about a version mismatch.
const upgrade = "upgrade the podvol node plugins (the podvol-node DaemonSet) so that both nodes run the same podvol version; the pull is retried until then"

// callerSpeaks refuses a request whose caller does not speak Version. A
// caller that announces none is older than versions: it does not know
// that a migration's first copy is followed by more (headerMore), nor, in
// any pull, the frames of this version.
func callerSpeaks(r Request) error {
	switch {
	case r.Version == Version:
		return nil
	case r.Version == 0 && r.Move:
		return fmt.Errorf("node %s's plugin announced no transfer protocol version (this node speaks version %d): it is too old to take a migration's copy (it would take the first copy, made while the pod runs, for the whole volume and lose what the pod wrote after it), so the migration of claim %s waits; %s: %w",
			r.Caller, Version, r.Claim, upgrade, ErrVersion)
	case r.Version == 0:
		return fmt.Errorf("node %s's plugin announced no transfer protocol version (this node speaks version %d): it is too old to pull from this node; %s: %w", r.Caller, Version, upgrade, ErrVersion)
	}
	return fmt.Errorf("node %s's plugin speaks transfer protocol version %d, this node version %d; %s: %w", r.Caller, r.Version, Version, upgrade, ErrVersion)
}

// sourceSpeaks refuses the answer of a source that does not speak Version
// (one that announces none is older than versions).
func sourceSpeaks(resp *http.Response) error {
	v := resp.Header.Get(headerVersion)
	if v == strconv.Itoa(Version) {
		return nil
	}
	if v == "" {
		v = "none (a plugin older than versions)"
	}
	return fmt.Errorf("the source's plugin answered with transfer protocol version %s, this node speaks version %d; %s: %w", peerText(trimmed(v)), Version, upgrade, ErrVersion)
}

// errBeyond: a pull resumed past the end of the source's image.
var errBeyond = errors.New("the offset is beyond the source's image")

// errorOf turns a refused pull's answer into an error of the matching kind.
func errorOf(resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxFailMsg))
	msg := peerText(fmt.Sprintf("%s: %s", resp.Status, body))
	switch resp.StatusCode {
	case http.StatusForbidden, http.StatusUnauthorized:
		return fmt.Errorf("%s: %w", msg, errkind.ErrDenied)
	case http.StatusNotFound:
		return fmt.Errorf("%s: %w", msg, errkind.ErrNotFound)
	case http.StatusRequestedRangeNotSatisfiable:
		return fmt.Errorf("%s: %w", msg, errBeyond)
	case http.StatusBadRequest:
		return fmt.Errorf("%s: %w", msg, errkind.ErrInvalid)
	case http.StatusTooEarly:
		return fmt.Errorf("%s: %w", msg, errkind.ErrInUse)
	case http.StatusUpgradeRequired:
		return fmt.Errorf("%s: %w", msg, ErrVersion)
	case http.StatusServiceUnavailable, http.StatusTooManyRequests:
		return fmt.Errorf("%s: %w", msg, ErrBusy)
	}
	return errors.New(msg)
}
