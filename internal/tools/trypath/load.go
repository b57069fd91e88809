package main

import (
	"bytes"
	"encoding/json"
	"errors"
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
	"strings"
)

// listed is what `go list -json` says of one package.
type listed struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	Export     string
	Module     *struct{ Path string }
}

// loadModule type-checks, from source, every non-test package of the module
// in root that counts as library code (see library), with the export data of
// `go list -export` for everything else. Only the standard library is used
// (go/types, go/importer), so that the module needs no golang.org/x/tools.
func loadModule(root string) (*program, error) {
	cmd := exec.Command("go", "list", "-e", "-export", "-deps",
		"-json=ImportPath,Dir,GoFiles,Export,Module", "./...")
	cmd.Dir = root
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go list -export: %w", err)
	}
	exports := map[string]string{}
	var mine []listed
	dec := json.NewDecoder(&out)
	for {
		var p listed
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("go list -json: %w", err)
		}
		if p.Module != nil && p.Module.Path+"/" == module || p.ImportPath+"/" == module {
			mine = append(mine, p)
			continue
		}
		exports[p.ImportPath] = p.Export
	}
	fset := token.NewFileSet()
	gc := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		f, ok := exports[path]
		if !ok || f == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(f)
	})
	prog := newProgram(fset)
	imp := &sourceImporter{gc: gc, prog: prog, pkgs: map[string]listed{}, done: map[string]*types.Package{}, root: root}
	for _, p := range mine {
		imp.pkgs[p.ImportPath] = p
	}
	for _, p := range mine {
		if !library(strings.TrimPrefix(p.ImportPath+"/", module)) {
			continue
		}
		if _, err := imp.Import(p.ImportPath); err != nil {
			return nil, err
		}
	}
	prog.index()
	return prog, nil
}

// sourceImporter checks the module's packages from source, in dependency
// order, and imports every other package from export data, through one gc
// importer so that a type has one identity everywhere.
type sourceImporter struct {
	gc   types.Importer
	prog *program
	pkgs map[string]listed
	done map[string]*types.Package
	root string
}

func (s *sourceImporter) Import(path string) (*types.Package, error) {
	if p, ok := s.done[path]; ok {
		return p, nil
	}
	lp, ok := s.pkgs[path]
	if !ok {
		return s.gc.Import(path)
	}
	var files []*ast.File
	for _, name := range lp.GoFiles {
		f, err := parser.ParseFile(s.prog.fset, filepath.Join(lp.Dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	info := newInfo()
	conf := types.Config{Importer: s}
	pkg, err := conf.Check(path, s.prog.fset, files, info)
	if err != nil {
		return nil, fmt.Errorf("type-checking %s: %w", path, err)
	}
	s.done[path] = pkg
	rel, err := filepath.Rel(s.root, lp.Dir)
	if err != nil {
		return nil, err
	}
	if library(filepath.ToSlash(rel) + "/") {
		s.prog.add(info, files, s.root)
	}
	return pkg, nil
}

// library reports whether the module's directory dir (relative, with a
// trailing slash) holds library code: everything but the test harness, the
// tools and the programs (commands and examples), which a TryLock never
// enters.
func library(dir string) bool {
	for _, skip := range []string{"internal/redistest/", "internal/tools/", "examples/", "cmd/", "benchmarks/"} {
		if strings.HasPrefix(dir, skip) {
			return false
		}
	}
	return true
}

// newInfo is the type information the reading needs.
func newInfo() *types.Info {
	return &types.Info{
		Types:      map[ast.Expr]types.TypeAndValue{},
		Defs:       map[*ast.Ident]types.Object{},
		Uses:       map[*ast.Ident]types.Object{},
		Selections: map[*ast.SelectorExpr]*types.Selection{},
	}
}
