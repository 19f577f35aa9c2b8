// Package directvolume speaks the Kata Containers direct-volume protocol:
// instead of mounting a volume on the host, the CSI node plugin leaves the
// block device and its mount information where the runtime looks, and the
// runtime attaches the device to the guest and mounts it there. Stats and
// resize then go through the runtime's shim. The runtime reads these bytes,
// so the layout below is exact.
package directvolume

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
)

// DefaultRoot is where Kata looks for direct volumes.
const DefaultRoot = "/run/kata-containers/shared/direct-volumes"

// InfoFile is the name of the mount information file.
const InfoFile = "mountInfo.json"

// Metadata keys the runtime understands; nothing else is written there.
const (
	MetaFsGroup             = "fsGroup"
	MetaFsGroupChangePolicy = "fsGroupChangePolicy"
)

// MountInfo is the runtime's view of a volume.
type MountInfo struct {
	VolumeType string            `json:"volume-type"`
	Device     string            `json:"device"`
	FsType     string            `json:"fstype"`
	Metadata   map[string]string `json:"metadata,omitempty"`
	Options    []string          `json:"options,omitempty"`
}

// hostOnly are mount options that mean something only to a host mount; the
// guest gets none of them.
var hostOnly = []string{"bind", "rbind", "remount", "move", "make-shared", "make-private", "make-slave", "make-rshared", "make-rprivate", "make-rslave"}

// GuestOptions keeps the options a guest mount can use.
func GuestOptions(opts []string) []string {
	var out []string
	for _, o := range opts {
		if !slices.Contains(hostOnly, o) && !slices.Contains(out, o) {
			out = append(out, o)
		}
	}
	return out
}

// Dir is the directory of the volume published at target: the padded
// URL-safe base64 of the exact target path string.
func Dir(root, target string) string {
	return filepath.Join(root, base64.URLEncoding.EncodeToString([]byte(target)))
}

// Write stores info for target atomically: a reader sees the whole file or
// none. The directory is 0700, the file 0600.
func Write(root, target string, info MountInfo) error {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", root, err)
	}
	dir := Dir(root, target)
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create direct-volume directory: %w", err)
	}
	// Mkdir honours the umask; the runtime's rule is exact.
	if err := os.Chmod(dir, 0o700); err != nil {
		return err
	}
	b, err := json.Marshal(info)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".mountInfo-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, InfoFile)); err != nil {
		return fmt.Errorf("write %s: %w", InfoFile, err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Read returns the mount information written for target.
func Read(root, target string) (*MountInfo, error) {
	b, err := os.ReadFile(filepath.Join(Dir(root, target), InfoFile))
	if err != nil {
		return nil, err
	}
	info := &MountInfo{}
	if err := json.Unmarshal(b, info); err != nil {
		return nil, fmt.Errorf("decode %s of %s: %w", InfoFile, target, err)
	}
	return info, nil
}

// Remove deletes target's directory with whatever the runtime added to it.
func Remove(root, target string) error {
	if err := os.RemoveAll(Dir(root, target)); err != nil {
		return fmt.Errorf("remove direct-volume directory of %s: %w", target, err)
	}
	return nil
}

// Exists reports whether target has mount information.
func Exists(root, target string) bool {
	_, err := os.Stat(filepath.Join(Dir(root, target), InfoFile))
	return err == nil
}

// Sandbox returns the sandbox id the runtime recorded for target: the entry
// in its directory that is not the mount information.
func Sandbox(root, target string) (string, error) {
	ents, err := os.ReadDir(Dir(root, target))
	if err != nil {
		return "", err
	}
	for _, e := range ents {
		if n := e.Name(); n != InfoFile && n[0] != '.' {
			return n, nil
		}
	}
	return "", nil
}

// Scan lists the target paths that have a directory under root. Names that
// do not decode are not podvol's and are skipped.
func Scan(root string) ([]string, error) {
	ents, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		t, err := base64.URLEncoding.DecodeString(e.Name())
		if err != nil || !e.IsDir() {
			continue
		}
		out = append(out, string(t))
	}
	return out, nil
}
