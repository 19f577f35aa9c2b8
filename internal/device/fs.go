package device

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// Filesystems podvol formats. Anything else is refused at the edge.
var Filesystems = map[string]bool{"ext4": true, "xfs": true}

// run executes a command and folds its output into the error, so that a
// failure says what the tool itself said. Commands run to completion whatever
// becomes of the request that started them (kubelet's deadline expiring, a
// cancelled call): a tool killed mid-run can corrupt a filesystem, and a
// remount after a failure must still happen. The caller holds the volume's
// lock meanwhile, so kubelet's retry waits for the result and finds it. Each
// command has a timeout of its own instead, generous for the tools that
// rewrite a disk (a check of a large filesystem takes long).
//
// Only the programs of Tools run: the plugin image holds those and no
// others.
func run(ctx context.Context, name string, args ...string) ([]byte, error) {
	t, ok := program(name)
	if !ok {
		return nil, fmt.Errorf("%s is not in device.Programs, the list of programs the plugin runs and its image holds: add it there", name)
	}
	timeout := 10 * time.Minute
	if t.RewritesDisk {
		timeout = 2 * time.Hour
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	if err != nil {
		var ee *exec.Error
		if errors.As(err, &ee) {
			return out.Bytes(), fmt.Errorf("%s is not installed (Debian package %s; the plugin needs %s): %w", name, t.Package, toolPackagesText(), err)
		}
		return out.Bytes(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return out.Bytes(), nil
}

// Probe returns the filesystem found on dev, "" when the device holds no
// signature at all. Any other signature (a partition table, LVM, swap) is
// reported as such, so that podvol never formats over data it does not know.
func Probe(ctx context.Context, dev string) (string, error) {
	out, err := run(ctx, "blkid", "-p", "-o", "export", dev)
	if err != nil {
		var ee *exec.ExitError
		// blkid exits 2 when it finds nothing.
		if errors.As(err, &ee) && ee.ExitCode() == 2 {
			return "", nil
		}
		return "", err
	}
	vals := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			vals[k] = v
		}
	}
	if t := vals["TYPE"]; t != "" {
		return t, nil
	}
	if t := vals["PTTYPE"]; t != "" {
		return "partition-table:" + t, nil
	}
	return "unknown", nil
}

// Format makes a filesystem on dev (a loop device, or an image file).
// Discard is skipped: the image is sparse already, and discarding a large
// one only costs time.
//
// Its sectors and blocks are sized for a loop device at the pool's block
// size (PoolBlockSize), as AttachLoop sets one up: ext4 gets 4 KiB blocks
// whatever its size (mke2fs would give a small one 1 KiB blocks, which
// could not be mounted on a 4 KiB device), xfs made on an image file the
// pool's block size as its sector size (mkfs.xfs would take 512 bytes for a
// file; on a device it takes the device's own).
func Format(ctx context.Context, dev, fsType string) error {
	switch fsType {
	case "ext4":
		_, err := run(ctx, "mkfs.ext4", "-q", "-F", "-m", "0", "-b", "4096", "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard", dev)
		return err
	case "xfs":
		args := []string{"-q", "-f", "-K"}
		if fi, err := os.Stat(dev); err == nil && fi.Mode().IsRegular() {
			args = append(args, "-s", "size="+strconv.Itoa(PoolBlockSize(dev)))
		}
		_, err := run(ctx, "mkfs.xfs", append(args, dev)...)
		return err
	}
	return fmt.Errorf("unsupported filesystem %q", fsType)
}

// FsckIfNeeded repairs what an unclean shutdown leaves on ext4 before the
// mount. xfs replays its log at mount time and needs nothing.
func FsckIfNeeded(ctx context.Context, dev, fsType string) error {
	if fsType != "ext4" {
		return nil
	}
	_, err := run(ctx, "e2fsck", "-p", dev)
	var ee *exec.ExitError
	// 1: errors corrected; both 0 and 1 leave a mountable filesystem.
	if err != nil && errors.As(err, &ee) && ee.ExitCode() <= 1 {
		return nil
	}
	return err
}
