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

// The package list of docs/ARCHITECTURE.md is two fenced blocks, each
// after one of these marks: the product's packages in layered order, then
// the packages of tests, probes and tools, which nothing of the product
// imports.
const (
	productMark = "<!-- package-map: product -->"
	supportMark = "<!-- package-map: support -->"
)

// packageMap is the package list of docs/ARCHITECTURE.md.
type packageMap struct {
	// product is in the map's order: each imports only those after it.
	product []string
	support []string
}

// readPackageMap reads the package list at path. Each line of a block is
// one package: its path, then what it does.
func readPackageMap(t *testing.T, path string) packageMap {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		m      packageMap
		list   *[]string // the list the block being read fills
		marked *[]string // the list the next block fills
		in     bool
	)
	pkg := regexp.MustCompile(`^[a-z][\w./-]*$`)
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case strings.TrimSpace(line) == productMark:
			marked = &m.product
		case strings.TrimSpace(line) == supportMark:
			marked = &m.support
		case strings.HasPrefix(line, "```") && in:
			in, list = false, nil
		case strings.HasPrefix(line, "```"):
			in, list, marked = true, marked, nil
		case list != nil && strings.TrimSpace(line) != "":
			// A line that does not start with a package would let a
			// package hide in a description's second line.
			name := strings.Fields(line)[0]
			if line[0] == ' ' || !pkg.MatchString(name) {
				t.Errorf("%s:%d: %q is not a package's line (a package's path, then its job, on one line)", path, n, line)
				continue
			}
			*list = append(*list, name)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(m.product) < 10 || len(m.support) < 3 {
		t.Fatalf("%s: found %d product and %d support packages after %q and %q: the marks or their blocks are gone", path, len(m.product), len(m.support), productMark, supportMark)
	}
	return m
}

// TestPackageMap holds the package list of docs/ARCHITECTURE.md to the
// module, so that the map cannot drift from the code: every package go
// list knows is listed, once; nothing listed is gone; each product package
// imports only product packages listed after it (no arrow runs back up the
// map) and none of the tests' and tools' packages. The README's "Layout of
// the code" table, the short map, must name only directories that exist
// and cover every product package.
func TestPackageMap(t *testing.T) {
	const doc = "docs/ARCHITECTURE.md"
	m := readPackageMap(t, filepath.Join("..", doc))
	rank := make(map[string]int)
	support := make(map[string]bool)
	for i, p := range m.product {
		if _, dup := rank[p]; dup {
			t.Errorf("%s lists %s twice", doc, p)
		}
		rank[p] = i
	}
	for _, p := range m.support {
		if _, dup := rank[p]; dup || support[p] {
			t.Errorf("%s lists %s twice", doc, p)
		}
		support[p] = true
	}

	const mod = "github.com/allocfs/allocfs/"
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, mod+"...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	known := make(map[string]bool)
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		p := strings.TrimPrefix(fields[0], mod)
		known[p] = true
		from, product := rank[p]
		if !product && !support[p] {
			t.Errorf("%s does not list package %s: add a line for it where its imports put it", doc, p)
			continue
		}
		if !product {
			continue
		}
		for _, imp := range fields[1:] {
			d, ours := strings.CutPrefix(imp, mod)
			if !ours {
				continue
			}
			to, listed := rank[d]
			switch {
			case support[d]:
				t.Errorf("%s imports %s, which %s lists with the tests and tools", p, d, doc)
			case listed && to <= from:
				t.Errorf("%s imports %s, which %s lists before it", p, d, doc)
			}
		}
	}
	for _, p := range append(m.product, m.support...) {
		if !known[p] {
			t.Errorf("%s lists %s, which go list does not know", doc, p)
		}
	}

	t.Run("README", func(t *testing.T) {
		names := readmeLayout(t, filepath.Join("..", "README.md"))
		for _, n := range names {
			if fi, err := os.Stat(filepath.Join("..", strings.TrimSuffix(n, "/*"))); err != nil || !fi.IsDir() {
				t.Errorf("README's layout names %s, which is not a directory of the module", n)
			}
		}
	product:
		for _, p := range m.product {
			for _, n := range names {
				if n == p || strings.HasSuffix(n, "/*") && strings.HasPrefix(p, strings.TrimSuffix(n, "*")) {
					continue product
				}
			}
			t.Errorf("README's layout does not name package %s (nor a dir/* above it)", p)
		}
	})
}

// readmeLayout returns what the first column of the README's "Layout of
// the code" table names, a directory or a dir/* each.
func readmeLayout(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Layout of the code\n")
	if !ok {
		t.Fatalf("%s has no \"Layout of the code\" section", path)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	code := regexp.MustCompile("`([^`]+)`")
	var names []string
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 3 || strings.Trim(cells[1], " -") == "" || strings.TrimSpace(cells[1]) == "package" {
			continue
		}
		for _, c := range code.FindAllStringSubmatch(cells[1], -1) {
			names = append(names, c[1])
		}
	}
	if len(names) < 10 {
		t.Fatalf("%s: found %d names in the layout table; the table or its parser is broken: %v", path, len(names), names)
	}
	return names
}
