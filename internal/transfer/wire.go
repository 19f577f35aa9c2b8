package transfer

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
)

// ChunkSize is the most data one frame carries.
const ChunkSize = 1 << 20

// Frame kinds. Every frame starts with its kind's byte.
const (
	// frameData: offset (8 bytes), length (4), CRC-32C of the data (4),
	// the data.
	frameData = 'D'
	// frameZero: offset (8), length (4): that many zero bytes (before
	// the offset the pull resumes from: the target's copy must read so).
	frameZero = 'Z'
	// frameCheck: offset (8), length (4), CRC-32C of the data there (4),
	// no data: what the target's copy must hold before the offset its
	// pull resumes from, which an earlier attempt wrote.
	frameCheck = 'C'
	// frameEnd: the bytes the stream's data, zero and check frames
	// described (8), the stream digest (32). Nothing follows.
	frameEnd = 'E'
	// frameFail: a message's length (4), the message: the source failed
	// after it had answered 200. Nothing follows.
	frameFail = 'F'
)

const (
	dataHeader = 1 + 8 + 4 + 4
	zeroHeader = 1 + 8 + 4
	maxFailMsg = 4096
)

// castagnoli is CRC-32C's table. A chunk's checksum is a CRC, not a hash:
// TLS 1.3 already authenticates every byte in transit, so what the
// checksum is for is what TLS cannot see, from the source's read to the
// target's check before its write: a buffer reused too early, a framing
// bug, memory of either end's HTTP and TLS stacks outside the record TLS
// authenticates. It is taken as the read returns, before anything else
// touches the buffer; a read that returns wrong bytes (a disk or a
// filesystem that corrupts silently) is beyond it, as is what the target's
// disk does with the write. A CRC catches these, computed in hardware at
// many times SHA-256's speed (SHA-256 per chunk was a third of a pull's
// CPU on both ends: bench/mobility). The stream digest over every frame's
// header, CRCs included, stays SHA-256.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// checksum is a chunk's checksum.
func checksum(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// Version is the transfer protocol this plugin speaks: the stream's
// frames and what its headers mean (headerMore above all: a target that
// ignored it would take a migration's first copy for the whole volume and
// switch, losing what the pod wrote after it). Both ends must speak the
// same one: the target announces it in its request (headerVersion), the
// source refuses a caller that does not, and answers with its own, which
// the target checks before it reads a frame. Any change to the frames or
// to what a header means takes the next number.
//
// 1: the first versioned protocol (the plugins before it sent no version;
// they are refused either way).
// 2: a stream starts at offset 0 whatever the offset its pull resumes
// from: before it, check frames (frameCheck, and zeros) of what the
// copy holds, which the target reads back and compares, so that the
// stream's digest covers the whole image, not what the last attempt sent.
const Version = 2

// headerVersion carries Version, on the request and on the 200 answer.
const headerVersion = "Podvol-Transfer-Version"

// Response headers of a pull's 200 answer.
const (
	headerSize     = "Podvol-Image-Size"
	headerIdentity = "Podvol-Image-Identity"
	headerData     = "Podvol-Data-Bytes"
	// headerSince echoes the request's since when the stream is a change
	// of that image; headerMore says the source will have more.
	headerSince = "Podvol-Since"
	headerMore  = "Podvol-More"
)

// frame is a decoded frame.
type frame struct {
	kind   byte
	offset int64
	length int64
	sum    uint32
	data   []byte // frameData: the data, in buf
	buf    []byte // the buffer read gave, whatever the kind: the caller's again
	msg    string // frameFail
}

// writer writes frames and keeps the stream digest: the SHA-256 of every
// data and zero frame's header (the data's own digest is in it).
type writer struct {
	w      io.Writer
	digest hash.Hash
	total  int64
	hdr    [dataHeader]byte
}

func newWriter(w io.Writer) *writer { return &writer{w: w, digest: sha256.New()} }

// data writes a data frame of b, whose checksum is sum.
func (w *writer) data(off int64, b []byte, sum uint32) error {
	w.hdr[0] = frameData
	binary.BigEndian.PutUint64(w.hdr[1:], uint64(off))
	binary.BigEndian.PutUint32(w.hdr[9:], uint32(len(b)))
	binary.BigEndian.PutUint32(w.hdr[13:], sum)
	w.digest.Write(w.hdr[:dataHeader])
	w.total += int64(len(b))
	if _, err := w.w.Write(w.hdr[:dataHeader]); err != nil {
		return err
	}
	_, err := w.w.Write(b)
	return err
}

// check writes a check frame of the n bytes at off, whose checksum is sum.
func (w *writer) check(off, n int64, sum uint32) error {
	w.hdr[0] = frameCheck
	binary.BigEndian.PutUint64(w.hdr[1:], uint64(off))
	binary.BigEndian.PutUint32(w.hdr[9:], uint32(n))
	binary.BigEndian.PutUint32(w.hdr[13:], sum)
	w.digest.Write(w.hdr[:dataHeader])
	w.total += n
	_, err := w.w.Write(w.hdr[:dataHeader])
	return err
}

func (w *writer) zero(off, n int64) error {
	w.hdr[0] = frameZero
	binary.BigEndian.PutUint64(w.hdr[1:], uint64(off))
	binary.BigEndian.PutUint32(w.hdr[9:], uint32(n))
	w.digest.Write(w.hdr[:zeroHeader])
	w.total += n
	_, err := w.w.Write(w.hdr[:zeroHeader])
	return err
}

func (w *writer) end() error {
	var b [1 + 8 + sha256.Size]byte
	b[0] = frameEnd
	binary.BigEndian.PutUint64(b[1:], uint64(w.total))
	copy(b[9:], w.digest.Sum(nil))
	_, err := w.w.Write(b[:])
	return err
}

func (w *writer) fail(msg string) error {
	if len(msg) > maxFailMsg {
		msg = msg[:maxFailMsg]
	}
	b := make([]byte, 5, 5+len(msg))
	b[0] = frameFail
	binary.BigEndian.PutUint32(b[1:], uint32(len(msg)))
	_, err := w.w.Write(append(b, msg...))
	return err
}

// reader decodes frames, checking each against the image's size, the
// order of offsets, its data's digest and, at the end, the stream's.
// Before from (the offset the pull resumes from) only check and zero
// frames may come, after it only data and zero frames; none straddles it.
type reader struct {
	r      *bufio.Reader
	size   int64
	from   int64
	next   int64 // no frame may start before it
	digest hash.Hash
	total  int64
}

func newReader(r io.Reader, size, from int64) *reader {
	return &reader{r: bufio.NewReaderSize(r, 256<<10), size: size, from: from, digest: sha256.New()}
}

// read returns the next frame, a data frame's data read into buf (of
// ChunkSize bytes at least) and checked against its digest, an end frame
// checked against the stream. Errors say what was wrong with the stream
// and where.
func (r *reader) read(buf []byte) (frame, error) {
	f := frame{buf: buf}
	kind, err := r.r.ReadByte()
	if err != nil {
		return f, fmt.Errorf("the stream ended after offset %d without its end: %w", r.next, unexpected(err))
	}
	f.kind = kind
	switch kind {
	case frameData, frameZero, frameCheck:
		n := zeroHeader
		if kind != frameZero {
			n = dataHeader
		}
		var hdr [dataHeader]byte
		hdr[0] = kind
		if _, err := io.ReadFull(r.r, hdr[1:n]); err != nil {
			return f, fmt.Errorf("frame at offset %d: %w", r.next, unexpected(err))
		}
		f.offset = int64(binary.BigEndian.Uint64(hdr[1:]))
		f.length = int64(binary.BigEndian.Uint32(hdr[9:]))
		if f.length == 0 || f.length > ChunkSize {
			return f, fmt.Errorf("frame at offset %d has length %d (want 1 to %d)", f.offset, f.length, ChunkSize)
		}
		if f.offset < r.next || f.offset > r.size-f.length {
			return f, fmt.Errorf("frame of %d bytes at offset %d is out of order or outside the image (next offset %d, size %d)", f.length, f.offset, r.next, r.size)
		}
		if before := f.offset < r.from; (before && f.offset+f.length > r.from) || (before && kind == frameData) || (!before && kind == frameCheck) {
			return f, fmt.Errorf("%c frame of %d bytes at offset %d: the pull resumes from %d, before which only check and zero frames may come and after which no check frame", kind, f.length, f.offset, r.from)
		}
		r.digest.Write(hdr[:n])
		r.total += f.length
		r.next = f.offset + f.length
		if kind == frameZero {
			return f, nil
		}
		f.sum = binary.BigEndian.Uint32(hdr[13:])
		if kind == frameCheck {
			return f, nil
		}
		f.data = buf[:f.length]
		if _, err := io.ReadFull(r.r, f.data); err != nil {
			return f, fmt.Errorf("data at offset %d: %w", f.offset, unexpected(err))
		}
		if checksum(f.data) != f.sum {
			return f, fmt.Errorf("data of %d bytes at offset %d does not match its checksum: corrupted in transit or on the source", f.length, f.offset)
		}
		return f, nil
	case frameEnd:
		var b [8 + sha256.Size]byte
		if _, err := io.ReadFull(r.r, b[:]); err != nil {
			return f, fmt.Errorf("end of stream: %w", unexpected(err))
		}
		if total := int64(binary.BigEndian.Uint64(b[:])); total != r.total {
			return f, fmt.Errorf("the source described %d bytes of the image but this end received %d", total, r.total)
		}
		if !bytes.Equal(b[8:], r.digest.Sum(nil)) {
			return f, fmt.Errorf("the stream's digest does not match the frames received: a frame was lost or altered")
		}
		return f, nil
	case frameFail:
		var b [4]byte
		if _, err := io.ReadFull(r.r, b[:]); err != nil {
			return f, fmt.Errorf("failure frame: %w", unexpected(err))
		}
		n := binary.BigEndian.Uint32(b[:])
		if n > maxFailMsg {
			return f, fmt.Errorf("failure frame of %d bytes (at most %d)", n, maxFailMsg)
		}
		msg := make([]byte, n)
		if _, err := io.ReadFull(r.r, msg); err != nil {
			return f, fmt.Errorf("failure frame: %w", unexpected(err))
		}
		f.msg = string(msg)
		return f, nil
	}
	return f, fmt.Errorf("unknown frame kind %q after offset %d", kind, r.next)
}

func unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}
