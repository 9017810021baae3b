package backfill_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// The README's Go snippets are type-checked against the code of this
// checkout, so that a renamed or moved name breaks a test, not a reader's
// copy of the README.
//
// Every ```go block of README.md is checked, in one of three ways:
//
//   - a block whose first line of code is a package clause is a whole file,
//     checked as it is;
//   - a block of top-level declarations (func, type, var, const) is checked
//     at package level;
//   - any other block is a fragment of statements, checked as the body of
//     a function.
//
// Blocks that are not whole files may name, without importing them, the
// packages of readmeImports (the library's public packages and the common
// standard ones), and may use the variables the README assumes
// (readmePlaceholders: ctx, db, job, runner, ...) without declaring them.
// "declared and not used" is not an error in them: fragments show a value
// without always using it.
//
// A block the test must skip is marked by the line before its fence
// (blank lines between allowed):
//
//	<!-- not compiled: the reason -->
//
// Use it for text that is not Go. No snippet may import an internal
// package: users cannot.
//
// Snippets are type-checked in this process (go/types) against the export
// data of their imports, which one `go list -export` per module builds (or
// finds in the build cache); no database is needed.

// readmeModule is the module path of this repository's root module.
const readmeModule = "github.com/pgbackfill/backfill"

// readmeNotCompiled is the marker of a block the test skips, with its
// reason.
var readmeNotCompiled = regexp.MustCompile(`^<!--\s*not compiled:\s*(\S.*?)\s*-->$`)

// readmeImports are the packages a README fragment may name without an
// import, by the name it uses.
var readmeImports = map[string]string{
	"backfill":         readmeModule,
	"backfilltest":     readmeModule + "/backfilltest",
	"backfillthrottle": readmeModule + "/backfillthrottle",
	"backfilltrace":    readmeModule + "/backfilltrace",
	"backfilldriver":   readmeModule + "/backfilldriver",
	"report":           readmeModule + "/contrib/report",

	"sqlx":    "github.com/jmoiron/sqlx",
	"require": "github.com/stretchr/testify/require",

	"context": "context",
	"sql":     "database/sql",
	"errors":  "errors",
	"fmt":     "fmt",
	"io":      "io",
	"json":    "encoding/json",
	"log":     "log",
	"math":    "math",
	"os":      "os",
	"signal":  "os/signal",
	"slog":    "log/slog",
	"strings": "strings",
	"sync":    "sync",
	"syscall": "syscall",
	"testing": "testing",
	"time":    "time",
}

// readmePlaceholder is a variable the README assumes: its declaration,
// and the packages (names of readmeImports) the declaration needs.
type readmePlaceholder struct {
	decl string
	uses []string
}

// readmePlaceholders are the variables the README's fragments use without
// declaring them, as a reader's program would have them.
var readmePlaceholders = map[string]readmePlaceholder{
	"ctx":           {"ctx context.Context", []string{"context"}},
	"db":            {"db *sqlx.DB", []string{"sqlx"}},
	"src":           {"src *sql.DB // the source an extractor reads", []string{"sql"}},
	"job":           {"job backfill.Job", []string{"backfill"}},
	"runner":        {"runner *backfill.Runner", []string{"backfill"}},
	"r":             {"r *backfill.Runner", []string{"backfill"}},
	"manifest":      {"manifest *backfill.PGManifest", []string{"backfill"}},
	"batchID":       {"batchID int64", nil},
	"f":             {"f io.Writer", []string{"io"}},
	"start":         {"start time.Time", []string{"time"}},
	"end":           {"end time.Time", []string{"time"}},
	"ny":            {"ny *time.Location", []string{"time"}},
	"buildRevision": {"buildRevision string", nil},
	"extractOrders": {"extractOrders func(context.Context, backfill.Chunk, backfill.RowWriter) error", []string{"context", "backfill"}},
	"orderJob":      {"orderJob func() backfill.Job", []string{"backfill"}},
	"airportsJob":   {"airportsJob backfill.Job", []string{"backfill"}},
	"flightsJob":    {"flightsJob backfill.Job", []string{"backfill"}},
	"statsJob":      {"statsJob backfill.Job", []string{"backfill"}},
}

// readmeSnippet is one ```go block of a README.
type readmeSnippet struct {
	line int    // line of the block's first line of code (1-based)
	code string // the block's lines, as written (indentation kept)
	skip string // the reason of a <!-- not compiled: ... --> marker
}

// readmeGoSnippets returns the ```go blocks of the markdown text (named
// name in errors). A marker followed by something else than a ```go block
// is an error: it would skip nothing, or the wrong block.
func readmeGoSnippets(name, text string) ([]readmeSnippet, error) {
	var (
		out     []readmeSnippet
		lines   = strings.Split(text, "\n")
		in      bool   // inside a fenced block
		isGo    bool   // the block is ```go
		marker  string // reason of the marker before the next fence
		markAt  int    // its line
		current readmeSnippet
		body    []string
	)
	for i, l := range lines {
		n := i + 1
		trimmed := strings.TrimSpace(l)
		if in {
			if trimmed == "```" {
				in = false
				if isGo {
					current.code = strings.Join(body, "\n") + "\n"
					out = append(out, current)
				}
				continue
			}
			body = append(body, l)
			continue
		}
		if m := readmeNotCompiled.FindStringSubmatch(trimmed); m != nil {
			marker, markAt = m[1], n
			continue
		}
		if rest, ok := strings.CutPrefix(trimmed, "```"); ok {
			in, isGo, body = true, strings.TrimSpace(rest) == "go", nil
			if marker != "" && !isGo {
				return nil, fmt.Errorf("%s:%d: a %q marker must precede a ```go block", name, markAt, "not compiled")
			}
			current = readmeSnippet{line: n + 1, skip: marker}
			marker = ""
			continue
		}
		if trimmed != "" && marker != "" {
			return nil, fmt.Errorf("%s:%d: a %q marker must precede a ```go block", name, markAt, "not compiled")
		}
	}
	if in {
		return nil, fmt.Errorf("%s: a fenced block is not closed", name)
	}
	if marker != "" {
		return nil, fmt.Errorf("%s:%d: a %q marker must precede a ```go block", name, markAt, "not compiled")
	}
	return out, nil
}

// readmeKind is how a snippet is checked.
type readmeKind int

const (
	readmeFile  readmeKind = iota // a whole file, with its package clause
	readmeDecls                   // top-level declarations
	readmeStmts                   // statements: the body of a function
)

// readmeSource is a snippet made into a Go file to type-check.
type readmeSource struct {
	snippet readmeSnippet
	kind    readmeKind
	src     string   // the file
	imports []string // import paths it needs
}

// readmeKindOf says how to check a snippet's code.
func readmeKindOf(code string) readmeKind {
	for _, l := range strings.Split(code, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "//") {
			continue
		}
		if strings.HasPrefix(l, "package ") {
			return readmeFile
		}
		break
	}
	if _, err := parser.ParseFile(token.NewFileSet(), "", "package p\n"+code, parser.SkipObjectResolution); err == nil {
		return readmeDecls
	}
	return readmeStmts
}

// readmeBuild makes snippet s into a Go file: a whole file as it is, any
// other with the imports and placeholders it names around it. Positions
// in the file map to README.md lines through a //line directive.
func readmeBuild(name string, s readmeSnippet) (readmeSource, error) {
	directive := fmt.Sprintf("//line %s:%d:1\n", name, s.line)
	kind := readmeKindOf(s.code)
	out := readmeSource{snippet: s, kind: kind}
	if kind == readmeFile {
		out.src = directive + s.code
		f, err := parser.ParseFile(token.NewFileSet(), name, out.src, parser.ImportsOnly)
		if err != nil {
			return out, err
		}
		for _, im := range f.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			out.imports = append(out.imports, p)
		}
		return out, nil
	}

	// Parse the snippet alone to learn which names it uses and declares.
	wrapped := "package p\n" + s.code
	if kind == readmeStmts {
		wrapped = "package p\nfunc _() {\n" + s.code + "\n}\n"
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, name, wrapped, 0)
	if err != nil {
		// Report the syntax error at its README line.
		_, err = parser.ParseFile(token.NewFileSet(), name, readmeWrap(kind, directive, "", "", s.code), 0)
		return out, err
	}
	// The names the snippet uses but does not declare: placeholders and
	// packages to import. (The parser resolves the snippet's own
	// declarations, local and top-level.)
	free := map[string]bool{}
	for _, id := range f.Unresolved {
		free[id.Name] = true
	}

	names := map[string]bool{}
	var vars []string
	for v, p := range readmePlaceholders {
		if free[v] {
			vars = append(vars, p.decl)
			for _, u := range p.uses {
				names[u] = true
			}
		}
	}
	for n := range readmeImports {
		if free[n] {
			names[n] = true
		}
	}
	var sorted []string
	for n := range names {
		sorted = append(sorted, n)
	}
	sort.Strings(sorted)
	var imports strings.Builder
	for _, n := range sorted {
		out.imports = append(out.imports, readmeImports[n])
		fmt.Fprintf(&imports, "\t%s %q\n", n, readmeImports[n])
	}
	sort.Strings(vars)
	out.src = readmeWrap(kind, directive, imports.String(), strings.Join(vars, "\n\t"), s.code)
	return out, nil
}

// readmeWrap is the file around code: imports, placeholder variables, and
// a function when code is statements.
func readmeWrap(kind readmeKind, directive, imports, vars, code string) string {
	var b strings.Builder
	b.WriteString("package snippet\n\n")
	if imports != "" {
		fmt.Fprintf(&b, "import (\n%s)\n\n", imports)
	}
	if vars != "" {
		fmt.Fprintf(&b, "var (\n\t%s\n)\n\n", vars)
	}
	if kind == readmeStmts {
		b.WriteString("func _() {\n")
	}
	b.WriteString(directive)
	b.WriteString(code)
	if kind == readmeStmts {
		b.WriteString("\n}\n")
	}
	return b.String()
}

// readmeModuleDir is the directory of the module that provides import
// path p, relative to the root module's directory: a nested module of
// this repository (contrib/report) for its packages, else the root.
func readmeModuleDir(p string) string {
	rest, ok := strings.CutPrefix(p, readmeModule+"/")
	if !ok {
		return "."
	}
	parts := strings.Split(rest, "/")
	for i := len(parts); i > 0; i-- {
		dir := filepath.Join(parts[:i]...)
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
	}
	return "."
}

// readmeExports runs `go list -export -deps` in module directory dir for
// the import paths, and returns the export data file of each package it
// lists (the paths and all their dependencies).
func readmeExports(dir string, paths []string) (map[string]string, error) {
	args := append([]string{"list", "-e", "-export", "-deps", "-json=ImportPath,Export,Error"}, paths...)
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go %s (in %s): %v\n%s", strings.Join(args, " "), dir, err, stderr.String())
	}
	exports := map[string]string{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct {
			ImportPath string
			Export     string
			Error      *struct{ Err string }
		}
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			return nil, err
		}
		if p.Error != nil {
			// A package that does not exist or does not build: the
			// snippet that imports it fails to type-check, naming it.
			continue
		}
		exports[p.ImportPath] = p.Export
	}
	return exports, nil
}

// readmeInternal says whether import path p is an internal package of
// this repository, which users cannot import.
func readmeInternal(p string) bool {
	rest, ok := strings.CutPrefix(p, readmeModule+"/")
	return ok && (rest == "internal" || strings.HasPrefix(rest, "internal/") || strings.Contains(rest, "/internal/") || strings.HasSuffix(rest, "/internal"))
}

// readmeCheck type-checks snippet s (made by readmeBuild) against the
// export data of its imports, and returns its errors, each with its
// README position.
func readmeCheck(name string, s readmeSource, exports map[string]string) []string {
	var errs []string
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, name+".go", s.src, parser.ParseComments)
	if err != nil {
		return append(errs, err.Error())
	}
	for _, im := range f.Imports {
		if p, _ := strconv.Unquote(im.Path.Value); readmeInternal(p) {
			errs = append(errs, fmt.Sprintf("%s: imports %s: users cannot import an internal package", fset.Position(im.Pos()), p))
		}
	}
	lookup := func(path string) (io.ReadCloser, error) {
		file, ok := exports[path]
		if !ok || file == "" {
			return nil, fmt.Errorf("no export data for %q (no such package, or it does not build)", path)
		}
		return os.Open(file)
	}
	conf := types.Config{
		Importer:  importer.ForCompiler(fset, "gc", lookup),
		GoVersion: "go1.26",
		Sizes:     types.SizesFor("gc", runtime.GOARCH),
		Error: func(err error) {
			te, ok := err.(types.Error)
			if !ok {
				errs = append(errs, err.Error())
				return
			}
			if s.kind != readmeFile {
				// Fragments need not use what they declare, and the
				// imports and placeholders around them are a superset.
				if strings.Contains(te.Msg, "declared and not used") || strings.Contains(te.Msg, "imported and not used") {
					return
				}
			}
			errs = append(errs, fmt.Sprintf("%s: %s", fset.Position(te.Pos), te.Msg))
		},
	}
	_, _ = conf.Check("snippet", fset, []*ast.File{f}, nil)
	return errs
}

// readmeCheckAll checks every snippet of the markdown text (named name in
// messages), and returns the errors and the skipped snippets.
func readmeCheckAll(name, text string) (errs []string, skipped []readmeSnippet, checked int, err error) {
	snippets, err := readmeGoSnippets(name, text)
	if err != nil {
		return nil, nil, 0, err
	}
	var sources []readmeSource
	byDir := map[string]map[string]bool{}
	for _, s := range snippets {
		if s.skip != "" {
			skipped = append(skipped, s)
			continue
		}
		src, err := readmeBuild(name, s)
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		dir := "."
		for _, p := range src.imports {
			if d := readmeModuleDir(p); d != "." {
				if dir != "." && dir != d {
					errs = append(errs, fmt.Sprintf("%s:%d: imports packages of two nested modules, %s and %s", name, s.line, dir, d))
				}
				dir = d
			}
		}
		if byDir[dir] == nil {
			byDir[dir] = map[string]bool{}
		}
		for _, p := range src.imports {
			byDir[dir][p] = true
		}
		sources = append(sources, src)
	}
	exports := map[string]map[string]string{}
	for dir, set := range byDir {
		var paths []string
		for p := range set {
			paths = append(paths, p)
		}
		sort.Strings(paths)
		exports[dir], err = readmeExports(dir, paths)
		if err != nil {
			return nil, nil, 0, err
		}
	}
	for _, src := range sources {
		dir := "."
		for _, p := range src.imports {
			if d := readmeModuleDir(p); d != "." {
				dir = d
			}
		}
		errs = append(errs, readmeCheck(name, src, exports[dir])...)
		checked++
	}
	return errs, skipped, checked, nil
}

func TestReadmeGoSnippetsCompile(t *testing.T) {
	text, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	errs, skipped, checked, err := readmeCheckAll("README.md", string(text))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range skipped {
		t.Logf("README.md:%d: not compiled: %s", s.line, s.skip)
	}
	if checked == 0 {
		t.Fatal("README.md has no ```go block to check")
	}
	t.Logf("%d Go snippets type-checked, %d skipped", checked, len(skipped))
	for _, e := range errs {
		t.Error(e)
	}
}

// TestReadmeSnippetCheckReportsLine checks the checker itself: a snippet
// that names something that does not exist fails, naming its README line,
// and a marked block is skipped.
func TestReadmeSnippetCheckReportsLine(t *testing.T) {
	const text = "# x\n\n```go\nr, err := backfill.New(db, &backfill.Config{})\n_, _ = r, err\njob.NoSuchField = 1\n```\n\n" +
		"<!-- not compiled: pseudo-code -->\n```go\nthis is not Go\n```\n\n" +
		"```go\npackage main\n\nimport \"github.com/pgbackfill/backfill/internal/pgstore\"\n\nvar _ = pgstore.NoSuchName\n```\n"
	errs, skipped, checked, err := readmeCheckAll("README.md", text)
	if err != nil {
		t.Fatal(err)
	}
	if checked != 2 || len(skipped) != 1 || skipped[0].line != 11 {
		t.Fatalf("checked %d, skipped %+v; want 2 checked and the block at line 11 skipped", checked, skipped)
	}
	joined := strings.Join(errs, "\n")
	for _, want := range []string{
		"README.md:6:5: job.NoSuchField undefined",
		"README.md:17:8: imports github.com/pgbackfill/backfill/internal/pgstore: users cannot import an internal package",
	} {
		if !strings.Contains(joined, want) {
			t.Errorf("errors lack %q:\n%s", want, joined)
		}
	}
}
