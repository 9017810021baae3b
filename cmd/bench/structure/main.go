// Command structure measures the shape of this module's Go code, so that a
// change to its layering shows as numbers: for the root package its
// non-test lines and files, exported identifiers and interfaces, the
// length of `go doc -short`, functions with 7 or more parameters or 4 or
// more results, and functions whose cyclomatic complexity is over 20 and
// over 30 (counted as gocyclo counts: 1 plus each if, for, range, case,
// comm clause, && and ||); for every package, the share of test files
// named after a source file (X_test.go beside X.go; examples excluded);
// and the import graph between the module's packages.
//
// Usage, from the repository root:
//
//	go run ./cmd/bench/structure [-dir .]
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	dir := flag.String("dir", ".", "the repository root")
	flag.Parse()
	if err := run(*dir); err != nil {
		fmt.Fprintln(os.Stderr, "structure:", err)
		os.Exit(1)
	}
}

// measures are one package's figures.
type measures struct {
	files, lines            int
	exported, interfaces    int
	params7, results4       int
	cyclo20, cyclo30, funcs int
	tests, testsMatched     int
	overTwenty              []string
}

func run(dir string) error {
	root, err := measure(dir)
	if err != nil {
		return err
	}
	doc, err := exec.Command("go", "doc", "-short", ".").Output()
	if err != nil {
		return fmt.Errorf("go doc: %w", err)
	}
	fmt.Printf("root package: %d files, %d non-test lines\n", root.files, root.lines)
	fmt.Printf("root exported identifiers: %d (interfaces declared: %d); go doc -short: %d lines\n",
		root.exported, root.interfaces, strings.Count(string(doc), "\n"))
	fmt.Printf("root functions with >= 7 parameters: %d, >= 4 results: %d\n", root.params7, root.results4)
	fmt.Printf("root functions over complexity 20: %d (%.2f per 1,000 lines), over 30: %d\n",
		root.cyclo20, 1000*float64(root.cyclo20)/float64(max(root.lines, 1)), root.cyclo30)
	for _, f := range root.overTwenty {
		fmt.Println("  ", f)
	}
	pkgs, err := packageDirs(dir)
	if err != nil {
		return err
	}
	fmt.Println("test files named after a source file, per package:")
	all, matched := 0, 0
	for _, p := range pkgs {
		m, err := measure(p)
		if err != nil {
			return err
		}
		if m.tests == 0 {
			continue
		}
		all, matched = all+m.tests, matched+m.testsMatched
		fmt.Printf("  %-40s %3d of %3d\n", p, m.testsMatched, m.tests)
	}
	fmt.Printf("  all: %d of %d (%.0f%%)\n", matched, all, 100*float64(matched)/float64(max(all, 1)))
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}: {{join .Imports " "}}`, "./...").Output()
	if err != nil {
		return fmt.Errorf("go list: %w", err)
	}
	fmt.Println("imports between the module's packages:")
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, imps, _ := strings.Cut(line, ": ")
		var own []string
		for _, i := range strings.Fields(imps) {
			if strings.HasPrefix(i, "github.com/pgbackfill/backfill") {
				own = append(own, short(i))
			}
		}
		fmt.Printf("  %s -> %s\n", short(path), strings.Join(own, " "))
	}
	return nil
}

func short(p string) string {
	s := strings.TrimPrefix(p, "github.com/pgbackfill/backfill")
	if s == "" {
		return "backfill"
	}
	return strings.TrimPrefix(s, "/")
}

// packageDirs lists the directories of the core module that hold Go
// files, skipping modules of their own (a go.mod below the root).
func packageDirs(root string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if p != root {
			if strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
				return filepath.SkipDir
			}
		}
		if m, _ := filepath.Glob(filepath.Join(p, "*.go")); len(m) > 0 {
			out = append(out, p)
		}
		return nil
	})
	sort.Strings(out)
	return out, err
}

// measure parses the Go files of one directory.
func measure(dir string) (measures, error) {
	var m measures
	fset := token.NewFileSet()
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return m, err
	}
	sources := map[string]bool{}
	for _, n := range names {
		if !strings.HasSuffix(n, "_test.go") {
			sources[strings.TrimSuffix(filepath.Base(n), ".go")] = true
		}
	}
	for _, n := range names {
		base := filepath.Base(n)
		if strings.HasSuffix(base, "_test.go") {
			if strings.HasPrefix(base, "example_") || base == "example_test.go" {
				continue
			}
			m.tests++
			if sources[strings.TrimSuffix(base, "_test.go")] {
				m.testsMatched++
			}
			continue
		}
		b, err := os.ReadFile(n)
		if err != nil {
			return m, err
		}
		m.files++
		m.lines += strings.Count(string(b), "\n")
		f, err := parser.ParseFile(fset, n, b, 0)
		if err != nil {
			return m, err
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				m.funcs++
				if fields(d.Type.Params) >= 7 {
					m.params7++
				}
				if fields(d.Type.Results) >= 4 {
					m.results4++
				}
				if c := complexity(d); c > 20 {
					m.cyclo20++
					m.overTwenty = append(m.overTwenty, fmt.Sprintf("%d %s %s", c, d.Name.Name, fset.Position(d.Pos())))
					if c > 30 {
						m.cyclo30++
					}
				}
				if d.Name.IsExported() && exportedRecv(d) {
					m.exported++
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						if s.Name.IsExported() {
							m.exported++
							if _, ok := s.Type.(*ast.InterfaceType); ok {
								m.interfaces++
							}
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if n.IsExported() {
								m.exported++
							}
						}
					}
				}
			}
		}
	}
	return m, nil
}

func fields(l *ast.FieldList) int {
	if l == nil {
		return 0
	}
	n := 0
	for _, f := range l.List {
		n += max(1, len(f.Names))
	}
	return n
}

// exportedRecv reports whether a method's receiver type is exported (a
// function has none).
func exportedRecv(d *ast.FuncDecl) bool {
	if d.Recv == nil || len(d.Recv.List) == 0 {
		return true
	}
	t := d.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	if ix, ok := t.(*ast.IndexExpr); ok {
		t = ix.X
	}
	id, ok := t.(*ast.Ident)
	return ok && id.IsExported()
}

// complexity is the cyclomatic complexity of a function as gocyclo
// counts it.
func complexity(fn *ast.FuncDecl) int {
	c := 1
	ast.Inspect(fn, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.IfStmt, *ast.ForStmt, *ast.RangeStmt:
			c++
		case *ast.CaseClause:
			if n.List != nil {
				c++
			}
		case *ast.CommClause:
			if n.Comm != nil {
				c++
			}
		case *ast.BinaryExpr:
			if n.Op == token.LAND || n.Op == token.LOR {
				c++
			}
		}
		return true
	})
	return c
}
