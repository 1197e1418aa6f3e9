package integration

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestPackageMap holds docs/design/packages.md to what it claims: every
// package it lists imports only packages listed after it (internal/...
// last), so that no arrow runs back up, and none it does not list, so
// that a new package cannot hide from the map. It reads the imports with
// go list.
func TestPackageMap(t *testing.T) {
	f, err := os.Open(filepath.Join("..", "docs", "design", "packages.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	row := regexp.MustCompile(`^\s*([a-z][\w./]*)\s{2,}\S`)
	pos := make(map[string]int)
	in := false
	for sc := bufio.NewScanner(f); sc.Scan(); {
		line := sc.Text()
		if strings.HasPrefix(line, "```") {
			if in {
				break
			}
			in = true
			continue
		}
		if m := row.FindStringSubmatch(line); in && m != nil && m[1] != "internal/..." {
			pos[m[1]] = len(pos)
		}
	}
	if len(pos) < 10 {
		t.Fatalf("found %d packages in the map, want its whole list: %v", len(pos), pos)
	}
	rank := func(p string) (int, bool) {
		if strings.HasPrefix(p, "internal/") {
			return len(pos), true
		}
		r, ok := pos[p]
		return r, ok
	}
	const mod = "github.com/allocfs/allocfs/"
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, mod+"...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		p := strings.TrimPrefix(fields[0], mod)
		from, ok := rank(p)
		if !ok || strings.HasPrefix(p, "internal/") {
			continue
		}
		for _, imp := range fields[1:] {
			d, found := strings.CutPrefix(imp, mod)
			if !found {
				continue
			}
			to, ok := rank(d)
			switch {
			case !ok:
				t.Errorf("%s imports %s, which docs/design/packages.md does not list", p, d)
			case to <= from:
				t.Errorf("%s imports %s, which docs/design/packages.md lists before it", p, d)
			}
		}
	}
	for p := range pos {
		if _, err := os.Stat(filepath.Join("..", p)); err != nil {
			t.Errorf("docs/design/packages.md lists %s, which is not a directory of the module: %v", p, err)
		}
	}
}
