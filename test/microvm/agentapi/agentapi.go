// Package agentapi is the wire between the test runtime (test/microvm) and
// its guest agent (test/microvm/guest/agent): one JSON Request a line from
// the runtime, one Reply a line from the agent, on a virtio-serial port.
package agentapi

// PortName is the name of the virtio-serial port the runtime talks on.
const PortName = "podvol.agent"

// Mountpoint is where the agent mounts the volume in the guest.
const Mountpoint = "/run/volume"

// Request ops: mount the disk (or a virtio-fs share), exec a script, report
// statfs, grow the mounted volume, shut down (unmount, sync, power off).
const (
	OpMount    = "mount"
	OpExec     = "exec"
	OpStats    = "stats"
	OpResize   = "resize"
	OpShutdown = "shutdown"
)

// ResizeRefusal is the agent's answer to OpResize. Kata's agent does not
// grow a direct-assigned volume in a running guest either; the runtime
// passes the refusal on, as Kata's shim does, and the tests look for these
// words in what podvol returns.
const ResizeRefusal = "the guest agent does not implement resizing a direct-assigned volume online"

// NoDisk on the guest's kernel command line tells the agent not to wait for
// a virtio-blk disk (a guest whose volume is a virtio-fs share).
const NoDisk = "podvol.nodisk"

// Request is one call to the agent.
type Request struct {
	Op                  string   `json:"op"`
	FsType              string   `json:"fstype,omitempty"`
	Source              string   `json:"source,omitempty"` // mount this (a virtio-fs tag) instead of the disk
	Size                int64    `json:"size,omitempty"`   // OpResize: the new size in bytes
	Options             []string `json:"options,omitempty"`
	FsGroup             string   `json:"fsGroup,omitempty"`
	FsGroupChangePolicy string   `json:"fsGroupChangePolicy,omitempty"`
	UID                 uint32   `json:"uid,omitempty"`
	GID                 uint32   `json:"gid,omitempty"`
	Groups              []uint32 `json:"groups,omitempty"`
	Cmd                 string   `json:"cmd,omitempty"`
}

// Reply is the agent's answer; the first line it writes, before any
// request, is a Reply with Device and Uptime (ready).
type Reply struct {
	Error  string `json:"error,omitempty"`
	Output string `json:"output,omitempty"`
	Exit   int    `json:"exit,omitempty"`
	Device string `json:"device,omitempty"`
	// statfs of the mount, bytes and inodes
	Total       int64 `json:"total,omitempty"`
	Used        int64 `json:"used,omitempty"`
	Available   int64 `json:"available,omitempty"`
	Inodes      int64 `json:"inodes,omitempty"`
	InodesUsed  int64 `json:"inodesUsed,omitempty"`
	InodesFree  int64 `json:"inodesFree,omitempty"`
	DeviceBytes int64 `json:"deviceBytes,omitempty"`
	// Uptime is the guest's /proc/uptime when the agent is ready.
	Uptime string `json:"uptime,omitempty"`
}
