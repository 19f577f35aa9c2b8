// Package snaphandle is the form of podvol's CSI snapshot ids (the handles
// Kubernetes keeps in VolumeSnapshotContents): the pool's id of the snapshot
// and the node whose pool holds it. A snapshot is node-local, and a handle
// that meets Kubernetes without its node (an admin imports a snapshot as a
// pre-provisioned VolumeSnapshotContent) must still reach that node's
// csi-snapshotter, which only takes contents labelled with its node:
// podvol-controller reads the node from the handle and labels the content.
package snaphandle

import "strings"

// Separator joins the pool's id and the node. Node names are DNS
// subdomains and never contain it.
const Separator = "@"

// MaxLen is the longest id the CSI spec allows.
const MaxLen = 128

// Format returns the handle of snapshot id on node. A node whose name would
// make the handle longer than the CSI spec allows is left out: such a handle
// works everywhere but cannot be imported without a label.
func Format(id, node string) string {
	h := id + Separator + node
	if node == "" || len(h) > MaxLen {
		return id
	}
	return h
}

// Parse splits a handle into the pool's id and its node ("" when the handle
// names none, as handles made before podvol named nodes do).
func Parse(handle string) (id, node string) {
	id, node, _ = strings.Cut(handle, Separator)
	return id, node
}
