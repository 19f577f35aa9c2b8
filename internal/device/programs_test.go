package device

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"testing"
)

// TestProgramsListsEveryProgramRun checks that every program this package
// runs is in Programs, the list the plugin image is built from, so that a new
// tool cannot be missing from the image.
func TestProgramsListsEveryProgramRun(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	calls := 0
	for _, f := range files {
		if filepath.Ext(f) != ".go" || len(f) > 8 && f[len(f)-8:] == "_test.go" {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(af, func(n ast.Node) bool {
			c, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			if id, ok := c.Fun.(*ast.Ident); !ok || id.Name != "run" || len(c.Args) < 2 {
				return true
			}
			lit, ok := c.Args[1].(*ast.BasicLit)
			if !ok {
				t.Errorf("%s: run's program is not a literal: list it in Programs and name it literally", fset.Position(c.Pos()))
				return true
			}
			name, _ := strconv.Unquote(lit.Value)
			calls++
			if _, ok := program(name); !ok {
				t.Errorf("%s: runs %s, which is not in Programs", fset.Position(c.Pos()), name)
			}
			return true
		})
	}
	if calls == 0 {
		t.Fatal("found no call of run: the test no longer sees how programs are run")
	}
}
