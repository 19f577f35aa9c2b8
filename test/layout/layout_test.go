// Package layout checks that CONTRIBUTING.md's "Repository layout" names
// every Go package under internal/, so that the map a newcomer reads first
// cannot silently lose a package (it once lost sourceplacement, the largest
// controller).
package layout

import (
	"bufio"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// entry is one line of the layout: the paths it names (a trailing slash
// each) and what it says about them, continuation lines included.
type entry struct {
	paths []string
	text  string
}

// parseLayout reads the list under the "## Repository layout" heading. An
// entry is a list item that starts with its paths in backquotes, separated
// by commas and ended by a colon ("- `tools/k8s/`, `tools/e2e/`: build
// ..."); a line indented under it continues its text.
func parseLayout(doc string) []entry {
	var out []entry
	in := false
	path := regexp.MustCompile("`([^`]+)`")
	sc := bufio.NewScanner(strings.NewReader(doc))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			in = line == "## Repository layout"
			continue
		}
		if !in {
			continue
		}
		if body, ok := strings.CutPrefix(line, "- `"); ok {
			head, text, ok := strings.Cut("`"+body, "`: ")
			if !ok {
				continue
			}
			var e entry
			for _, m := range path.FindAllStringSubmatch(head+"`", -1) {
				e.paths = append(e.paths, m[1])
			}
			e.text = text
			out = append(out, e)
			continue
		}
		if strings.HasPrefix(line, "  ") && len(out) > 0 {
			out[len(out)-1].text += " " + strings.TrimSpace(line)
		}
	}
	return out
}

// missing returns the packages (module-relative directories) that no entry
// names: neither as a path of its own ("internal/node/") nor, under an
// entry for a directory above it, as a relative path in that entry's text
// ("internal/controller/" saying "nodeloss/").
func missing(layout []entry, pkgs []string) []string {
	var out []string
	for _, pkg := range pkgs {
		if !documented(layout, pkg) {
			out = append(out, pkg)
		}
	}
	return out
}

func documented(layout []entry, pkg string) bool {
	for _, e := range layout {
		for _, p := range e.paths {
			p = strings.TrimSuffix(p, "/")
			if p == pkg {
				return true
			}
			if rel, ok := strings.CutPrefix(pkg, p+"/"); ok {
				if regexp.MustCompile(`(^|[\s,(])` + regexp.QuoteMeta(rel) + `/`).MatchString(e.text) {
					return true
				}
			}
		}
	}
	return false
}

// goPackages returns every directory under dir (module-relative, below
// root) that holds a .go file, as the go tool sees packages: testdata and
// directories starting with "." or "_" are not.
func goPackages(t *testing.T, root, dir string) []string {
	t.Helper()
	var pkgs []string
	err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != filepath.Join(root, dir) && (n == "testdata" || strings.HasPrefix(n, ".") || strings.HasPrefix(n, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".go") {
			rel, err := filepath.Rel(root, filepath.Dir(path))
			if err != nil {
				return err
			}
			if rel = filepath.ToSlash(rel); !slices.Contains(pkgs, rel) {
				pkgs = append(pkgs, rel)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pkgs
}

func TestEveryInternalPackageIsInTheLayout(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(root, "CONTRIBUTING.md"))
	if err != nil {
		t.Fatal(err)
	}
	layout := parseLayout(string(doc))
	if len(layout) == 0 {
		t.Fatal("CONTRIBUTING.md has no \"## Repository layout\" list of entries (- `path`: what it is)")
	}
	pkgs := goPackages(t, root, "internal")
	if len(pkgs) == 0 {
		t.Fatal("no Go package found under internal/")
	}
	for _, pkg := range missing(layout, pkgs) {
		t.Errorf("%s/ is not in CONTRIBUTING.md's repository layout: add a line for it (or name it in its parent's line)", pkg)
	}
	// The other way round: a path the layout names under internal/ exists.
	for _, e := range layout {
		for _, p := range e.paths {
			if !strings.HasPrefix(p, "internal/") {
				continue
			}
			if fi, err := os.Stat(filepath.Join(root, p)); err != nil || !fi.IsDir() {
				t.Errorf("CONTRIBUTING.md's layout names %s, which does not exist", p)
			}
		}
	}
}

// The check can fail: a layout without a package, or naming a sibling
// whose name only starts the same, reports it.
func TestMissingFindsAnUndocumentedPackage(t *testing.T) {
	layout := parseLayout("# x\n\n## Repository layout\n\n" +
		"- `internal/node`: stage and publish\n" +
		"- `internal/controller/`: ephemeral/, nodeloss/ reconcilers\n" +
		"- `tools/k8s/`, `tools/sidecars/`, `tools/e2e/`: build things\n" +
		"  continued\n\n" +
		"## Build\n\n" +
		"- `internal/pool`: not the layout\n")
	got := missing(layout, []string{"internal/node", "internal/pool", "internal/controller/nodeloss",
		"internal/controller/node", "internal/controller/sourceplacement", "tools/e2e"})
	want := []string{"internal/pool", "internal/controller/node", "internal/controller/sourceplacement"}
	if !slices.Equal(got, want) {
		t.Fatalf("missing = %q, want %q", got, want)
	}
}
