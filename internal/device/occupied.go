package device

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Occupied returns the bytes that files take on their filesystem: their
// blocks (data and the blocks that map it, as stat counts them), with a
// block that several of them share (reflink copies) counted once. Without
// shared, the files are known to share nothing (a filesystem without
// reflink), and only stat is asked. A file that is gone meanwhile counts
// nothing.
//
// A block shared with a file not in the list is counted as the list's: its
// owner outside is taken to be another of the files' copies.
func Occupied(files []string, shared bool) (int64, error) {
	var total int64
	var spans []physSpan
	for _, path := range files {
		blocks, sh, err := occupied(path, shared)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, err
		}
		var own int64
		for _, s := range sh {
			own += s.end - s.start
		}
		// st_blocks counts each shared block in full; what is left is the
		// file's own data and its mapping blocks.
		total += max(blocks-own, 0)
		spans = append(spans, sh...)
	}
	return total + unionBytes(spans), nil
}

// occupied returns what stat says path's blocks are and, if shared, the
// physical spans of its extents the filesystem says are shared.
func occupied(path string, shared bool) (int64, []physSpan, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, nil, err
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return 0, nil, fmt.Errorf("stat %s: %w", path, err)
	}
	blocks := st.Blocks * 512
	if !shared || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return blocks, nil, nil
	}
	spans, err := sharedSpans(f, st.Size)
	if err != nil {
		return 0, nil, fmt.Errorf("map the extents of %s: %w", path, err)
	}
	return blocks, spans, nil
}

// physSpan is a range of a filesystem's blocks, in bytes: [start, end).
type physSpan struct{ start, end int64 }

// unionBytes is the bytes spans cover, each byte once.
func unionBytes(spans []physSpan) int64 {
	slices.SortFunc(spans, func(a, b physSpan) int {
		switch {
		case a.start < b.start:
			return -1
		case a.start > b.start:
			return 1
		}
		return 0
	})
	var n, reached int64
	for i, s := range spans {
		if i == 0 || s.start > reached {
			n += s.end - s.start
			reached = s.end
			continue
		}
		if s.end > reached {
			n += s.end - reached
			reached = s.end
		}
	}
	return n
}

// FIEMAP (Documentation/filesystems/fiemap.rst): the ioctl, the sizes of
// its structures and the extent flags read here.
const (
	fsIocFiemap       = 0xC020660B // _IOWR('f', 11, struct fiemap)
	fiemapHeader      = 32         // struct fiemap
	fiemapExtentBytes = 56         // struct fiemap_extent
	fiemapBatch       = 512
	fiemapLast        = 0x1
	// fiemapUnplaced: the physical address is not where the data is
	// (unknown, delayed, encoded, inline, packed): such an extent is
	// counted as the file's own.
	fiemapUnplaced = 0x2 | 0x4 | 0x8 | 0x80 | 0x100 | 0x200 | 0x400
	fiemapShared   = 0x2000
)

// sharedSpans lists the physical spans of f's extents (below size) that
// the filesystem reports shared. A filesystem without FIEMAP shares
// nothing it can report: none.
func sharedSpans(f *os.File, size int64) ([]physSpan, error) {
	buf := make([]byte, fiemapHeader+fiemapBatch*fiemapExtentBytes)
	var out []physSpan
	for pos := int64(0); pos < size; {
		clear(buf)
		// 0 <= pos < size: offsets in a file.
		binary.NativeEndian.PutUint64(buf[0:], uint64(pos))      // #nosec G115 -- non-negative
		binary.NativeEndian.PutUint64(buf[8:], uint64(size-pos)) // #nosec G115 -- positive
		binary.NativeEndian.PutUint32(buf[24:], fiemapBatch)
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fsIocFiemap, uintptr(unsafe.Pointer(&buf[0]))) // #nosec G103 -- FS_IOC_FIEMAP's struct, in buf, which outlives the call
		if errno == unix.EOPNOTSUPP || errno == unix.ENOTTY {
			return nil, nil
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
			e := buf[fiemapHeader+i*fiemapExtentBytes:]
			// Offsets and lengths in a file and a filesystem: below 2^63.
			logical := int64(binary.NativeEndian.Uint64(e[0:]))  // #nosec G115 -- see above
			physical := int64(binary.NativeEndian.Uint64(e[8:])) // #nosec G115 -- see above
			length := int64(binary.NativeEndian.Uint64(e[16:]))  // #nosec G115 -- see above
			flags := binary.NativeEndian.Uint32(e[40:])
			last = flags&fiemapLast != 0
			pos = max(pos, logical+length)
			if flags&fiemapShared != 0 && flags&fiemapUnplaced == 0 && length > 0 {
				out = append(out, physSpan{physical, physical + length})
			}
		}
		if last {
			break
		}
	}
	return out, nil
}
