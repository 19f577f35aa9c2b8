package ociimage

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func testImages(t *testing.T) []Image {
	host := filepath.Join(t.TempDir(), "prog")
	if err := os.WriteFile(host, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var out []Image
	for _, arch := range []string{"amd64", "arm64"} {
		out = append(out, Image{
			Platform:   Linux(arch),
			Entrypoint: []string{"/prog"},
			User:       "65532:65532",
			Labels:     map[string]string{AnnotationVersion: "v1", AnnotationCreated: created.Format(time.RFC3339)},
			Created:    created,
			// Out of order on purpose: the layer sorts them.
			Files: []File{
				{Path: "/usr/lib/b", Data: []byte("b-" + arch)},
				{Path: "/prog", From: host},
				{Path: "/tmp", Dir: true, Mode: 0o1777},
				{Path: "/usr/bin/a", Link: "../lib/b"},
			},
		})
	}
	return out
}

// TestWriteArchiveIsReproducible writes the same images twice, with the
// host file's time changed in between: the archives must be the same bytes.
func TestWriteArchiveIsReproducible(t *testing.T) {
	imgs := testImages(t)
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.tar"), filepath.Join(dir, "b.tar")
	da, err := WriteIndexArchive(a, "x:v1", nil, imgs...)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(imgs[0].Files[1].From, time.Now(), time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	db, err := WriteIndexArchive(b, "x:v1", nil, imgs...)
	if err != nil {
		t.Fatal(err)
	}
	if da != db {
		t.Errorf("digests differ: %s, %s", da, db)
	}
	ba, _ := os.ReadFile(a)
	bb, _ := os.ReadFile(b)
	if !bytes.Equal(ba, bb) {
		t.Errorf("the two archives differ")
	}
}

// TestWriteArchiveIndex reads an archive of two platforms back: index.json
// names one image index, which lists a manifest per platform, whose config
// and layer are as written.
func TestWriteArchiveIndex(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.tar")
	top, err := WriteIndexArchive(path, "localhost/x:v1", map[string]string{AnnotationVersion: "v1"}, testImages(t)...)
	if err != nil {
		t.Fatal(err)
	}
	a, err := ReadArchive(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Index.Manifests) != 1 || a.Index.Manifests[0].Digest != top || a.Index.Manifests[0].MediaType != MediaTypeIndex {
		t.Fatalf("index.json lists %+v, want the one image index %s", a.Index.Manifests, top)
	}
	if got := a.Index.Manifests[0].Annotations[AnnotationRefName]; got != "v1" {
		t.Errorf("ref.name %q, want v1", got)
	}
	var idx Index
	if err := a.JSON(a.Index.Manifests[0], &idx); err != nil {
		t.Fatal(err)
	}
	platforms := map[string]bool{}
	for _, m := range idx.Manifests {
		platforms[m.Platform.OS+"/"+m.Platform.Architecture+"/"+m.Platform.Variant] = true
		var man Manifest
		if err := a.JSON(m, &man); err != nil {
			t.Fatal(err)
		}
		var cfg Config
		if err := a.JSON(man.Config, &cfg); err != nil {
			t.Fatal(err)
		}
		if cfg.Architecture != m.Platform.Architecture || cfg.Config.User != "65532:65532" || cfg.Created != "2026-01-02T03:04:05Z" {
			t.Errorf("config of %s: %+v", m.Platform.Architecture, cfg)
		}
		hdrs, data, err := a.LayerFiles(man.Layers[0])
		if err != nil {
			t.Fatal(err)
		}
		if h := hdrs["/tmp"]; h == nil || h.Mode != 0o1777 {
			t.Errorf("/tmp: %+v", h)
		}
		if h := hdrs["/usr/bin/a"]; h == nil || h.Linkname != "../lib/b" {
			t.Errorf("/usr/bin/a: %+v", h)
		}
		if string(data["/usr/lib/b"]) != "b-"+m.Platform.Architecture {
			t.Errorf("/usr/lib/b of %s: %q", m.Platform.Architecture, data["/usr/lib/b"])
		}
		for p, h := range hdrs {
			if !h.ModTime.Equal(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)) || h.Uid != 0 || h.Uname != "" {
				t.Errorf("%s: time %s, owner %d %q", p, h.ModTime, h.Uid, h.Uname)
			}
		}
	}
	if !platforms["linux/amd64/"] || !platforms["linux/arm64/v8"] || len(platforms) != 2 {
		t.Errorf("platforms %v, want linux/amd64 and linux/arm64/v8", platforms)
	}
}

func TestLayerRefusesAFileTwice(t *testing.T) {
	img := Image{Files: []File{{Path: "/a", Data: []byte("1")}, {Path: "/a", Data: []byte("2")}}}
	if _, err := img.Layer(); err == nil {
		t.Error("two files at /a: no error")
	}
}

// TestWriteArchiveOneImage: one image's manifest is what index.json lists,
// with its platform and the name containerd imports it under.
func TestWriteArchiveOneImage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.tar")
	d, err := WriteArchive(path, "localhost/x:v1", nil, testImages(t)[1])
	if err != nil {
		t.Fatal(err)
	}
	a, err := ReadArchive(path)
	if err != nil {
		t.Fatal(err)
	}
	m := a.Index.Manifests
	if len(m) != 1 || m[0].Digest != d || m[0].MediaType != MediaTypeManifest || m[0].Platform == nil || m[0].Platform.Architecture != "arm64" {
		t.Fatalf("index.json lists %+v, want the arm64 manifest %s", m, d)
	}
	if got := m[0].Annotations[annotationContainerdName]; got != "localhost/x:v1" {
		t.Errorf("containerd's name %q", got)
	}
}
