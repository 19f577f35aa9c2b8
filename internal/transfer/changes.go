package transfer

import (
	"encoding/binary"
	"fmt"
	"os"
	"slices"
	"unsafe"

	"golang.org/x/sys/unix"
)

// span is a range of an image to send: its data (read, sent as data or,
// where all zeros, as zeros), or, hole, zeros without reading (a range the
// base holds data in and the image does not). check: the range is before
// the offset the pull resumes from; its data is sent as checks.
type span struct {
	start, end int64
	hole       bool
	check      bool
}

// checksBefore marks what of spans (in order) is before from as checks,
// cutting the span that straddles it.
func checksBefore(spans []span, from int64) []span {
	out := make([]span, 0, len(spans)+1)
	for _, s := range spans {
		if s.start < from && s.end > from {
			out = append(out, span{start: s.start, end: from, hole: s.hole, check: true})
			s.start = from
		}
		s.check = s.end <= from
		out = append(out, s)
	}
	return out
}

// changedSpans lists what a copy of base needs to become img, from off on:
// the data of img whose blocks are not base's blocks at the same offset,
// and, as holes, the ranges where base has data and img has none. Two
// reflink snapshots of one volume share every block the volume did not
// write between them, at the same physical address (FIEMAP), so what moves
// is what changed. Where the filesystem shares nothing (no reflink), every
// data extent of img counts as changed: the copy is still right, only not
// smaller. Any extent FIEMAP cannot place exactly counts as changed.
func changedSpans(img, base *os.File, off, size int64) ([]span, error) {
	ne, err := fiemap(img, off, size)
	if err != nil {
		return nil, fmt.Errorf("map the image's extents: %w", err)
	}
	be, err := fiemap(base, off, size)
	if err != nil {
		return nil, fmt.Errorf("map the base image's extents: %w", err)
	}
	// Both lists are in logical order and do not overlap within one file:
	// one pass over each.
	var same []interval
	j := 0
	for _, n := range ne {
		for j < len(be) && be[j].end() <= n.logical {
			j++
		}
		for k := j; k < len(be) && be[k].logical < n.end(); k++ {
			b := be[k]
			lo, hi := max(n.logical, b.logical), min(n.end(), b.end())
			if lo >= hi || !n.exact() || !b.exact() || n.unwritten() != b.unwritten() {
				continue
			}
			if n.physical-n.logical == b.physical-b.logical {
				same = append(same, interval{lo, hi})
			}
		}
	}
	var out []span
	for _, d := range subtract(extentIntervals(ne), merge(same)) {
		out = append(out, span{start: d.start, end: d.end})
	}
	for _, h := range subtract(extentIntervals(be), extentIntervals(ne)) {
		out = append(out, span{start: h.start, end: h.end, hole: true})
	}
	slices.SortFunc(out, func(a, b span) int { return int(min(max(a.start-b.start, -1), 1)) })
	return out, nil
}

type interval struct{ start, end int64 }

// merge sorts and joins overlapping or touching intervals.
func merge(in []interval) []interval {
	slices.SortFunc(in, func(a, b interval) int { return int(min(max(a.start-b.start, -1), 1)) })
	var out []interval
	for _, i := range in {
		if n := len(out); n > 0 && i.start <= out[n-1].end {
			out[n-1].end = max(out[n-1].end, i.end)
			continue
		}
		out = append(out, i)
	}
	return out
}

// subtract is a less b, both merged.
func subtract(a, b []interval) []interval {
	var out []interval
	for _, x := range a {
		cur := x.start
		for _, y := range b {
			if y.end <= cur || y.start >= x.end {
				continue
			}
			if y.start > cur {
				out = append(out, interval{cur, y.start})
			}
			cur = max(cur, y.end)
		}
		if cur < x.end {
			out = append(out, interval{cur, x.end})
		}
	}
	return out
}

func extentIntervals(es []mapped) []interval {
	out := make([]interval, 0, len(es))
	for _, e := range es {
		out = append(out, interval{e.logical, e.end()})
	}
	return merge(out)
}

// mapped is one FIEMAP extent, cut to the range asked for.
type mapped struct {
	logical, physical, length int64
	flags                     uint32
}

func (e mapped) end() int64 { return e.logical + e.length }

// FIEMAP extent flags.
const (
	fiemapLast       = 0x1
	fiemapUnknown    = 0x2
	fiemapDelalloc   = 0x4
	fiemapEncoded    = 0x8
	fiemapEncrypted  = 0x80
	fiemapNotAligned = 0x100
	fiemapInline     = 0x200
	fiemapTail       = 0x400
	fiemapUnwritten  = 0x800
)

// exact: the extent's physical address is where its data is, unshared with
// anything but what maps the same address.
func (e mapped) exact() bool {
	return e.flags&(fiemapUnknown|fiemapDelalloc|fiemapEncoded|fiemapEncrypted|fiemapNotAligned|fiemapInline|fiemapTail) == 0
}

func (e mapped) unwritten() bool { return e.flags&fiemapUnwritten != 0 }

// fsIocFiemap is FS_IOC_FIEMAP, _IOWR('f', 11, struct fiemap).
const fsIocFiemap = 0xC020660B

const (
	fiemapHeader     = 32 // struct fiemap
	fiemapExtentSize = 56 // struct fiemap_extent
	fiemapBatch      = 512
	fiemapFlagSync   = 0x1
)

// fiemap lists f's extents between off and size, in order, cut to that
// range.
func fiemap(f *os.File, off, size int64) ([]mapped, error) {
	buf := make([]byte, fiemapHeader+fiemapBatch*fiemapExtentSize)
	var out []mapped
	for pos := off; pos < size; {
		clear(buf)
		// 0 <= off <= pos < size: offsets in a file.
		binary.NativeEndian.PutUint64(buf[0:], uint64(pos))      // #nosec G115 -- non-negative
		binary.NativeEndian.PutUint64(buf[8:], uint64(size-pos)) // #nosec G115 -- positive
		binary.NativeEndian.PutUint32(buf[16:], fiemapFlagSync)
		binary.NativeEndian.PutUint32(buf[24:], fiemapBatch)
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fsIocFiemap, uintptr(unsafe.Pointer(&buf[0]))) // #nosec G103 -- FS_IOC_FIEMAP's struct, in buf, which outlives the call
		if errno == unix.EOPNOTSUPP || errno == unix.ENOTTY {
			return unplaced(f, off, size)
		}
		if errno != 0 {
			return nil, fmt.Errorf("FIEMAP at %d: %w", pos, errno)
		}
		n := min(int(binary.NativeEndian.Uint32(buf[20:])), fiemapBatch)
		if n == 0 {
			break
		}
		last := false
		for i := range n {
			e := buf[fiemapHeader+i*fiemapExtentSize:]
			// Offsets and lengths in a file and a filesystem: below 2^63.
			x := mapped{
				logical:  int64(binary.NativeEndian.Uint64(e[0:])),  // #nosec G115 -- see above
				physical: int64(binary.NativeEndian.Uint64(e[8:])),  // #nosec G115 -- see above
				length:   int64(binary.NativeEndian.Uint64(e[16:])), // #nosec G115 -- see above
				flags:    binary.NativeEndian.Uint32(e[40:]),
			}
			last = x.flags&fiemapLast != 0
			pos = max(pos, x.end())
			// Cut to [off, size): an extent may start before the range
			// asked for or run past the file's end (its last block).
			if cut := off - x.logical; cut > 0 {
				x.logical += cut
				x.physical += cut
				x.length -= cut
			}
			x.length = min(x.length, size-x.logical)
			if x.length > 0 {
				out = append(out, x)
			}
		}
		if last {
			break
		}
	}
	return out, nil
}

// unplaced lists f's data extents, for a filesystem without FIEMAP
// (tmpfs), with no physical address: none is the same as another's.
func unplaced(f *os.File, off, size int64) ([]mapped, error) {
	var out []mapped
	err := extents(f, off, size, func(start, end int64) error {
		out = append(out, mapped{logical: start, length: end - start, flags: fiemapUnknown})
		return nil
	})
	return out, err
}

// spanBytes is the bytes spans cover, those of checks or not.
func spanBytes(spans []span, checks bool) int64 {
	var n int64
	for _, s := range spans {
		if s.check == checks {
			n += s.end - s.start
		}
	}
	return n
}
