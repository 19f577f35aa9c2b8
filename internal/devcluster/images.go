package devcluster

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// file is one entry of an image's single layer.
type file struct {
	path  string // in the image, absolute
	from  string // host file to copy, or
	data  []byte // contents, or
	link  string // symlink target, or a directory when all are empty
	mode  int64
	isDir bool
}

// image is a container image built from files, written as an OCI archive
// that `ctr images import` takes: no registry, no Docker.
type image struct {
	ref        string // e.g. localhost/busybox:podvol
	entrypoint []string
	cmd        []string // the default arguments, if any
	files      []file
}

func sum(b []byte) string { h := sha256.Sum256(b); return hex.EncodeToString(h[:]) }

// write writes the OCI image layout of img as a tar archive at path.
func (img image) write(path string) error {
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	sort.Slice(img.files, func(i, j int) bool { return img.files[i].path < img.files[j].path })
	dirs := map[string]bool{}
	addDir := func(d string) error {
		var missing []string
		for d = strings.TrimPrefix(d, "/"); d != "." && d != "" && !dirs[d]; d = filepath.Dir(d) {
			missing = append(missing, d)
			dirs[d] = true
		}
		for i := len(missing) - 1; i >= 0; i-- {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: missing[i] + "/", Mode: 0o755}); err != nil {
				return err
			}
		}
		return nil
	}
	for _, f := range img.files {
		name := strings.TrimPrefix(f.path, "/")
		if err := addDir(filepath.Dir(f.path)); err != nil {
			return err
		}
		switch {
		case f.isDir:
			if err := addDir(f.path); err != nil {
				return err
			}
		case f.link != "":
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: f.link, Mode: 0o777}); err != nil {
				return err
			}
		default:
			data := f.data
			mode := f.mode
			if f.from != "" {
				var err error
				if data, err = os.ReadFile(f.from); err != nil {
					return fmt.Errorf("image %s: %w", img.ref, err)
				}
				if mode == 0 {
					fi, _ := os.Stat(f.from)
					mode = int64(fi.Mode().Perm())
				}
			}
			if mode == 0 {
				mode = 0o644
			}
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data))}); err != nil {
				return err
			}
			if _, err := tw.Write(data); err != nil {
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	diffID := sum(layer.Bytes())
	var gz bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&gz, gzip.BestSpeed)
	if _, err := zw.Write(layer.Bytes()); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	blobs := map[string][]byte{}
	add := func(b []byte) (string, int) { d := sum(b); blobs[d] = b; return d, len(b) }
	layerDigest, layerSize := add(gz.Bytes())
	imgConfig := map[string]any{"Entrypoint": img.entrypoint, "Env": []string{"PATH=/bin:/usr/bin:/sbin:/usr/sbin"}, "WorkingDir": "/"}
	if len(img.cmd) > 0 {
		imgConfig["Cmd"] = img.cmd
	}
	config, _ := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux",
		"config": imgConfig,
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + diffID}},
	})
	configDigest, configSize := add(config)
	manifest, _ := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": map[string]any{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": "sha256:" + configDigest, "size": configSize},
		"layers": []any{map[string]any{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": "sha256:" + layerDigest, "size": layerSize}},
	})
	manifestDigest, manifestSize := add(manifest)
	index, _ := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
		"manifests": []any{map[string]any{
			"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": "sha256:" + manifestDigest, "size": manifestSize,
			"annotations": map[string]string{"io.containerd.image.name": img.ref, "org.opencontainers.image.ref.name": img.ref[strings.LastIndex(img.ref, ":")+1:]},
			"platform":    map[string]string{"architecture": "amd64", "os": "linux"},
		}},
	})
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	defer out.Close()
	ow := tar.NewWriter(out)
	put := func(name string, b []byte) error {
		if err := ow.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(b))}); err != nil {
			return err
		}
		_, err := ow.Write(b)
		return err
	}
	if err := put("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := put("index.json", index); err != nil {
		return err
	}
	for d, b := range blobs {
		if err := put("blobs/sha256/"+d, b); err != nil {
			return err
		}
	}
	return ow.Close()
}

// hostBinaries returns the files that run the named host programs in an
// image: the programs and every shared library ldd says they load.
func hostBinaries(names ...string) ([]file, error) {
	seen := map[string]bool{}
	var files []file
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
			files = append(files, file{path: p, link: target})
			if seen[target] {
				return nil
			}
			seen[target] = true
		}
		files = append(files, file{path: target, from: target})
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
