package docs

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// The documents whose links are checked, relative to the repository root.
func documents(t *testing.T, root string) []string {
	t.Helper()
	files := []string{"README.md", "CONTRIBUTING.md", "CHANGELOG.md"}
	for _, pattern := range []string{"docs/*.md", "docs/*/*.md"} {
		m, err := filepath.Glob(filepath.Join(root, pattern))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range m {
			rel, err := filepath.Rel(root, f)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, rel)
		}
	}
	return files
}

func TestRelativeLinksResolve(t *testing.T) {
	root := filepath.Join("..", "..")
	files := documents(t, root)
	if len(files) < 10 {
		t.Fatalf("found only %d documents under %s: is the test running in internal/docs?", len(files), root)
	}
	checked := 0
	for _, f := range files {
		problems, n := brokenLinks(root, f)
		for _, problem := range problems {
			t.Error(problem)
		}
		checked += n
	}
	// The docs link to each other far more than this: fewer means the
	// parser stopped seeing links, and the test would pass on anything.
	if checked < 50 {
		t.Errorf("checked only %d relative links", checked)
	}
}

// The checker itself must catch what it is there for: a missing file, a
// missing heading, in the same file and in another, and not be fooled by
// code.
func TestBrokenLinksAreFound(t *testing.T) {
	root := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("docs/b.md", "# B\n\n## Generic ephemeral (`volumes[].ephemeral`)\n\n## Twice\n\n## Twice\n\n```\n## Not a heading\n```\n")
	write("README.md", strings.Join([]string{
		"[ok](docs/b.md) [ok](docs/b.md#generic-ephemeral-volumesephemeral) [ok](docs/b.md#twice-1)",
		"[ok](#readme) [ok](docs/) [ok](https://example.org/x.md) [ok](docs/b.md \"title\")",
		"`[in code](nowhere.md)`",
		"[gone](docs/c.md) [no heading](docs/b.md#nope) [fenced](docs/b.md#not-a-heading) [self](#nope)",
		"# Readme",
		"```",
		"[in a fence](nowhere.md)",
		"```",
	}, "\n"))
	got, checked := brokenLinks(root, "README.md")
	if checked != 10 {
		t.Errorf("checked %d relative links, want 10", checked)
	}
	want := []string{"docs/c.md", "docs/b.md#nope", "docs/b.md#not-a-heading", "#nope"}
	if len(got) != len(want) {
		t.Fatalf("found %d broken links, want %d: %q", len(got), len(want), got)
	}
	for i, w := range want {
		if !strings.Contains(got[i], "("+w+")") {
			t.Errorf("problem %d is %q, want one about %s", i, got[i], w)
		}
	}
}

var (
	// [text](target) and [text](target "title"); images too. The text may
	// hold brackets of its own one level deep.
	inlineLink = regexp.MustCompile(`\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(([^()\s]+)(?:\s+"[^"]*")?\)`)
	// [label]: target
	referenceDef = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s+(\S+)`)
	codeSpan     = regexp.MustCompile("`+[^`]*`+")
	heading      = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	scheme       = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
)

// brokenLinks reports each relative link of file (relative to root) whose
// target file or heading does not exist, as "file:line: (target) ...", and
// how many relative links it checked.
func brokenLinks(root, file string) (problems []string, checked int) {
	text, err := os.ReadFile(filepath.Join(root, file))
	if err != nil {
		return []string{err.Error()}, 0
	}
	for _, l := range prose(string(text)) {
		var targets []string
		for _, m := range inlineLink.FindAllStringSubmatch(codeSpan.ReplaceAllString(l.text, ""), -1) {
			targets = append(targets, m[1])
		}
		if m := referenceDef.FindStringSubmatch(l.text); m != nil {
			targets = append(targets, m[1])
		}
		for _, target := range targets {
			if scheme.MatchString(target) {
				continue
			}
			checked++
			if why := resolve(root, file, target); why != "" {
				problems = append(problems, fmt.Sprintf("%s:%d: (%s) %s", file, l.n, target, why))
			}
		}
	}
	return problems, checked
}

// resolve says why target, linked from file, does not resolve ("" if it does).
func resolve(root, file, target string) string {
	path, fragment, _ := strings.Cut(target, "#")
	dest := file
	if path != "" {
		dest = filepath.Join(filepath.Dir(file), filepath.FromSlash(path))
	}
	st, err := os.Stat(filepath.Join(root, dest))
	if err != nil {
		return fmt.Sprintf("no such file: %s", dest)
	}
	if fragment == "" {
		return ""
	}
	if st.IsDir() || !strings.HasSuffix(dest, ".md") {
		return fmt.Sprintf("a #fragment into %s, which is not a markdown file", dest)
	}
	text, err := os.ReadFile(filepath.Join(root, dest))
	if err != nil {
		return err.Error()
	}
	for _, a := range anchors(string(text)) {
		if a == fragment {
			return ""
		}
	}
	return fmt.Sprintf("%s has no heading whose anchor is #%s", dest, fragment)
}

type line struct {
	n    int
	text string
}

// prose is the document's lines outside fenced code blocks.
func prose(text string) []line {
	var out []line
	fence := ""
	for i, l := range strings.Split(text, "\n") {
		trimmed := strings.TrimLeft(l, " ")
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			continue
		}
		out = append(out, line{i + 1, l})
	}
	return out
}

// anchors are the fragments GitHub gives the document's headings: the text
// without markup, lower-cased, punctuation dropped, spaces as hyphens, and
// -1, -2... after a repeated one.
func anchors(text string) []string {
	seen := map[string]int{}
	var out []string
	for _, l := range prose(text) {
		m := heading.FindStringSubmatch(l.text)
		if m == nil {
			continue
		}
		s := inlineLink.ReplaceAllStringFunc(m[1], func(link string) string {
			return link[1:strings.LastIndex(link, "](")]
		})
		var b strings.Builder
		for _, r := range strings.ToLower(s) {
			switch {
			case unicode.IsLetter(r), unicode.IsDigit(r), r == '_', r == '-':
				b.WriteRune(r)
			case r == ' ':
				b.WriteRune('-')
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out = append(out, fmt.Sprintf("%s-%d", a, n))
		} else {
			out = append(out, a)
		}
		seen[a]++
	}
	return out
}
