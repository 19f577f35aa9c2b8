package debpkg

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// Package is one binary package of an architecture's index.
type Package struct {
	Name, Version, Architecture string
	Filename                    string // below the source's URI
	SHA256                      string
	Size                        int64
	Depends, PreDepends         string
	Provides                    string
	source                      Source
}

func (p *Package) String() string { return p.Name + "_" + p.Version + "_" + p.Architecture }

// Archive is the packages of one architecture in every suite of the apt
// sources, with the highest version of each name.
type Archive struct {
	Arch     string
	cache    string
	client   *http.Client
	logf     func(format string, args ...any)
	pkgs     map[string]*Package
	provides map[string][]*Package
}

// Open reads the indexes of arch from each source's suites: InRelease,
// verified with gpgv against the source's keyrings, then each component's
// Packages.gz, verified against the SHA256 the Release file gives. Indexes
// and .debs are cached by their hash under cache. A source whose Release
// file does not list arch is skipped. logf reports what it fetches.
func Open(ctx context.Context, sources []Source, arch, cache string, logf func(string, ...any)) (*Archive, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	a := &Archive{Arch: arch, cache: cache, client: http.DefaultClient, logf: logf, pkgs: map[string]*Package{}, provides: map[string][]*Package{}}
	for _, dir := range []string{"index", "debs", "release"} {
		if err := os.MkdirAll(filepath.Join(cache, dir), 0o755); err != nil {
			return nil, fmt.Errorf("the Debian package cache: %w", err)
		}
	}
	used := 0
	for _, src := range sources {
		rel, err := a.release(ctx, src)
		if err != nil {
			return nil, err
		}
		if !contains(strings.Fields(rel.fields["architectures"]), arch) {
			continue
		}
		for _, comp := range src.Components {
			path := comp + "/binary-" + arch + "/Packages.gz"
			h, ok := rel.sha256[path]
			if !ok {
				continue // a component without this architecture
			}
			url := src.URI + "/dists/" + src.Suite + "/" + path
			if strings.EqualFold(rel.fields["acquire-by-hash"], "yes") {
				// The index as of this Release, not a newer one
				// a mirror may have swapped in meanwhile.
				url = src.URI + "/dists/" + src.Suite + "/" + comp + "/binary-" + arch + "/by-hash/SHA256/" + h.sum
			}
			file, err := a.fetch(ctx, url, filepath.Join(cache, "index"), h.sum, h.size)
			if err != nil {
				return nil, fmt.Errorf("the index %s of %s: %w", path, src, err)
			}
			if err := a.readPackages(file, src); err != nil {
				return nil, fmt.Errorf("the index %s of %s: %w", path, src, err)
			}
			used++
		}
	}
	if used == 0 {
		return nil, fmt.Errorf("no apt source has packages for %s (its Release files do not list it)", arch)
	}
	return a, nil
}

type hashSize struct {
	sum  string
	size int64
}

type release struct {
	fields map[string]string
	sha256 map[string]hashSize
}

// release fetches and verifies src's InRelease. Offline, the last one
// verified (cached) stands in for it, so that a warm build needs no network.
func (a *Archive) release(ctx context.Context, src Source) (*release, error) {
	cached := filepath.Join(a.cache, "release", strings.NewReplacer("/", "_", ":", "_").Replace(src.URI+"_"+src.Suite)+".InRelease")
	body, err := a.get(ctx, src.URI+"/dists/"+src.Suite+"/InRelease")
	if err != nil {
		old, rerr := os.ReadFile(cached)
		if rerr != nil {
			return nil, fmt.Errorf("the Release file of %s: %w", src, err)
		}
		a.logf("%s: %v; using the Release file fetched before", src, err)
		body = old
	}
	signed, err := Verify(ctx, body, src.Keyrings)
	if err != nil {
		return nil, fmt.Errorf("the Release file of %s: %w", src, err)
	}
	st := parseStanzas(string(signed))
	if len(st) == 0 {
		return nil, fmt.Errorf("the Release file of %s is empty", src)
	}
	rel := &release{fields: st[0], sha256: map[string]hashSize{}}
	// apt refuses a Release file of another suite (a replay of an older or
	// other one); so does this.
	if rel.fields["suite"] != src.Suite && rel.fields["codename"] != src.Suite {
		return nil, fmt.Errorf("the Release file of %s is of suite %q (codename %q)", src, rel.fields["suite"], rel.fields["codename"])
	}
	for _, l := range strings.Split(rel.fields["sha256"], "\n") {
		f := strings.Fields(l)
		if len(f) != 3 {
			continue
		}
		n, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		rel.sha256[f[2]] = hashSize{f[0], n}
	}
	if err := writeAtomic(cached, body); err != nil {
		return nil, err
	}
	return rel, nil
}

// Verify checks an inline-signed Release file with gpgv and returns the
// signed text only (what gpgv vouches for, not the bytes around it).
func Verify(ctx context.Context, inRelease []byte, keyrings []string) ([]byte, error) {
	args := []string{"--quiet"}
	for _, k := range keyrings {
		args = append(args, "--keyring", k)
	}
	args = append(args, "--output", "-", "-")
	cmd := exec.CommandContext(ctx, "gpgv", args...)
	cmd.Stdin = bytes.NewReader(inRelease)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		var ee *exec.Error
		if errors.As(err, &ee) {
			return nil, fmt.Errorf("gpgv is not installed (Debian: gpgv): %w", err)
		}
		return nil, fmt.Errorf("its signature does not verify with %s: %w: %s", strings.Join(keyrings, ", "), err, strings.TrimSpace(errb.String()))
	}
	return out.Bytes(), nil
}

func (a *Archive) get(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := a.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return io.ReadAll(resp.Body)
}

// fetch returns the path of the file of the given SHA256 under dir,
// downloading it from url when it is not there. What is downloaded is
// checked (size and hash) before it is kept.
func (a *Archive) fetch(ctx context.Context, url, dir, sum string, size int64) (string, error) {
	path := filepath.Join(dir, sum)
	if ok, err := hasHash(path, sum); err != nil || ok {
		return path, err
	}
	a.logf("fetching %s", url)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := a.client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	tmp, err := os.CreateTemp(dir, ".fetch-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(resp.Body, size+1))
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", fmt.Errorf("GET %s: %w", url, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); n != size || got != sum {
		return "", fmt.Errorf("GET %s: got %d bytes of SHA256 %s, the index says %d bytes of %s: refused", url, n, got, size, sum)
	}
	return path, os.Rename(tmp.Name(), path)
}

// hasHash reports whether path exists with the given SHA256 (a cache entry
// that does not match, e.g. cut short, is removed).
func hasHash(path, sum string) (bool, error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return false, err
	}
	if hex.EncodeToString(h.Sum(nil)) == sum {
		return true, nil
	}
	return false, os.Remove(path)
}

func writeAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// readPackages adds the packages of a Packages.gz index, keeping the
// highest version of each name.
func (a *Archive) readPackages(path string, src Source) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return err
	}
	sc := bufio.NewScanner(zr)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	p := &Package{source: src}
	var last *string
	add := func() error {
		if p.Name != "" {
			if p.Filename == "" || p.SHA256 == "" {
				return fmt.Errorf("package %s has no Filename or SHA256", p.Name)
			}
			if old, ok := a.pkgs[p.Name]; !ok || CompareVersions(p.Version, old.Version) > 0 {
				a.pkgs[p.Name] = p
			}
		}
		p = &Package{source: src}
		last = nil
		return nil
	}
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			if err := add(); err != nil {
				return err
			}
			continue
		}
		if line[0] == ' ' || line[0] == '\t' {
			if last != nil {
				*last += " " + strings.TrimSpace(line)
			}
			continue
		}
		k, v, _ := strings.Cut(line, ":")
		v = strings.TrimSpace(v)
		last = nil
		switch k {
		case "Package":
			p.Name = v
		case "Version":
			p.Version = v
		case "Architecture":
			p.Architecture = v
		case "Filename":
			p.Filename = v
		case "SHA256":
			p.SHA256 = v
		case "Size":
			p.Size, _ = strconv.ParseInt(v, 10, 64)
		case "Depends":
			p.Depends, last = v, &p.Depends
		case "Pre-Depends":
			p.PreDepends, last = v, &p.PreDepends
		case "Provides":
			p.Provides, last = v, &p.Provides
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if err := add(); err != nil {
		return err
	}
	a.provides = nil // rebuilt on use
	return nil
}
