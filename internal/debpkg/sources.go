// Package debpkg takes Debian packages from the archive this machine's apt
// uses, for any architecture: the signed Release file checked with gpgv
// against the source's keyring, the Packages index checked against it, each
// .deb checked against the index and cached by its hash. It is how podvol's
// images get the disk tools of another architecture than the host's, with
// no Docker and no host name written anywhere: the archive comes from
// /etc/apt at run time.
package debpkg

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Source is one suite of an apt source: where it is and which keyring signs
// its Release file.
type Source struct {
	URI        string
	Suite      string
	Components []string
	// Keyrings verify the suite's InRelease: its Signed-By, else the
	// machine's trusted keyrings, as apt does.
	Keyrings []string
}

func (s Source) String() string { return s.URI + " " + s.Suite }

// ReadSources returns the "deb" sources apt is configured with under root
// ("/" for this machine): sources.list and sources.list.d's *.list (one-line
// form) and *.sources (deb822) files. Files of other names are ignored, as
// apt ignores them, and so are sources with Enabled: no.
func ReadSources(root string) ([]Source, error) {
	etc := filepath.Join(root, "etc", "apt")
	files := []string{filepath.Join(etc, "sources.list")}
	ents, err := os.ReadDir(filepath.Join(etc, "sources.list.d"))
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	for _, n := range names {
		files = append(files, filepath.Join(etc, "sources.list.d", n))
	}
	trusted, err := trustedKeyrings(root)
	if err != nil {
		return nil, err
	}
	var out []Source
	for _, f := range files {
		var srcs []Source
		var err error
		switch {
		case strings.HasSuffix(f, ".list"):
			srcs, err = readOneLine(f, root, trusted)
		case strings.HasSuffix(f, ".sources"):
			srcs, err = readDeb822(f, root, trusted)
		default:
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("apt source %s: %w", f, err)
		}
		out = append(out, srcs...)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no deb source in %s: configure apt (sources.list or sources.list.d) with a Debian archive", etc)
	}
	return out, nil
}

func trustedKeyrings(root string) ([]string, error) {
	var out []string
	if _, err := os.Stat(filepath.Join(root, "etc/apt/trusted.gpg")); err == nil {
		out = append(out, filepath.Join(root, "etc/apt/trusted.gpg"))
	}
	m, err := filepath.Glob(filepath.Join(root, "etc/apt/trusted.gpg.d/*.gpg"))
	if err != nil {
		return nil, err
	}
	return append(out, m...), nil
}

func keyrings(signedBy, root string, trusted []string) ([]string, error) {
	if signedBy == "" {
		if len(trusted) == 0 {
			return nil, fmt.Errorf("no Signed-By and no keyring in /etc/apt/trusted.gpg.d: nothing to check its Release file with")
		}
		return trusted, nil
	}
	if strings.Contains(signedBy, "BEGIN PGP") {
		return nil, fmt.Errorf("an inline Signed-By key is not supported: point Signed-By at a keyring file")
	}
	var out []string
	for _, k := range strings.Fields(strings.ReplaceAll(signedBy, ",", " ")) {
		if !strings.HasPrefix(k, "/") {
			return nil, fmt.Errorf("Signed-By %q: a fingerprint is not supported, name a keyring file", k)
		}
		out = append(out, filepath.Join(root, k))
	}
	return out, nil
}

// readOneLine reads "deb [opts] uri suite comp..." lines.
func readOneLine(path, root string, trusted []string) ([]Source, error) {
	f, err := os.Open(path)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil
		}
		return nil, err
	}
	defer f.Close()
	var out []Source
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		fields := strings.Fields(line)
		if len(fields) == 0 || fields[0] != "deb" {
			continue
		}
		fields = fields[1:]
		signedBy := ""
		if len(fields) > 0 && strings.HasPrefix(fields[0], "[") {
			var opts []string
			for len(fields) > 0 {
				o := fields[0]
				fields = fields[1:]
				opts = append(opts, strings.Trim(o, "[]"))
				if strings.HasSuffix(o, "]") {
					break
				}
			}
			for _, o := range opts {
				if v, ok := strings.CutPrefix(o, "signed-by="); ok {
					signedBy = v
				}
			}
		}
		if len(fields) < 3 {
			continue // a flat repository ("uri path/"): not a Debian archive
		}
		keys, err := keyrings(signedBy, root, trusted)
		if err != nil {
			return nil, err
		}
		out = append(out, Source{URI: strings.TrimSuffix(fields[0], "/"), Suite: fields[1], Components: fields[2:], Keyrings: keys})
	}
	return out, sc.Err()
}

// readDeb822 reads stanzas of Types, URIs, Suites, Components, Signed-By,
// Enabled.
func readDeb822(path, root string, trusted []string) ([]Source, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []Source
	for _, st := range parseStanzas(string(b)) {
		if strings.EqualFold(st["enabled"], "no") || !contains(strings.Fields(st["types"]), "deb") {
			continue
		}
		keys, err := keyrings(strings.TrimSpace(st["signed-by"]), root, trusted)
		if err != nil {
			return nil, err
		}
		for _, uri := range strings.Fields(st["uris"]) {
			for _, suite := range strings.Fields(st["suites"]) {
				comps := strings.Fields(st["components"])
				if len(comps) == 0 {
					continue // a flat repository
				}
				out = append(out, Source{URI: strings.TrimSuffix(uri, "/"), Suite: suite, Components: comps, Keyrings: keys})
			}
		}
	}
	return out, nil
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

// parseStanzas parses RFC 822-style stanzas (apt's sources, Release,
// Packages): keys lower-cased, continuation lines joined with "\n", comment
// lines dropped.
func parseStanzas(text string) []map[string]string {
	var out []map[string]string
	cur := map[string]string{}
	key := ""
	flush := func() {
		if len(cur) > 0 {
			out = append(out, cur)
		}
		cur = map[string]string{}
		key = ""
	}
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimRight(line, "\r")
		switch {
		case strings.TrimSpace(line) == "":
			flush()
		case strings.HasPrefix(line, "#"):
		case line[0] == ' ' || line[0] == '\t':
			if key != "" {
				cur[key] += "\n" + strings.TrimSpace(line)
			}
		default:
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			key = strings.ToLower(strings.TrimSpace(k))
			cur[key] = strings.TrimSpace(v)
		}
	}
	flush()
	return out
}
