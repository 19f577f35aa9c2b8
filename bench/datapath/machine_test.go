package datapath

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// Resident counts what the kernel has cached of a file, page by page: none
// of it after the pages are dropped, all of it after a read.
func TestResidentCountsCachedPages(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	const size = 8<<20 + 100 // a last page that is partly the file's
	if err := os.WriteFile(path, make([]byte, size), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	drop := func() {
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
			t.Fatal(err)
		}
	}
	drop()
	if got, err := Resident(path); err != nil || got != 0 {
		t.Fatalf("after FADV_DONTNEED: %d bytes cached, %v; want 0 (is the temporary directory on tmpfs? set TMPDIR)", got, err)
	}
	if _, err := f.ReadAt(make([]byte, 1<<20), 2<<20); err != nil {
		t.Fatal(err)
	}
	got, err := Resident(path)
	if err != nil {
		t.Fatal(err)
	}
	if got < 1<<20 || got > size {
		t.Errorf("after reading 1 MiB: %d bytes cached, want at least 1 MiB and at most the file", got)
	}
	if _, err := f.ReadAt(make([]byte, size), 0); err != nil {
		t.Fatal(err)
	}
	if got, err := Resident(path); err != nil || got != size {
		t.Errorf("after reading it all: %d bytes cached, %v; want %d", got, err, size)
	}
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := Resident(empty); err != nil || got != 0 {
		t.Errorf("empty file: %d, %v", got, err)
	}
}
