package device

import (
	"math"
	"unsafe"

	"golang.org/x/sys/unix"
)

func ioctlPtr(fd uintptr, req uint, arg *uint64) error {
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, uintptr(req), uintptr(unsafe.Pointer(arg)))
	if errno != 0 {
		return errno
	}
	return nil
}

// fitrimAll issues FITRIM over the whole filesystem open as fd and returns
// the bytes the filesystem says it discarded.
func fitrimAll(fd uintptr) (uint64, error) {
	r := struct{ Start, Len, MinLen uint64 }{Len: math.MaxUint64}
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, fitrim, uintptr(unsafe.Pointer(&r)))
	if errno != 0 {
		return 0, errno
	}
	return r.Len, nil
}
