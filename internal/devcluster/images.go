package devcluster

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/podvol/podvol/internal/ociimage"
)

// image is one of the dev cluster's own images (busybox, pause, the
// sidecars, the e2e suite's stand-ins), of this machine's architecture,
// made of host files. podvol's own images come from internal/images, as
// `make images` builds them.
type image struct {
	ref        string // e.g. localhost/busybox:podvol
	entrypoint []string
	cmd        []string // the default arguments, if any
	files      []ociimage.File
}

// write writes img as an OCI archive that `ctr images import` takes.
func (img image) write(path string) error {
	_, err := ociimage.WriteArchive(path, img.ref, nil, ociimage.Image{
		Platform:   ociimage.Linux(runtime.GOARCH),
		Entrypoint: img.entrypoint,
		Cmd:        img.cmd,
		Env:        []string{"PATH=/bin:/usr/bin:/sbin:/usr/sbin"},
		Files:      img.files,
		Created:    time.Unix(0, 0),
	})
	return err
}

// hostBinaries returns the files that run the named host programs in an
// image: the programs and every shared library ldd says they load.
func hostBinaries(names ...string) ([]ociimage.File, error) {
	seen := map[string]bool{}
	var files []ociimage.File
	addFile := func(p string) error {
		if seen[p] {
			return nil
		}
		seen[p] = true
		target, err := filepath.EvalSymlinks(p)
		if err != nil {
			return err
		}
		if target != p {
			files = append(files, ociimage.File{Path: p, Link: target})
			if seen[target] {
				return nil
			}
			seen[target] = true
		}
		files = append(files, ociimage.File{Path: target, From: target})
		return nil
	}
	for _, n := range names {
		p, err := exec.LookPath(n)
		if err != nil {
			return nil, fmt.Errorf("%s is needed in an image but is not installed here: %w", n, err)
		}
		if err := addFile(p); err != nil {
			return nil, err
		}
		out, err := exec.Command("ldd", p).Output()
		if err != nil {
			continue // static
		}
		for _, l := range strings.Split(string(out), "\n") {
			f := strings.Fields(l)
			for _, w := range f {
				if strings.HasPrefix(w, "/") {
					if err := addFile(w); err != nil {
						return nil, err
					}
				}
			}
		}
	}
	return files, nil
}
