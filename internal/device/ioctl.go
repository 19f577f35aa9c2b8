package device

import (
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
