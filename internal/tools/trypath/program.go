package main

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// program is the library's source, type-checked, cut into functions (each
// declaration and each function literal is one), with what a coverage
// profile says ran.
type program struct {
	fset  *token.FileSet
	infos []*types.Info // one per package
	funcs []*function   // every function, in file and source order

	decls  map[token.Pos]*function    // by the position of a declaration's name
	lits   map[*ast.FuncLit]*function // function literals
	files  map[string][]*function     // by file (module-relative), in source order
	info   map[*ast.File]*types.Info  // each file's package's info
	rel    map[*token.File]string     // module-relative name of each file
	asts   map[string]*ast.File       // by module-relative name
	recvs  map[*function][]types.Type // element types of the channels each function receives from
	called map[ast.Node]bool          // expressions called by name (a call's Fun, unparenthesized, and its selector's name)
}

// function is one function of the library: a declaration or a literal.
type function struct {
	name  string // redlock.(*Client).TryLock, redlock.run.func1
	file  string // module-relative
	line  int
	body  *ast.BlockStmt
	sig   *types.Signature
	obj   *types.Func // a declaration's object; nil for a literal
	info  *types.Info
	value bool // used as a value somewhere (not only called by name)

	blocks []block // coverage blocks that start in it (not in a literal inside it)
	ran    bool    // one of its blocks ran
}

// block is one coverage block: [start, end] and whether it ran.
type block struct {
	start, end token.Pos
	ran        bool
}

func newProgram(fset *token.FileSet) *program {
	return &program{
		fset:   fset,
		decls:  map[token.Pos]*function{},
		lits:   map[*ast.FuncLit]*function{},
		files:  map[string][]*function{},
		info:   map[*ast.File]*types.Info{},
		rel:    map[*token.File]string{},
		asts:   map[string]*ast.File{},
		recvs:  map[*function][]types.Type{},
		called: map[ast.Node]bool{},
	}
}

// add records the functions of one type-checked package whose files lie
// under root (file names are kept relative to it).
func (p *program) add(info *types.Info, files []*ast.File, root string) {
	p.infos = append(p.infos, info)
	for _, f := range files {
		tf := p.fset.File(f.Pos())
		name := tf.Name()
		if r, err := filepath.Rel(root, name); err == nil {
			name = filepath.ToSlash(r)
		}
		p.rel[tf] = name
		p.asts[name] = f
		p.info[f] = info
		pkg := f.Name.Name
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			fn := &function{name: pkg + "." + declName(fd), file: name, line: p.fset.Position(fd.Pos()).Line,
				body: fd.Body, info: info}
			if obj, ok := info.Defs[fd.Name].(*types.Func); ok {
				fn.obj, fn.sig = obj, obj.Type().(*types.Signature)
			}
			p.decls[fd.Name.Pos()] = fn
			p.funcs = append(p.funcs, fn)
			p.files[name] = append(p.files[name], fn)
			p.literals(fn, ".func", fd.Body, info, name)
		}
	}
}

// literals records the function literals directly inside outer's body,
// named as the compiler names them (outer.func1, outer.func1.1, …).
func (p *program) literals(outer *function, sep string, body ast.Node, info *types.Info, file string) {
	n := 0
	ast.Inspect(body, func(x ast.Node) bool {
		lit, ok := x.(*ast.FuncLit)
		if !ok {
			return true
		}
		n++
		fn := &function{name: outer.name + sep + strconv.Itoa(n), file: file,
			line: p.fset.Position(lit.Pos()).Line, body: lit.Body, info: info}
		if t, ok := info.Types[lit].Type.(*types.Signature); ok {
			fn.sig = t
		}
		p.lits[lit] = fn
		p.funcs = append(p.funcs, fn)
		p.files[file] = append(p.files[file], fn)
		p.literals(fn, ".", lit.Body, info, file)
		return false
	})
}

func declName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	t := fd.Recv.List[0].Type
	star := false
	if s, ok := t.(*ast.StarExpr); ok {
		star, t = true, s.X
	}
	switch x := t.(type) {
	case *ast.IndexExpr:
		t = x.X
	case *ast.IndexListExpr:
		t = x.X
	}
	id, _ := t.(*ast.Ident)
	name := "?"
	if id != nil {
		name = id.Name
	}
	if star {
		return "(*" + name + ")." + fd.Name.Name
	}
	return name + "." + fd.Name.Name
}

// index sorts each file's functions by position and finds which functions
// are used as values and which channels each receives from.
func (p *program) index() {
	for _, fs := range p.files {
		sort.Slice(fs, func(i, j int) bool { return fs[i].body.Pos() < fs[j].body.Pos() })
	}
	sort.SliceStable(p.funcs, func(i, j int) bool {
		if p.funcs[i].file != p.funcs[j].file {
			return p.funcs[i].file < p.funcs[j].file
		}
		return p.funcs[i].body.Pos() < p.funcs[j].body.Pos()
	})
	for _, f := range p.asts {
		info := p.info[f]
		called := p.called
		ast.Inspect(f, func(x ast.Node) bool {
			switch x := x.(type) {
			case *ast.CallExpr:
				called[unparen(info, x.Fun)] = true
			case *ast.FuncLit:
				// A literal outside any function (a package-level var's
				// value) has no entry: no read enters it by name.
				if lit := p.lits[x]; lit != nil && !called[x] {
					lit.value = true
				}
			case *ast.Ident:
				if !called[x] {
					if fn := p.declOf(info.Uses[x]); fn != nil {
						fn.value = true
					}
				}
			case *ast.SelectorExpr:
				if !called[x] {
					if fn := p.declOf(selected(info, x)); fn != nil {
						fn.value = true
					}
				}
				called[x.Sel] = true // the selector, not its name alone
			}
			return true
		})
	}
	for _, fn := range p.funcs {
		fn := fn
		p.own(fn, func(x ast.Node) {
			var ch ast.Expr
			switch x := x.(type) {
			case *ast.UnaryExpr:
				if x.Op == token.ARROW {
					ch = x.X
				}
			case *ast.RangeStmt:
				ch = x.X
			}
			if ch == nil {
				return
			}
			if c, ok := typeOf(fn.info, ch).Underlying().(*types.Chan); ok && followable(c.Elem()) {
				p.recvs[fn] = append(p.recvs[fn], c.Elem())
			}
		})
	}
}

// own calls visit for every node of fn's body outside the function
// literals inside it.
func (p *program) own(fn *function, visit func(ast.Node)) {
	ast.Inspect(fn.body, func(x ast.Node) bool {
		if _, ok := x.(*ast.FuncLit); ok {
			return false
		}
		if x != nil {
			visit(x)
		}
		return true
	})
}

// unparen strips parentheses and type arguments from a called expression
// (an index into a slice of functions stays).
func unparen(info *types.Info, e ast.Expr) ast.Expr {
	for {
		switch x := e.(type) {
		case *ast.ParenExpr:
			e = x.X
		case *ast.IndexExpr:
			if !info.Types[x.Index].IsType() {
				return e
			}
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		default:
			return e
		}
	}
}

// selected is the object a selector denotes: a method, a field, or a
// package member.
func selected(info *types.Info, se *ast.SelectorExpr) types.Object {
	if s := info.Selections[se]; s != nil {
		return s.Obj()
	}
	return info.Uses[se.Sel]
}

// declOf is the library function declared as obj, if obj is one (a
// method of an instantiated type or an instance of a generic function maps
// to its declaration).
func (p *program) declOf(obj types.Object) *function {
	f, ok := obj.(*types.Func)
	if !ok {
		return nil
	}
	return p.decls[f.Origin().Pos()]
}

func typeOf(info *types.Info, e ast.Expr) types.Type {
	if t := info.TypeOf(e); t != nil {
		return t
	}
	return types.Typ[types.Invalid]
}

// followable reports whether a value of type t is followed, sent on a
// channel to the functions that receive such values, or called: an unnamed
// function type, or a type of the library (or a pointer to one). Signals
// (struct{}, bool, error, …) and the types of other modules
// (context.CancelFunc) are not.
func followable(t types.Type) bool {
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	switch t := t.(type) {
	case *types.Signature:
		return true
	case *types.Named:
		obj := t.Obj()
		return obj.Pkg() != nil && strings.HasPrefix(obj.Pkg().Path()+"/", module)
	}
	return false
}

// cover reads a textfmt coverage profile into the functions: each block
// goes to the innermost function it starts in.
func (p *program) cover(path string) error {
	for _, fn := range p.funcs {
		fn.blocks, fn.ran = nil, false
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	byName := map[string]*token.File{}
	for tf, name := range p.rel {
		byName[name] = tf
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "mode:") {
			continue
		}
		// file:startline.col,endline.col statements count
		fields := strings.Fields(line)
		if len(fields) != 3 {
			continue
		}
		name, rng, ok := strings.Cut(fields[0], ":")
		if !ok || !strings.HasPrefix(name, module) {
			continue
		}
		tf := byName[strings.TrimPrefix(name, module)]
		if tf == nil {
			continue
		}
		a, b, _ := strings.Cut(rng, ",")
		start, err1 := posOf(tf, a)
		end, err2 := posOf(tf, b)
		if err1 != nil || err2 != nil {
			return fmt.Errorf("coverage block %s: bad position", fields[0])
		}
		fn := p.innermost(p.rel[tf], start)
		if fn == nil {
			continue
		}
		ran := fields[2] != "0"
		fn.blocks = append(fn.blocks, block{start: start, end: end, ran: ran})
		fn.ran = fn.ran || ran
	}
	return sc.Err()
}

func posOf(tf *token.File, lc string) (token.Pos, error) {
	l, c, _ := strings.Cut(lc, ".")
	line, err := strconv.Atoi(l)
	if err != nil || line < 1 || line > tf.LineCount() {
		return token.NoPos, fmt.Errorf("bad line")
	}
	col, err := strconv.Atoi(c)
	if err != nil || col < 1 {
		return token.NoPos, fmt.Errorf("bad column")
	}
	return tf.LineStart(line) + token.Pos(col-1), nil
}

// innermost is the function of file whose body holds pos most closely.
func (p *program) innermost(file string, pos token.Pos) *function {
	var best *function
	for _, fn := range p.files[file] {
		if fn.body.Pos() <= pos && pos <= fn.body.End() {
			if best == nil || fn.body.Pos() >= best.body.Pos() {
				best = fn
			}
		}
	}
	return best
}

// ranAt reports whether the code at pos, in fn, ran: the innermost block of
// fn that holds pos ran, or (pos in no block of fn: a case's expression, a
// brace) fn ran. The blocks of one function do not overlap in a real
// profile; innermost only matters for a hand-made one.
func (fn *function) ranAt(pos token.Pos) bool {
	var in *block
	for i, b := range fn.blocks {
		if b.start <= pos && pos <= b.end && (in == nil || b.start >= in.start) {
			in = &fn.blocks[i]
		}
	}
	if in == nil {
		return fn.ran
	}
	return in.ran
}

// find is the function named name (redlock.(*Client).TryLock).
func (p *program) find(name string) *function {
	for _, fn := range p.funcs {
		if fn.name == name {
			return fn
		}
	}
	return nil
}

// ranIn reports whether a block of fn that starts in [from, to] ran.
func (fn *function) ranIn(from, to token.Pos) bool {
	for _, b := range fn.blocks {
		if b.ran && from <= b.start && b.start <= to {
			return true
		}
	}
	return false
}
