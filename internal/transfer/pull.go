package transfer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/podvol/podvol/internal/errkind"
)

// DefaultSyncEvery is how much a pull writes between syncs of its copy
// (each one a Checkpoint): what a restart may have to copy again.
const DefaultSyncEvery = 64 << 20

// Pull is one pull of a source's image into a local file.
type Pull struct {
	// Client talks to the source node (ClientTLS for that node).
	Client *http.Client
	// Address of the source node's transfer endpoint, host:port.
	Address string
	Source  string
	Claim   Claim
	// Dst is the copy, opened read-write; the pull sizes it. It should be
	// a file only the pull writes (a temporary image no volume is yet).
	Dst *os.File
	// Resume is where an earlier pull of the same source into Dst stopped
	// (the last Checkpoint it reported), or Holding the image of a whole
	// pull whose Result said More (only what changed since is pulled);
	// zero to start from the beginning.
	Resume Checkpoint
	// Checkpoint, if not nil, is called after each sync of Dst; an error
	// stops the pull.
	Checkpoint func(Checkpoint) error
	// Progress, if not nil, is called as data arrives (after every chunk).
	Progress func(Progress)
	// SyncEvery: DefaultSyncEvery if 0.
	SyncEvery int64
	// MaxSize, if not 0, is the most the copy may hold (the claim's
	// capacity): a source that announces a larger image is refused
	// before Dst is touched, and no frame past the image is written.
	MaxSize int64
	// IdleTimeout: the pull fails (ErrIdle) when the source sends nothing
	// for this long, be it its answer or the next frame;
	// DefaultIdleTimeout if 0.
	IdleTimeout time.Duration
}

// DefaultIdleTimeout is how long a pull waits on a source that sends
// nothing: a frame is at most a chunk (1 MiB), which takes far less even
// at a few hundred KiB/s.
const DefaultIdleTimeout = 2 * time.Minute

// ErrIdle: the source sent nothing for the pull's IdleTimeout (it stalled,
// or the network dropped the connection without a word). Retrying may
// help.
var ErrIdle = errors.New("the source stopped sending")

// Run pulls until the copy is complete and verified, or fails. A failed
// pull leaves Dst verified up to its last Checkpoint: run again with it as
// Resume. Errors of refused pulls wrap errkind.ErrDenied, ErrNotFound or
// ErrInvalid; any other error may be retried.
func (p *Pull) Run(ctx context.Context) (Result, error) {
	start := time.Now()
	idle := p.IdleTimeout
	if idle <= 0 {
		idle = DefaultIdleTimeout
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	wd := newWatchdog(idle, cancel)
	defer wd.done()
	// since: Dst holds that image whole, or with changes towards
	// Resume.Identity applied up to Resume.Verified.
	since := p.Resume.Base
	from := int64(0)
	if p.Resume.Identity != "" {
		from = p.Resume.Verified
	}
	if from > 0 || since != "" {
		// The checkpoint speaks of a copy of the image's size; a copy of
		// another size (lost, recreated) is not what it verified.
		if fi, err := p.Dst.Stat(); err != nil || fi.Size() != p.Resume.Size {
			klog.FromContext(ctx).Info("The copy is not the one the checkpoint verified: starting again", "source", p.Source, "verified", from)
			from, since = 0, ""
		}
	}
	resp, err := p.get(ctx, wd, since, from)
	if from > 0 && errors.Is(err, errBeyond) {
		// The source's image under this id is now smaller than what was
		// verified of the old one: another image, pulled from the start.
		from, since = 0, ""
		resp, err = p.get(ctx, wd, "", 0)
	}
	if err != nil {
		return Result{}, err
	}
	a, err := answerOf(resp.Header)
	if err != nil {
		resp.Body.Close()
		return Result{}, fmt.Errorf("pull %s from %s: %w", p.Source, p.Address, err)
	}
	cp := a.Checkpoint
	changes := since != "" && a.since == since
	if from > 0 && (cp.Identity != p.Resume.Identity || cp.Size != p.Resume.Size || (since != "" && !changes)) {
		// The source serves another image under this id (it was cut again
		// after a restart): what Dst holds is of the old one, or the old
		// one's changes half applied.
		resp.Body.Close()
		klog.FromContext(ctx).Info("The source's image changed since the pull stopped: starting again", "source", p.Source, "address", p.Address, "verified", from)
		from, since, changes = 0, "", false
		if resp, err = p.get(ctx, wd, "", 0); err != nil {
			return Result{}, err
		}
		if a, err = answerOf(resp.Header); err != nil {
			resp.Body.Close()
			return Result{}, fmt.Errorf("pull %s from %s: %w", p.Source, p.Address, err)
		}
		cp = a.Checkpoint
	}
	defer resp.Body.Close()
	if p.MaxSize > 0 && cp.Size > p.MaxSize {
		return Result{}, fmt.Errorf("pull %s from %s: the source announces an image of %d bytes, more than the %d bytes of claim %s; nothing was written: %w",
			p.Source, p.Address, cp.Size, p.MaxSize, p.Claim, errkind.ErrOutOfRange)
	}
	if changes {
		cp.Base = since
	}
	if p.Resume.Base != "" && p.Resume.Identity == "" && p.Checkpoint != nil {
		// Dst holds an image whole (a migration's pre-copy), and is about
		// to change: recorded first, so that it is never taken for that
		// image again (a pre-copy kept when its source is lost must be
		// one instant).
		start := cp
		start.Verified = from
		if err := p.Checkpoint(start); err != nil {
			return Result{}, fmt.Errorf("record that the copy of %s changes: %w", p.Resume.Base, err)
		}
	}
	if !changes && from == 0 {
		// Nothing of an earlier copy may survive: holes must be holes.
		if err := p.Dst.Truncate(0); err != nil {
			return Result{}, fmt.Errorf("empty the copy: %w", err)
		}
	}
	if err := p.Dst.Truncate(cp.Size); err != nil {
		return Result{}, fmt.Errorf("size the copy to %d bytes: %w", cp.Size, err)
	}
	if from > 0 && !changes {
		// Everything from there on comes again: what an earlier attempt
		// wrote past its checkpoint must not survive where the image has
		// a hole.
		if err := unix.Fallocate(int(p.Dst.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, from, cp.Size-from); err != nil {
			return Result{}, fmt.Errorf("punch the copy from %d on: %w", from, err)
		}
	}
	cp.Verified = from
	total := a.data
	res := Result{Resumed: from, More: a.more}
	syncEvery := p.SyncEvery
	if syncEvery <= 0 {
		syncEvery = DefaultSyncEvery
	}
	stop := make(chan struct{})
	defer close(stop)
	frames, free := decode(newReader(resp.Body, cp.Size, from), stop, wd)
	var unsynced, done, reached int64
	fd := int(p.Dst.Fd())
	// checked: the copy is found to be the source's image up to there
	// (before from, which an earlier attempt wrote). A copy pulled whole
	// reads zeros between the frames; a copy of changes holds its base
	// there.
	checked := int64(0)
	var scratch []byte // not a frame's: that may hold its data
	checkUpTo := func(end int64) error {
		if changes || checked >= end {
			return nil
		}
		if scratch == nil {
			scratch = make([]byte, ChunkSize)
		}
		bad, err := zeroIn(p.Dst, checked, end, scratch)
		if err != nil {
			return fmt.Errorf("read the copy between %d and %d: %w", checked, end, err)
		}
		if bad < end {
			return p.differs(cp, bad, end, "zeros")
		}
		checked = end
		return nil
	}
	for d := range frames {
		f, err := d.f, d.err
		if err != nil {
			return res, p.stopped(cp, reached, cancelled(ctx, fmt.Errorf("pull %s from %s: %w", p.Source, p.Address, err)))
		}
		if f.offset < from && (f.kind == frameCheck || f.kind == frameZero) {
			if err := p.check(f, cp, checkUpTo); err != nil {
				return res, err
			}
			checked = f.offset + f.length
			free <- f.buf
			if p.Progress != nil {
				p.Progress(Progress{Checked: checked, Resumed: from, Total: total, Elapsed: time.Since(start)})
			}
			continue
		}
		if f.kind != frameFail {
			if err := checkUpTo(from); err != nil {
				return res, err
			}
		}
		switch f.kind {
		case frameData:
			if _, err := p.Dst.WriteAt(f.data, f.offset); err != nil {
				return res, p.stopped(cp, reached, fmt.Errorf("write %d bytes at %d of the copy: %w", f.length, f.offset, err))
			}
			// Written back from now on, so that the sync at the next
			// checkpoint has little left to wait for.
			_ = unix.SyncFileRange(fd, f.offset, f.length, unix.SYNC_FILE_RANGE_WRITE)
			res.Sent += f.length
			unsynced += f.length
		case frameZero:
			// Dst is a hole there when pulled from empty; a change makes
			// it one.
			if changes {
				if err := unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, f.offset, f.length); err != nil {
					return res, p.stopped(cp, reached, fmt.Errorf("punch %d bytes at %d of the copy: %w", f.length, f.offset, err))
				}
			}
			res.Zeros += f.length
		case frameFail:
			return res, p.stopped(cp, reached, cancelled(ctx, fmt.Errorf("pull %s from %s: the source failed: %s", p.Source, p.Address, peerText(f.msg))))
		case frameEnd:
			cp.Verified = cp.Size
			done := cp
			if res.More {
				// Held whole as the base of what comes next, and so
				// recorded: a complete checkpoint would say the copy is
				// the source's last image.
				done = Holding(cp)
			}
			if err := p.sync(done); err != nil {
				return res, err
			}
			res.Checkpoint = cp
			res.Duration = time.Since(start)
			return res, nil
		}
		free <- f.buf
		done += f.length
		reached = f.offset + f.length
		if p.Progress != nil {
			p.Progress(Progress{Done: done, Total: total, Checked: from, Resumed: from, Elapsed: time.Since(start)})
		}
		if unsynced >= syncEvery {
			cp.Verified = reached
			if err := p.sync(cp); err != nil {
				return res, err
			}
			unsynced = 0
		}
	}
	return res, p.stopped(cp, reached, fmt.Errorf("pull %s from %s: the stream ended without its end", p.Source, p.Address))
}

// check compares the copy's bytes under a check or zero frame before the
// offset the pull resumes from with what the frame says they are, after
// checkUpTo its start (the gap before it).
func (p *Pull) check(f frame, cp Checkpoint, checkUpTo func(int64) error) error {
	if err := checkUpTo(f.offset); err != nil {
		return err
	}
	end := f.offset + f.length
	if f.kind == frameZero {
		bad, err := zeroIn(p.Dst, f.offset, end, f.buf)
		if err != nil {
			return fmt.Errorf("read the copy between %d and %d: %w", f.offset, end, err)
		}
		if bad < end {
			return p.differs(cp, bad, end, "zeros")
		}
		return nil
	}
	b := f.buf[:f.length]
	if _, err := p.Dst.ReadAt(b, f.offset); err != nil {
		return fmt.Errorf("read %d bytes at %d of the copy: %w", f.length, f.offset, err)
	}
	if checksum(b) != f.sum {
		return p.differs(cp, f.offset, end, "data of another checksum")
	}
	return nil
}

// differs is the error of a copy whose bytes from bad to end, which an
// earlier attempt wrote, are not the source's (which are want). The copy
// is verified up to bad (what was checked before it): the checkpoint says
// so, and the next attempt pulls again from there.
func (p *Pull) differs(cp Checkpoint, bad, end int64, want string) error {
	err := fmt.Errorf("pull %s from %s: the copy's bytes from offset %d to %d, written by an earlier attempt of this pull, differ from the source's %s (changed on this node since they were written): pulling again from offset %d", p.Source, p.Address, bad, end, want, bad)
	cp.Verified = bad
	if serr := p.sync(cp); serr != nil {
		return errors.Join(err, serr)
	}
	return err
}

// zeroIn returns the first offset between off and end where f does not
// read zero (end if none): its data extents there are read, its holes not.
func zeroIn(f *os.File, off, end int64, buf []byte) (int64, error) {
	bad := end
	errFound := errors.New("found")
	err := extents(f, off, end, func(start, stop int64) error {
		for pos := start; pos < stop; {
			b := buf[:min(stop-pos, int64(len(buf)))]
			if _, err := f.ReadAt(b, pos); err != nil {
				return err
			}
			if !bytes.Equal(b, zeros[:len(b)]) {
				bad = pos + int64(slices.IndexFunc(b, func(c byte) bool { return c != 0 }))
				return errFound
			}
			pos += int64(len(b))
		}
		return nil
	})
	if err != nil && !errors.Is(err, errFound) {
		return off, err
	}
	return bad, nil
}

// decodeDepth is how many frames the decoder may have read ahead of the
// pull's writes (and syncs): the network and checksums keep going while
// the disk catches up.
const decodeDepth = 8

type decoded struct {
	f   frame
	err error
}

// decode reads frames in a goroutine of its own, into buffers it takes
// from free, and sends them on frames, which it closes after the last one
// (the end, a failure, or an error). The receiver gives each frame's buf
// back to free. Every frame holds a buffer, so sending one never blocks;
// waiting for a buffer stops when stop is closed, and a read when the
// stream's body is. wd watches each read, not the wait for a buffer (the
// target's own disk).
func decode(r *reader, stop <-chan struct{}, wd *watchdog) (frames <-chan decoded, free chan<- []byte) {
	out := make(chan decoded, decodeDepth)
	bufs := make(chan []byte, decodeDepth)
	for range decodeDepth {
		bufs <- make([]byte, ChunkSize)
	}
	go func() {
		defer close(out)
		for {
			var buf []byte
			select {
			case buf = <-bufs:
			case <-stop:
				return
			}
			wd.wait()
			f, err := r.read(buf)
			wd.done()
			out <- decoded{f, err}
			if err != nil || f.kind == frameEnd || f.kind == frameFail {
				return
			}
		}
	}()
	return out, bufs
}

// cancelled is err, or, when ctx ended, why (its cause: the caller's
// cancellation, or the watchdog's ErrIdle) with err as detail: a pull
// stopped says so, whichever end noticed first (the source sees the
// connection go and may have said why first).
func cancelled(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w: %w", context.Cause(ctx), err)
	}
	return err
}

// watchdog ends a pull (its context's cause: ErrIdle) whose source sends
// nothing for its timeout. It runs only while the pull waits on the source
// (wait, then done): the target's own writes and syncs are not the
// source's stall.
type watchdog struct {
	t *time.Timer
	d time.Duration
}

func newWatchdog(d time.Duration, cancel context.CancelCauseFunc) *watchdog {
	w := &watchdog{d: d}
	w.t = time.AfterFunc(d, func() {
		cancel(fmt.Errorf("no data from the source for %s: %w (or the network between the nodes dropped the connection)", d, ErrIdle))
	})
	w.t.Stop()
	return w
}

func (w *watchdog) wait() { w.t.Reset(w.d) }
func (w *watchdog) done() { w.t.Stop() }

// stopped syncs what was verified before a pull failed, so that the next
// one resumes from the last frame received rather than the last sync.
func (p *Pull) stopped(cp Checkpoint, reached int64, err error) error {
	if reached <= cp.Verified {
		return err
	}
	cp.Verified = reached
	if serr := p.sync(cp); serr != nil {
		return errors.Join(err, serr)
	}
	return err
}

// sync makes cp true on disk, then reports it. The copy's pages are
// dropped: the volume will be read through a loop device with direct I/O,
// and a cached copy would be a second one no pod is charged for.
func (p *Pull) sync(cp Checkpoint) error {
	if err := unix.Fdatasync(int(p.Dst.Fd())); err != nil {
		return fmt.Errorf("sync the copy: %w", err)
	}
	_ = unix.Fadvise(int(p.Dst.Fd()), 0, 0, unix.FADV_DONTNEED)
	if p.Checkpoint != nil {
		if err := p.Checkpoint(cp); err != nil {
			return fmt.Errorf("record the pull's checkpoint at %d: %w", cp.Verified, err)
		}
	}
	return nil
}

// url is the request for the pull's image at address, from offset from,
// Since since if not "".
func (p *Pull) url(address, since string, from int64) *url.URL {
	q := url.Values{
		"namespace": {p.Claim.Namespace}, "name": {p.Claim.Name}, "uid": {p.Claim.UID},
		"from": {strconv.FormatInt(from, 10)},
	}
	if since != "" {
		q.Set("since", since)
	}
	return &url.URL{Scheme: "https", Host: address, Path: Path + p.Source, RawQuery: q.Encode()}
}

func (p *Pull) get(ctx context.Context, wd *watchdog, since string, from int64) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url(p.Address, since, from).String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set(headerVersion, strconv.Itoa(Version))
	wd.wait()
	resp, err := p.Client.Do(req)
	wd.done()
	if err != nil {
		// A malformed answer's error quotes what the source sent.
		return nil, cancelled(ctx, fmt.Errorf("pull %s from %s: %w", p.Source, p.Address, boundedError{err}))
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, fmt.Errorf("pull %s from %s for claim %s: %w", p.Source, p.Address, p.Claim, errorOf(resp))
	}
	if err := sourceSpeaks(resp); err != nil {
		resp.Body.Close()
		return nil, fmt.Errorf("pull %s from %s for claim %s: %w", p.Source, p.Address, p.Claim, err)
	}
	return resp, nil
}

// answer is what a source's 200 says of the stream that follows it.
type answer struct {
	// Checkpoint: the image's Identity and Size.
	Checkpoint
	// data is the bytes of data and zeros the stream describes.
	data int64
	// since: the stream is a change of that image ("": the image itself).
	since string
	// more: the source will have more once its volume is not in use.
	more bool
}

// maxIdentity bounds an image identity: the target keeps it in its store
// and sends it back as since, which the source takes up to this length.
const maxIdentity = 256

// answerOf reads the headers of a source's 200. They come from another
// node, which is not trusted to be sane: every value is checked before the
// copy is sized or anything is kept.
func answerOf(h http.Header) (answer, error) {
	size, err := strconv.ParseInt(h.Get(headerSize), 10, 64)
	if err != nil || size < 0 {
		return answer{}, fmt.Errorf("the source answered without the image's size (%s %q)", headerSize, trimmed(h.Get(headerSize)))
	}
	id := h.Get(headerIdentity)
	if !printable(id) {
		return answer{}, fmt.Errorf("the source answered without an image identity of 1 to %d printable characters (%s %q)", maxIdentity, headerIdentity, trimmed(id))
	}
	data, err := strconv.ParseInt(h.Get(headerData), 10, 64)
	if err != nil || data < 0 || data > size {
		return answer{}, fmt.Errorf("the source announced %s %q for an image of %d bytes", headerData, trimmed(h.Get(headerData)), size)
	}
	return answer{Checkpoint: Checkpoint{Identity: id, Size: size}, data: data, since: h.Get(headerSince), more: h.Get(headerMore) == "true"}, nil
}

// printable: 1 to maxIdentity characters of printable ASCII, no space.
func printable(s string) bool {
	if s == "" || len(s) > maxIdentity {
		return false
	}
	for i := range len(s) {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// maxPeerText bounds what of another node's words (a failure frame, a
// refusal's body) goes into an error: the error reaches the claim's events
// and the logs.
const maxPeerText = 512

// peerText is text another node sent, made fit for an error: one line of
// printable characters (controls, escapes and the like each a space), at
// most maxPeerText bytes.
func peerText(s string) string {
	var b strings.Builder
	for _, r := range strings.TrimSpace(s) {
		if !unicode.IsPrint(r) {
			r = ' '
		}
		if b.Len()+utf8.RuneLen(r) > maxPeerText {
			b.WriteString("...")
			break
		}
		b.WriteRune(r)
	}
	return b.String()
}

// trimmed is a value another node sent, cut short for an error message.
func trimmed(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
