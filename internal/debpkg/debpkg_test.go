package debpkg

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestCompareVersions(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want int
	}{
		{"1.0", "1.0", 0},
		{"1.0", "1.1", -1},
		{"1.10", "1.9", 1},
		{"1:1.0", "2.0", 1},
		{"1.0~rc1", "1.0", -1},
		{"1.0", "1.0+b1", -1},
		{"2.36-9+deb12u10", "2.36-9+deb12u9", 1},
		{"252.39-1~deb12u2", "252.39-1", -1},
		{"1.47.0-2+b2", "1.47.0-2", 1},
		{"1.0a", "1.0-", 1},
		{"0:1.0", "1.0", 0},
		{"1.0-1", "1.0-1.1", -1},
	} {
		if got := CompareVersions(c.a, c.b); sign(got) != c.want {
			t.Errorf("CompareVersions(%q, %q) = %d, want %d", c.a, c.b, got, c.want)
		}
		if got := CompareVersions(c.b, c.a); sign(got) != -c.want {
			t.Errorf("CompareVersions(%q, %q) = %d, want %d", c.b, c.a, got, -c.want)
		}
	}
}

func sign(i int) int {
	switch {
	case i < 0:
		return -1
	case i > 0:
		return 1
	}
	return 0
}

func TestSplitDeps(t *testing.T) {
	got := splitDeps("libc6 (>= 2.34), python3:any, libfoo1 | libbar1 (<< 2~), ")
	want := []clause{
		{{name: "libc6", op: ">=", version: "2.34"}},
		{{name: "python3"}},
		{{name: "libfoo1"}, {name: "libbar1", op: "<<", version: "2~"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("splitDeps = %+v, want %+v", got, want)
	}
}

func TestResolve(t *testing.T) {
	pkg := func(name, version, deps, provides string) *Package {
		return &Package{Name: name, Version: version, Depends: deps, Provides: provides}
	}
	a := &Archive{Arch: "arm64", pkgs: map[string]*Package{}}
	for _, p := range []*Package{
		pkg("e2fsprogs", "1.47", "libc6 (>= 2.34), libext2fs2 | libext2fs-old, logsave", ""),
		pkg("libc6", "2.36", "libgcc-s1", ""),
		pkg("libgcc-s1", "12", "", ""),
		pkg("libext2fs2", "1.47", "libc6", ""),
		pkg("libext2fs-old", "1.0", "", ""),
		pkg("logsave", "1.47", "python3, awk", ""),
		pkg("mawk", "1.3", "", "awk"),
		pkg("python3", "3.11", "", ""),
	} {
		a.pkgs[p.Name] = p
	}
	got, err := a.Resolve([]string{"e2fsprogs"}, map[string]bool{"python3": true})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range got {
		names = append(names, p.Name)
	}
	if want := "e2fsprogs libc6 libext2fs2 libgcc-s1 logsave mawk"; strings.Join(names, " ") != want {
		t.Errorf("Resolve = %s, want %s", strings.Join(names, " "), want)
	}

	a.pkgs["libc6"].Version = "2.31"
	a.provides = nil
	if _, err := a.Resolve([]string{"e2fsprogs"}, nil); err == nil || !strings.Contains(err.Error(), "libc6 (>= 2.34)") {
		t.Errorf("an unsatisfiable version: err %v, want one naming libc6 (>= 2.34)", err)
	}
	if _, err := a.Resolve([]string{"xfsprogs"}, nil); err == nil || !strings.Contains(err.Error(), "xfsprogs") {
		t.Errorf("a missing package: err %v", err)
	}
}

func TestReadSources(t *testing.T) {
	root := t.TempDir()
	write := func(p, s string) {
		p = filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("etc/apt/sources.list", "# a comment\ndeb [arch=amd64 signed-by=/k/one.gpg] http://mirror.invalid/debian/ bookworm main contrib\ndeb-src http://mirror.invalid/debian bookworm main\n")
	write("etc/apt/sources.list.d/a.sources", "Types: deb deb-src\nURIs: http://a.invalid/debian\nSuites: bookworm bookworm-updates\nComponents: main\nSigned-By: /k/two.gpg\n\nTypes: deb\nURIs: http://b.invalid/x\nSuites: s\nComponents: main\nEnabled: no\nSigned-By: /k/two.gpg\n")
	write("etc/apt/sources.list.d/c.sources.disabled", "Types: deb\nURIs: http://c.invalid/x\nSuites: s\nComponents: main\n")
	write("etc/apt/trusted.gpg.d/t.gpg", "")
	write("etc/apt/sources.list.d/d.list", "deb http://d.invalid/x s main\n")
	got, err := ReadSources(root)
	if err != nil {
		t.Fatal(err)
	}
	want := []Source{
		{URI: "http://mirror.invalid/debian", Suite: "bookworm", Components: []string{"main", "contrib"}, Keyrings: []string{filepath.Join(root, "k/one.gpg")}},
		{URI: "http://a.invalid/debian", Suite: "bookworm", Components: []string{"main"}, Keyrings: []string{filepath.Join(root, "k/two.gpg")}},
		{URI: "http://a.invalid/debian", Suite: "bookworm-updates", Components: []string{"main"}, Keyrings: []string{filepath.Join(root, "k/two.gpg")}},
		{URI: "http://d.invalid/x", Suite: "s", Components: []string{"main"}, Keyrings: []string{filepath.Join(root, "etc/apt/trusted.gpg.d/t.gpg")}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ReadSources =\n%+v\nwant\n%+v", got, want)
	}
}
