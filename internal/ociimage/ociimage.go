// Package ociimage writes container images as OCI image layouts in tar
// archives (what `ctr images import`, skopeo's oci-archive: and crane take):
// one layer of files, no Docker, no registry. The output is reproducible:
// the same files and settings give the same bytes, so the same digests
// (entries sorted, one fixed time on every entry and in the config, no
// owner names, gzip with no name or time in its header).
package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"time"
)

// Media types of the OCI image spec.
const (
	MediaTypeIndex    = "application/vnd.oci.image.index.v1+json"
	MediaTypeManifest = "application/vnd.oci.image.manifest.v1+json"
	MediaTypeConfig   = "application/vnd.oci.image.config.v1+json"
	MediaTypeLayer    = "application/vnd.oci.image.layer.v1.tar+gzip"
)

// Annotation keys (OCI image spec, annotations.md); the same keys are the
// images' labels.
const (
	AnnotationRefName  = "org.opencontainers.image.ref.name"
	AnnotationCreated  = "org.opencontainers.image.created"
	AnnotationVersion  = "org.opencontainers.image.version"
	AnnotationRevision = "org.opencontainers.image.revision"
	AnnotationSource   = "org.opencontainers.image.source"
	AnnotationTitle    = "org.opencontainers.image.title"
	// containerd's name of an imported image.
	annotationContainerdName = "io.containerd.image.name"
)

// File is one entry of an image's layer.
type File struct {
	Path string // in the image, absolute
	From string // host file to copy, or
	Data []byte // contents, or
	Link string // symlink target, or a directory when Dir
	Dir  bool
	Mode int64 // permission bits; 0: the host file's, else 0644 (0755 for a directory)
}

// Platform is an image's OS and architecture, in GOOS/GOARCH terms.
type Platform struct {
	OS, Architecture, Variant string
}

func (p Platform) String() string {
	s := p.OS + "/" + p.Architecture
	if p.Variant != "" {
		s += "/" + p.Variant
	}
	return s
}

// Linux returns the platform of a Linux GOARCH, with the variant the OCI
// spec's registries expect (arm64 is v8).
func Linux(goarch string) Platform {
	p := Platform{OS: "linux", Architecture: goarch}
	if goarch == "arm64" {
		p.Variant = "v8"
	}
	return p
}

// Image is one platform's image.
type Image struct {
	Platform   Platform
	Entrypoint []string
	Cmd        []string // default arguments, if any
	Env        []string // default: a PATH of /usr/sbin, /usr/bin, /sbin, /bin
	User       string   // "" is root
	Labels     map[string]string
	Created    time.Time // on every entry and in the config: fix it for reproducible output
	Files      []File
}

// Descriptor is an OCI content descriptor.
type Descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    *platformJSON     `json:"platform,omitempty"`
}

type platformJSON struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Variant      string `json:"variant,omitempty"`
}

// blobs is content by digest.
type blobs map[string][]byte

func (b blobs) add(mediaType string, data []byte) Descriptor {
	h := sha256.Sum256(data)
	d := "sha256:" + hex.EncodeToString(h[:])
	b[d] = data
	return Descriptor{MediaType: mediaType, Digest: d, Size: int64(len(data))}
}

// Layer returns img's layer as an uncompressed tar: entries sorted by path,
// each parent directory before its entries, owner root, time img.Created.
func (img Image) Layer() ([]byte, error) {
	files := append([]File(nil), img.Files...)
	sort.SliceStable(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mtime := img.Created.UTC().Truncate(time.Second)
	hdr := func(h *tar.Header) error {
		h.ModTime = mtime
		h.Format = tar.FormatPAX
		return tw.WriteHeader(h)
	}
	written := map[string]bool{}
	var addDir func(dir string, mode int64) error
	addDir = func(dir string, mode int64) error {
		dir = strings.TrimPrefix(path.Clean(dir), "/")
		if dir == "." || dir == "" || written[dir] {
			return nil
		}
		if err := addDir(path.Dir(dir), 0); err != nil {
			return err
		}
		written[dir] = true
		if mode == 0 {
			mode = 0o755
		}
		return hdr(&tar.Header{Typeflag: tar.TypeDir, Name: dir + "/", Mode: mode})
	}
	for i, f := range files {
		if !strings.HasPrefix(f.Path, "/") {
			return nil, fmt.Errorf("%s: not an absolute path", f.Path)
		}
		name := strings.TrimPrefix(path.Clean(f.Path), "/")
		if i > 0 && path.Clean(files[i-1].Path) == path.Clean(f.Path) {
			return nil, fmt.Errorf("%s is in the image twice", f.Path)
		}
		if f.Dir {
			if err := addDir(f.Path, f.Mode); err != nil {
				return nil, err
			}
			continue
		}
		if err := addDir(path.Dir(f.Path), 0); err != nil {
			return nil, err
		}
		if f.Link != "" {
			if err := hdr(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: f.Link, Mode: 0o777}); err != nil {
				return nil, err
			}
			continue
		}
		data, mode := f.Data, f.Mode
		if f.From != "" {
			var err error
			if data, err = os.ReadFile(f.From); err != nil {
				return nil, err
			}
			if mode == 0 {
				fi, err := os.Stat(f.From)
				if err != nil {
					return nil, err
				}
				mode = int64(fi.Mode().Perm())
			}
		}
		if mode == 0 {
			mode = 0o644
		}
		if err := hdr(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data))}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// manifest adds img's layer, config and manifest to b and returns the
// manifest's descriptor, with its platform.
func (img Image) manifest(b blobs) (Descriptor, error) {
	layer, err := img.Layer()
	if err != nil {
		return Descriptor{}, fmt.Errorf("the %s image's layer: %w", img.Platform, err)
	}
	diffID := sha256.Sum256(layer)
	var gz bytes.Buffer
	// No name and a zero time in the gzip header: the bytes depend on the
	// content (and Go's compress/flate) only.
	zw, err := gzip.NewWriterLevel(&gz, gzip.DefaultCompression)
	if err != nil {
		return Descriptor{}, err
	}
	if _, err := zw.Write(layer); err != nil {
		return Descriptor{}, err
	}
	if err := zw.Close(); err != nil {
		return Descriptor{}, err
	}
	layerDesc := b.add(MediaTypeLayer, gz.Bytes())
	env := img.Env
	if env == nil {
		env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	}
	cfg := map[string]any{"Env": env, "WorkingDir": "/"}
	if len(img.Entrypoint) > 0 {
		cfg["Entrypoint"] = img.Entrypoint
	}
	if len(img.Cmd) > 0 {
		cfg["Cmd"] = img.Cmd
	}
	if img.User != "" {
		cfg["User"] = img.User
	}
	if len(img.Labels) > 0 {
		cfg["Labels"] = img.Labels // encoding/json sorts map keys
	}
	config := map[string]any{
		"created":      img.Created.UTC().Format(time.RFC3339),
		"architecture": img.Platform.Architecture,
		"os":           img.Platform.OS,
		"config":       cfg,
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + hex.EncodeToString(diffID[:])}},
	}
	if img.Platform.Variant != "" {
		config["variant"] = img.Platform.Variant
	}
	configJSON, err := json.Marshal(config)
	if err != nil {
		return Descriptor{}, err
	}
	m := map[string]any{
		"schemaVersion": 2,
		"mediaType":     MediaTypeManifest,
		"config":        b.add(MediaTypeConfig, configJSON),
		"layers":        []Descriptor{layerDesc},
	}
	if len(img.Labels) > 0 {
		m["annotations"] = img.Labels
	}
	mJSON, err := json.Marshal(m)
	if err != nil {
		return Descriptor{}, err
	}
	d := b.add(MediaTypeManifest, mJSON)
	d.Platform = &platformJSON{Architecture: img.Platform.Architecture, OS: img.Platform.OS, Variant: img.Platform.Variant}
	return d, nil
}

// WriteArchive writes img as an OCI image layout in a tar archive at path,
// named ref (e.g. "localhost/podvol-plugin:v1": the name containerd
// imports it under; the tag after the last ':' is its
// org.opencontainers.image.ref.name), its manifest listed in the layout's
// index.json. annotations go on that descriptor. It returns the manifest's
// digest.
func WriteArchive(path, ref string, annotations map[string]string, img Image) (string, error) {
	return write(path, ref, annotations, false, img)
}

// WriteIndexArchive writes imgs (one per platform) as WriteArchive does,
// as an image index that index.json lists, annotations on both. It returns
// the index's digest: the one a registry serves for the tag once pushed.
func WriteIndexArchive(path, ref string, annotations map[string]string, imgs ...Image) (string, error) {
	return write(path, ref, annotations, true, imgs...)
}

func write(path, ref string, annotations map[string]string, asIndex bool, imgs ...Image) (string, error) {
	if len(imgs) == 0 {
		return "", fmt.Errorf("no image to write")
	}
	seen := map[Platform]bool{}
	for _, img := range imgs {
		if seen[img.Platform] {
			return "", fmt.Errorf("two images of %s", img.Platform)
		}
		seen[img.Platform] = true
	}
	b := blobs{}
	var manifests []Descriptor
	for _, img := range imgs {
		d, err := img.manifest(b)
		if err != nil {
			return "", err
		}
		manifests = append(manifests, d)
	}
	var top Descriptor
	if !asIndex {
		top = manifests[0]
	} else {
		idx := map[string]any{"schemaVersion": 2, "mediaType": MediaTypeIndex, "manifests": manifests}
		if len(annotations) > 0 {
			idx["annotations"] = annotations
		}
		j, err := json.Marshal(idx)
		if err != nil {
			return "", err
		}
		top = b.add(MediaTypeIndex, j)
	}
	top.Annotations = map[string]string{annotationContainerdName: ref, AnnotationRefName: ref[strings.LastIndex(ref, ":")+1:]}
	for k, v := range annotations {
		top.Annotations[k] = v
	}
	index, err := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": MediaTypeIndex, "manifests": []Descriptor{top}})
	if err != nil {
		return "", err
	}
	if err := writeLayoutTar(path, index, b, imgs[0].Created); err != nil {
		return "", err
	}
	return top.Digest, nil
}

// writeLayoutTar writes the layout's files, blobs in digest order, each
// entry with the time mtime, through a temporary file renamed into place.
func writeLayoutTar(path string, index []byte, b blobs, mtime time.Time) (err error) {
	tmp, err := os.CreateTemp(dirOf(path), ".oci-*.tar")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	tw := tar.NewWriter(tmp)
	mtime = mtime.UTC().Truncate(time.Second)
	put := func(name string, typ byte, data []byte) error {
		h := &tar.Header{Typeflag: typ, Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: mtime, Format: tar.FormatPAX}
		if typ == tar.TypeDir {
			h.Mode, h.Size = 0o755, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	if err := put("oci-layout", tar.TypeReg, []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := put("index.json", tar.TypeReg, index); err != nil {
		return err
	}
	for _, d := range []string{"blobs/", "blobs/sha256/"} {
		if err := put(d, tar.TypeDir, nil); err != nil {
			return err
		}
	}
	digests := make([]string, 0, len(b))
	for d := range b {
		digests = append(digests, d)
	}
	sort.Strings(digests)
	for _, d := range digests {
		if err := put("blobs/sha256/"+strings.TrimPrefix(d, "sha256:"), tar.TypeReg, b[d]); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func dirOf(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[:i+1]
	}
	return "."
}

// Archive is an OCI archive read back: its index.json and blobs by digest.
type Archive struct {
	Index Index
	Blobs map[string][]byte
}

// Index is an image index (index.json, or an index blob).
type Index struct {
	MediaType   string            `json:"mediaType"`
	Manifests   []Descriptor      `json:"manifests"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// Manifest is an image manifest.
type Manifest struct {
	MediaType   string            `json:"mediaType"`
	Config      Descriptor        `json:"config"`
	Layers      []Descriptor      `json:"layers"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// Config is the part of an image config the tests read.
type Config struct {
	Created      string `json:"created"`
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Variant      string `json:"variant"`
	Config       struct {
		User       string            `json:"User"`
		Entrypoint []string          `json:"Entrypoint"`
		Env        []string          `json:"Env"`
		Labels     map[string]string `json:"Labels"`
	} `json:"config"`
	RootFS struct {
		DiffIDs []string `json:"diff_ids"`
	} `json:"rootfs"`
}

// ReadArchive reads an OCI archive as WriteArchive writes it, checking each
// blob against its digest.
func ReadArchive(path string) (*Archive, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	a := &Archive{Blobs: map[string][]byte{}}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return nil, err
		}
		switch {
		case h.Name == "index.json":
			if err := json.Unmarshal(data, &a.Index); err != nil {
				return nil, fmt.Errorf("%s: index.json: %w", path, err)
			}
		case strings.HasPrefix(h.Name, "blobs/sha256/"):
			sum := sha256.Sum256(data)
			if d := strings.TrimPrefix(h.Name, "blobs/sha256/"); d != hex.EncodeToString(sum[:]) {
				return nil, fmt.Errorf("%s: blob %s has the digest %x", path, d, sum)
			}
			a.Blobs["sha256:"+strings.TrimPrefix(h.Name, "blobs/sha256/")] = data
		}
	}
	return a, nil
}

// JSON decodes the blob d into v.
func (a *Archive) JSON(d Descriptor, v any) error {
	b, ok := a.Blobs[d.Digest]
	if !ok {
		return fmt.Errorf("blob %s is missing", d.Digest)
	}
	return json.Unmarshal(b, v)
}

// LayerFiles returns the entries of a gzipped layer blob: headers and the
// contents of regular files.
func (a *Archive) LayerFiles(d Descriptor) (map[string]*tar.Header, map[string][]byte, error) {
	b, ok := a.Blobs[d.Digest]
	if !ok {
		return nil, nil, fmt.Errorf("layer %s is missing", d.Digest)
	}
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil, nil, err
	}
	hdrs, data := map[string]*tar.Header{}, map[string][]byte{}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, nil, err
		}
		p := path.Clean("/" + h.Name)
		hdrs[p] = h
		if h.Typeflag == tar.TypeReg {
			if data[p], err = io.ReadAll(tr); err != nil {
				return nil, nil, err
			}
		}
	}
	return hdrs, data, nil
}
