package fs

import (
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// TestFilesFormNoCircle holds the package to the layering doc.go states:
// a file uses only what files below it declare, so that no two files use
// each other, however far round. It type-checks the package's non-test
// files from source and follows every use of a package-level name, a
// method or a field to the file that declares it.
func TestFilesFormNoCircle(t *testing.T) {
	uses, err := fileUses(".")
	if err != nil {
		t.Fatal(err)
	}
	if len(uses) < 5 {
		t.Fatalf("found uses between %d files only: the package was not read whole", len(uses))
	}
	if circle := findCircle(uses); circle != nil {
		var steps []string
		for i := 0; i+1 < len(circle); i++ {
			steps = append(steps, fmt.Sprintf("%s -> %s (%s)", circle[i], circle[i+1], strings.Join(uses[circle[i]][circle[i+1]], ", ")))
		}
		t.Errorf("the package's files form a circle:\n  %s", strings.Join(steps, "\n  "))
	}
}

// TestFindCircle checks the search itself on graphs with and without a
// circle.
func TestFindCircle(t *testing.T) {
	line := map[string]map[string][]string{"a": {"b": {"x"}}, "b": {"c": {"y"}}}
	if c := findCircle(line); c != nil {
		t.Errorf("a line: got circle %v, want none", c)
	}
	round := map[string]map[string][]string{"a": {"b": {"x"}}, "b": {"c": {"y"}}, "c": {"a": {"z"}}}
	c := findCircle(round)
	if len(c) != 4 || c[0] != c[3] {
		t.Errorf("a -> b -> c -> a: got %v, want the three files and the first again", c)
	}
}

// fileUses returns, for each non-test file of the package in dir, the
// files whose declarations it uses and the names it uses of each.
func fileUses(dir string) (map[string]map[string][]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, 0)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	conf := types.Config{Importer: importer.ForCompiler(fset, "source", nil)}
	info := &types.Info{Uses: make(map[*ast.Ident]types.Object)}
	pkg, err := conf.Check("github.com/allocfs/allocfs/fs", fset, files, info)
	if err != nil {
		return nil, fmt.Errorf("type-check: %w", err)
	}
	file := func(p token.Pos) string { return filepath.Base(fset.Position(p).Filename) }
	seen := make(map[string]map[string]map[string]bool)
	for id, obj := range info.Uses {
		if obj.Pkg() != pkg || !obj.Pos().IsValid() {
			continue
		}
		switch o := obj.(type) {
		case *types.PkgName, *types.Label:
			continue
		case *types.Var:
			if !o.IsField() && o.Parent() != pkg.Scope() {
				continue // a local variable or a parameter
			}
		case *types.Func:
		default:
			if o.Parent() != pkg.Scope() {
				continue // a local type or constant
			}
		}
		from, to := file(id.Pos()), file(obj.Pos())
		if from == to {
			continue
		}
		if seen[from] == nil {
			seen[from] = make(map[string]map[string]bool)
		}
		if seen[from][to] == nil {
			seen[from][to] = make(map[string]bool)
		}
		seen[from][to][obj.Name()] = true
	}
	uses := make(map[string]map[string][]string)
	for from, tos := range seen {
		uses[from] = make(map[string][]string)
		for to, names := range tos {
			for n := range names {
				uses[from][to] = append(uses[from][to], n)
			}
			sort.Strings(uses[from][to])
		}
	}
	return uses, nil
}

// findCircle returns a circle of uses, from a file round to it again, or
// nil when there is none.
func findCircle(uses map[string]map[string][]string) []string {
	const (
		unseen = iota
		onPath
		done
	)
	state := make(map[string]int)
	var path []string
	var visit func(f string) []string
	visit = func(f string) []string {
		state[f] = onPath
		path = append(path, f)
		next := make([]string, 0, len(uses[f]))
		for to := range uses[f] {
			next = append(next, to)
		}
		sort.Strings(next)
		for _, to := range next {
			switch state[to] {
			case onPath:
				for i, p := range path {
					if p == to {
						return append(append([]string(nil), path[i:]...), to)
					}
				}
			case unseen:
				if c := visit(to); c != nil {
					return c
				}
			}
		}
		path = path[:len(path)-1]
		state[f] = done
		return nil
	}
	froms := make([]string, 0, len(uses))
	for f := range uses {
		froms = append(froms, f)
	}
	sort.Strings(froms)
	for _, f := range froms {
		if state[f] == unseen {
			if c := visit(f); c != nil {
				return c
			}
		}
	}
	return nil
}
