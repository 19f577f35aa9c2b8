package device

import (
	"sort"
	"strings"
)

// Program is a program the plugin runs, with the Debian package that ships it.
// Programs is the one list of them: run refuses any other program, and the
// plugin image (internal/podvolimage) is built with these programs, taken
// from these packages, and checked to hold each of them.
type Program struct {
	Name    string
	Package string // the Debian package the plugin image takes it from
	// RewritesDisk marks a tool that writes a filesystem's metadata:
	// killed half-way it can leave it corrupt, so it gets a long timeout.
	RewritesDisk bool
}

// Programs are the programs the plugin runs, by name. Unmounting, freezing,
// trimming, loop devices and reflinks are system calls, not programs.
var Programs = []Program{
	{Name: "blkid", Package: "util-linux"},
	{Name: "e2fsck", Package: "e2fsprogs", RewritesDisk: true},
	{Name: "mkfs.ext4", Package: "e2fsprogs", RewritesDisk: true},
	{Name: "mkfs.xfs", Package: "xfsprogs", RewritesDisk: true},
	{Name: "mount", Package: "mount"},
	{Name: "resize2fs", Package: "e2fsprogs", RewritesDisk: true},
	{Name: "xfs_growfs", Package: "xfsprogs", RewritesDisk: true},
}

func program(name string) (Program, bool) {
	for _, t := range Programs {
		if t.Name == name {
			return t, true
		}
	}
	return Program{}, false
}

// ToolPackages returns the Debian packages of Programs, sorted, once each.
func ToolPackages() []string {
	seen := map[string]bool{}
	var out []string
	for _, t := range Programs {
		if !seen[t.Package] {
			seen[t.Package] = true
			out = append(out, t.Package)
		}
	}
	sort.Strings(out)
	return out
}

func toolPackagesText() string { return strings.Join(ToolPackages(), ", ") }
