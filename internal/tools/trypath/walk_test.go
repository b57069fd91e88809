package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fixture is a small package in three files whose reading from Entry is
// known: every way a callee is reached (by name, a function value met on
// the way, one passed on, an interface, a send to a worker, an element of a
// slice of functions), a branch that did not run, a function called twice, a
// deferred call, a function that ran but is not reached, a package-level
// function literal.
var fixture = map[string]string{
	"a.go": `package fix

var jobs = make(chan task, 1)

func Entry() int {
	defer cleanup()
	n := twice(inc)
	n += twice(func(x int) int { return x * 2 })
	var s shape = square{}
	n += s.area()
	jobs <- job{n: &n}
	fs := []func(){begin()}
	fs[0]()
	if n < 0 {
		n = never()
	}
	return n + twice(inc)
}

func inc(x int) int { return x + 1 }

func never() int { return 0 }

func orphan() {}
`,
	"b.go": `package fix

func twice(f func(int) int) int { return f(f(0)) }

func cleanup() {}

func begin() func() { return func() {} }
`,
	"c.go": `package fix

type shape interface{ area() int }

type square struct{}

func (square) area() int { return side() }

func side() int { return 2 }

type task interface{ run() }

type job struct{ n *int }

func (j job) run() { *j.n++ }

func work(ch chan task) {
	for t := range ch {
		t.run()
	}
}

// A literal outside any function: no read reaches it (it once made index
// panic).
var hook = func() {}
`,
}

// loadFixture type-checks the fixture and gives it a coverage profile in
// which every function ran except never (and the branch that calls it).
func loadFixture(t *testing.T) *program {
	t.Helper()
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range []string{"a.go", "b.go", "c.go"} {
		f, err := parser.ParseFile(fset, filepath.Join("/fix", name), fixture[name], parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	info := newInfo()
	if _, err := (&types.Config{}).Check(module+"fix", fset, files, info); err != nil {
		t.Fatal(err)
	}
	p := newProgram(fset)
	p.add(info, files, "/fix")
	p.index()

	// One block per function body, as `go tool covdata textfmt` writes
	// them, and one, not run, for the if's body.
	at := func(pos token.Pos) string {
		x := fset.Position(pos)
		return fmt.Sprintf("%d.%d", x.Line, x.Column)
	}
	var prof strings.Builder
	prof.WriteString("mode: atomic\n")
	line := func(b *ast.BlockStmt, ran bool) {
		count := 0
		if ran {
			count = 1
		}
		fmt.Fprintf(&prof, "%s%s:%s,%s 1 %d\n", module, strings.TrimPrefix(fset.Position(b.Pos()).Filename, "/fix/"),
			at(b.Lbrace), at(b.Rbrace+1), count)
	}
	for _, fn := range p.funcs {
		line(fn.body, fn.name != "fix.never")
	}
	ast.Inspect(files[0], func(n ast.Node) bool {
		if s, ok := n.(*ast.IfStmt); ok {
			line(s.Body, false)
		}
		return true
	})
	prof.WriteString("github.com/elsewhere/x.go:1.1,2.2 1 1\n")
	path := filepath.Join(t.TempDir(), "cov.txt")
	if err := os.WriteFile(path, []byte(prof.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := p.cover(path); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRead(t *testing.T) {
	p := loadFixture(t)
	entry := p.find("fix.Entry")
	if entry == nil {
		t.Fatal("no fix.Entry")
	}
	got := read(p, entry)

	var b strings.Builder
	got.list(&b)
	want := `  > a.go
    fix.Entry :5
    > b.go
      fix.twice :3
      < a.go (return 1)
        fix.inc :20  [value]
    < b.go (return 2)
  < a.go (return 3)
      fix.Entry.func1 :8  [passed]
    > c.go
      fix.square.area :7  [interface]
        fix.side :9
  < a.go (return 4)
    < c.go (return 5)
      fix.work :17  [send]
        fix.job.run :15  [interface]
  < a.go (return 6)
    < b.go (return 7)
      fix.begin :7
  < a.go (return 8)
    < b.go (return 9)
      fix.begin.func1 :7  [value]
  < a.go (return 10)
    < b.go (return 11)
      fix.cleanup :5
  < a.go (return 12)
  ran, not reached from the entry: fix.orphan a.go:24
`
	if b.String() != want {
		t.Errorf("reading from Entry:\n%s\nwant:\n%s", b.String(), want)
	}
	if got.funcs != 11 || got.files != 3 || got.returns != 12 {
		t.Errorf("read(Entry) = %d functions, %d files, %d returns; want 11, 3, 12", got.funcs, got.files, got.returns)
	}
}

// TestCover checks that blocks go to the innermost function they start in
// and that a function ran when one of its blocks did.
func TestCover(t *testing.T) {
	p := loadFixture(t)
	for name, want := range map[string]bool{"fix.Entry": true, "fix.Entry.func1": true, "fix.never": false, "fix.work": true} {
		fn := p.find(name)
		if fn == nil {
			t.Fatalf("no %s", name)
		}
		if fn.ran != want {
			t.Errorf("%s ran = %v; want %v", name, fn.ran, want)
		}
		if len(fn.blocks) == 0 {
			t.Errorf("%s has no blocks", name)
		}
	}
	if n := len(p.find("fix.Entry").blocks); n != 2 {
		t.Errorf("fix.Entry has %d blocks; want 2 (its body, the if's body; not its literal's)", n)
	}
}
