package device

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Ext4Errors returns the error count ext4 keeps for the filesystem on dev,
// and the function that logged the last one.
func Ext4Errors(dev string) (int, string) {
	dir := filepath.Join("/sys/fs/ext4", filepath.Base(dev))
	b, err := os.ReadFile(filepath.Join(dir, "errors_count"))
	if err != nil {
		return 0, ""
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	last, _ := os.ReadFile(filepath.Join(dir, "last_error_func"))
	return n, strings.TrimSpace(string(last))
}

// ReadableRoot reports the error of listing a mounted filesystem's root: an
// XFS that has shut down answers EIO to everything.
func ReadableRoot(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.Readdirnames(1)
	if errors.Is(err, unix.EIO) {
		return err
	}
	return nil
}
