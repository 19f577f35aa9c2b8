package devcluster

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"

	"github.com/podvol/podvol/internal/device"
	"github.com/podvol/podvol/internal/pool"
)

// PoolState is what a node's pool holds and serves at one moment: its
// images, the loop devices attached to them (matched by device and inode:
// the plugin attached them inside its container, where the path differs;
// or, for an image deleted under its device, by the pool's tag),
// and the node's mounts of those loop devices.
type PoolState struct {
	Images []string // below the pool: volumes/pv-….img, snapshots/snap-….img
	Loops  []string // /dev/loopN (image)
	Mounts []string // mount points in the node's mount namespace (device)
}

// Empty reports whether nothing of a volume is attached or mounted.
func (s PoolState) Empty() bool { return len(s.Loops)+len(s.Mounts) == 0 }

// PoolState reads the node's pool, the host's loop devices and the node's
// mount table.
func (n *Node) PoolState(ctx context.Context) (PoolState, error) {
	var s PoolState
	byInode := map[[2]uint64]string{}
	var tags []string
	for name, dir := range n.Pools() {
		// The default pool's images as before (volumes/pv-….img), another
		// pool's under its name (fast:volumes/pv-fast-….img).
		prefix := ""
		if name != pool.DefaultName {
			prefix = name + ":"
		}
		for _, d := range []string{"volumes", "snapshots"} {
			ents, err := os.ReadDir(filepath.Join(dir, d))
			if err != nil && !os.IsNotExist(err) {
				return s, err
			}
			for _, e := range ents {
				if !e.Type().IsRegular() || strings.HasPrefix(e.Name(), ".") {
					continue
				}
				rel := d + "/" + e.Name()
				s.Images = append(s.Images, prefix+rel)
				var st syscall.Stat_t
				if syscall.Stat(filepath.Join(dir, rel), &st) == nil {
					byInode[[2]uint64{st.Dev, st.Ino}] = prefix + rel
				}
			}
		}
		// A device whose image was deleted has no inode left to match:
		// the pool's tag, which the plugin gives each device it
		// attaches, names it.
		tag, err := pool.LoopTag(filepath.Join(dir, "volumes"))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return s, err
		}
		if tag != "" {
			tags = append(tags, tag)
		}
	}
	sort.Strings(s.Images)
	loops, err := device.LoopDevices()
	if err != nil {
		return s, err
	}
	ours := map[string]bool{}
	for dev, file := range loops {
		d, ino, err := device.LoopInode(dev)
		if img, ok := byInode[[2]uint64{d, ino}]; err == nil && ok {
			s.Loops = append(s.Loops, dev+" ("+img+")")
			ours[dev] = true
		} else if slices.Contains(tags, device.LoopTag(dev)) {
			s.Loops = append(s.Loops, dev+" ("+file+")")
			ours[dev] = true
		}
	}
	mounts, err := n.c.run(ctx, "nsenter", append(n.enter(), "cat", "/proc/self/mountinfo")...)
	if err != nil {
		return s, fmt.Errorf("node %s: its mounts: %w", n.Name, err)
	}
	for _, l := range strings.Split(mounts, "\n") {
		pre, post, ok := strings.Cut(l, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 2 {
			continue
		}
		switch {
		case ours[g[1]]: // a filesystem on the loop device
			s.Mounts = append(s.Mounts, unescapeMountinfo(f[4])+" ("+g[1]+")")
		case g[0] == "devtmpfs" && ours["/dev"+f[3]]: // the device node itself, bound to a block volume's target
			s.Mounts = append(s.Mounts, unescapeMountinfo(f[4])+" (/dev"+f[3]+")")
		}
	}
	return s, nil
}
