// Package devicetest is an in-memory stand-in for the machine podvol acts on
// (device.Interface), in the way k8s.io/mount-utils' FakeMounter stands in
// for mount(8): the packages above internal/device (node, pool, inline) get
// fast tests that run without root, with -race, and with failures injected
// at any step.
//
// Only the kernel is faked. Image files stay real files (in t.TempDir()),
// and so do the directories that are mounted on; what the fake keeps in
// memory is what the kernel would:
//
//   - Loop devices: a table of number → backing file, each holding the file
//     open as the kernel does (an image deleted while attached stays readable
//     and is listed with " (deleted)"). A new device takes the lowest free
//     number, so a detached number is reused at once, by whoever asks next.
//     A device's size is its file's size when attached, until
//     LoopSetCapacity. A device does direct I/O if asked, unless the image's
//     directory was marked with RefuseDirectIO (the kernel asks the real
//     filesystem, which the fake does not, so that unit tests do not
//     depend on where TMPDIR is: tmpfs took O_DIRECT only from Linux 6.6);
//     its logical block size is
//     what it was asked for, or chosen as device.ChooseBlockSize does, from
//     the real pool filesystem and the fake filesystem's sector size.
//     DetachLoop of a device whose filesystem is still
//     alive (mounted, or frozen) marks it to detach when the last user goes
//     and fails, as the real one does after its wait.
//   - Filesystems: mkfs writes a small signature (type, UUID, size, root
//     group) at the start of the image itself, through the loop device, so
//     that it is data: a new image probes blank, a copy or a restore carries
//     it, blkid on an image file finds it, and growth is visible to the next
//     mount. WriteSignature plants a foreign one (swap, a partition table).
//     A signature records the sector size mkfs chose (ext4: its 4 KiB
//     block; xfs: the device's logical block size, or the pool's for an
//     image file), and a mount on a device with larger logical blocks
//     fails, as xfs and ext4 refuse it.
//   - Mounts: a table in mount order. Mounts at one path stack (the last one
//     is what MountedAt sees, Unmount removes them all); a bind mount of a
//     directory shares the superblock of the mount it lies in (or is the
//     host's filesystem, if none), a bind mount of /dev/loopN onto a file is
//     devtmpfs with root /loopN, as /proc/self/mountinfo shows them. Mounting
//     one device twice gives one superblock; an xfs whose UUID is already
//     mounted is refused unless "nouuid" is given. Unmounting a mount that
//     has a mount beneath it, or that a Filesystem handle was opened through,
//     fails with EBUSY.
//   - Freezing: per superblock, through a handle from OpenFilesystemOn, which
//     checks what the real one checks (the path is the root of a mount of
//     that device's filesystem). A frozen filesystem outlives its last
//     unmount and is found frozen by the next mount of its device, as in
//     Linux (the freeze holds the superblock); only a thaw or a Reboot ends
//     it. Every freeze and thaw is logged with the handle it went through.
//   - Copies: CopyImage records whether its source was consistent (its
//     filesystem unmounted, read-only or frozen).
//
// Where the fake is not faithful:
//   - File contents of a mounted filesystem are not modelled: a file written
//     under a mount point lands in the real directory beneath it, and a
//     mount point can be removed (os.Remove) where the kernel would say
//     EBUSY. The fake models a filesystem's identity, size, root group,
//     read-only, frozen, shut-down and error state, not its files.
//   - Operations that would block on a frozen filesystem (SetGroup,
//     GrowOnline) fail with ErrWouldBlock instead of hanging.
//   - Paths are compared as given (cleaned), not resolved: a symlink in a
//     directory above a mount point is not followed, and a renamed image is
//     still listed under its old name.
//   - Statfs of a mounted fake filesystem reports its size with nothing
//     used; paths on no fake mount are answered by the real statfs.
//   - Per-operation failures come only from what Inject sets up: there is
//     no ENOSPC, EIO or timeout of its own.
package devicetest
