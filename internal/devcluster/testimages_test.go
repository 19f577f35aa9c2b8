package devcluster

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A tool image must run its program in a container that has nothing of the
// host: the program at its host path, every library ldd names and the
// shell the benchmark's exec goes through.
func TestToolImageHoldsTheProgramAndItsLibraries(t *testing.T) {
	const prog = "losetup" // util-linux, dynamically linked (libmount, libblkid, libc)
	bin, err := exec.LookPath(prog)
	if err != nil {
		t.Fatalf("%s is not installed (util-linux, which make deps installs): %v", prog, err)
	}
	ldd, err := exec.Command("ldd", bin).Output()
	if err != nil {
		t.Fatalf("ldd %s: %v (the test needs a dynamically linked program)", bin, err)
	}
	img, err := toolImage("localhost/tool:test", prog)
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(t.TempDir(), "tool.oci.tar")
	if err := img.write(archive); err != nil {
		t.Fatal(err)
	}
	entries := layerEntries(t, archive)
	want := []string{bin, "/bin/sh", "/bin/dd"}
	for _, l := range strings.Split(string(ldd), "\n") {
		for _, w := range strings.Fields(l) {
			if strings.HasPrefix(w, "/") {
				want = append(want, w)
			}
		}
	}
	for _, w := range want {
		if _, ok := entries[strings.TrimPrefix(w, "/")]; !ok {
			t.Errorf("the image has no %s", w)
		}
	}
	if len(want) < 5 {
		t.Fatalf("ldd named too few libraries to test anything: %q", ldd)
	}
	seen := map[string]int{}
	for _, f := range img.files {
		seen[f.Path]++
		if seen[f.Path] == 2 {
			t.Errorf("%s is in the image twice", f.Path)
		}
	}
}

// layerEntries reads the single layer of an OCI archive that image.write
// made and returns its entries by name.
func layerEntries(t *testing.T, archive string) map[string]*tar.Header {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	entries := map[string]*tar.Header{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(h.Name, "blobs/") {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		zr, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			continue // the config or the manifest
		}
		lr := tar.NewReader(zr)
		for {
			lh, err := lr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			entries[lh.Name] = lh
		}
	}
	if len(entries) == 0 {
		t.Fatal("no layer in the archive")
	}
	return entries
}
