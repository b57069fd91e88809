package main

import (
	"fmt"
	"go/ast"
	"go/types"
	"io"
	"strings"
)

// path is one call read from its entry point.
type path struct {
	steps     []step
	funcs     int         // distinct functions read
	files     int         // distinct files they are in
	returns   int         // times the reader's file changed to one already left
	unreached []*function // functions that ran but that no call read reaches
}

// step is one function entered (fn set), or the reader going back to the
// caller's file after a callee in another file (fn nil). file is set when
// the reader's file changes at this step; back when it is a file left
// before (a return).
type step struct {
	fn    *function
	depth int
	file  string
	back  bool
	how   string // how fn was reached: "" (a call), "value", "interface", "send", "passed"
}

// deferredCall is a deferred call's callees, read at the end of the body.
type deferredCall struct {
	targets []*function
	how     string
}

// walker reads the library from an entry point in call order (see the
// package comment).
type walker struct {
	p       *program
	walked  map[*function]bool
	pending []*function // function values met, not yet read
	seen    map[string]bool
	cur     string
	out     *path
}

// read reads the call that starts at entry.
func read(p *program, entry *function) *path {
	w := &walker{p: p, walked: map[*function]bool{}, seen: map[string]bool{}, out: &path{}}
	w.walk(entry, 0, "")
	w.out.funcs = len(w.walked)
	w.out.files = len(w.seen)
	for _, fn := range p.funcs {
		if fn.ran && !w.walked[fn] {
			w.out.unreached = append(w.out.unreached, fn)
		}
	}
	return w.out
}

// move puts the reader in file, counting a return if it was there before.
func (w *walker) move(file string, st *step) {
	if file == w.cur {
		return
	}
	st.file = file
	if w.seen[file] {
		st.back = true
		w.out.returns++
	}
	w.seen[file] = true
	w.cur = file
}

func (w *walker) walk(fn *function, depth int, how string) {
	w.walked[fn] = true
	st := step{fn: fn, depth: depth, how: how}
	w.move(fn.file, &st)
	w.out.steps = append(w.out.steps, st)

	var deferred []deferredCall
	var stack []ast.Node
	ast.Inspect(fn.body, func(x ast.Node) bool {
		if x == nil {
			n := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			var parent ast.Node
			if len(stack) > 0 {
				parent = stack[len(stack)-1]
			}
			w.after(fn, n, parent, depth, &deferred)
			return false
		}
		if lit, ok := x.(*ast.FuncLit); ok {
			// Its body is read when it is called, not where it is written.
			if !w.p.called[lit] {
				w.met(w.p.lits[lit])
			}
			return false
		}
		// A statement is read if it ran, or if code inside it ran (the
		// body of a loop entered before the call: a worker's).
		if s, ok := x.(ast.Stmt); ok && !fn.ranAt(s.Pos()) && !fn.ranIn(s.Pos(), s.End()) {
			return false
		}
		stack = append(stack, x)
		return true
	})
	for i := len(deferred) - 1; i >= 0; i-- {
		w.enter(fn, deferred[i].targets, depth, deferred[i].how)
	}
}

// after handles node n of fn once its children (a call's arguments, a
// send's value) have been read.
func (w *walker) after(fn *function, n, parent ast.Node, depth int, deferred *[]deferredCall) {
	info := fn.info
	switch n := n.(type) {
	case *ast.CallExpr:
		targets, how := w.resolve(fn, n)
		if d, ok := parent.(*ast.DeferStmt); ok && d.Call == n {
			*deferred = append(*deferred, deferredCall{targets, how})
		} else {
			w.enter(fn, targets, depth, how)
		}
		// A function value handed to a call that nothing read from
		// there called: the callee called it (or code outside the
		// library did, as sync.Once.Do does).
		for _, a := range n.Args {
			if v := w.valueIn(info, a); v != nil {
				w.enter(fn, []*function{v}, depth, "passed")
			}
		}
	case *ast.SendStmt:
		c, ok := typeOf(info, n.Chan).Underlying().(*types.Chan)
		if !ok || !followable(c.Elem()) {
			return
		}
		var rs []*function
		for _, r := range w.p.funcs {
			for _, t := range w.p.recvs[r] {
				if matchType(c.Elem(), t) {
					rs = append(rs, r)
					break
				}
			}
		}
		w.enter(fn, rs, depth, "send")
	case *ast.Ident:
		if !w.p.called[n] {
			w.met(w.p.declOf(info.Uses[n]))
		}
	case *ast.SelectorExpr:
		if !w.p.called[n] {
			w.met(w.p.declOf(selected(info, n)))
		}
	}
}

// valueIn is the function a call's argument a denotes, if it is a library
// function that ran and is not yet read.
func (w *walker) valueIn(info *types.Info, a ast.Expr) *function {
	var fn *function
	switch a := unparen(info, a).(type) {
	case *ast.FuncLit:
		fn = w.p.lits[a]
	case *ast.Ident:
		fn = w.p.declOf(info.Uses[a])
	case *ast.SelectorExpr:
		fn = w.p.declOf(selected(info, a))
	}
	if fn == nil || !fn.ran || w.walked[fn] {
		return nil
	}
	return fn
}

// met notes a function value created (or taken) where the reader is.
func (w *walker) met(fn *function) {
	if fn != nil && fn.ran {
		w.pending = append(w.pending, fn)
	}
}

// enter reads each target that ran and is not read yet, and brings the
// reader back to fn's file after each.
func (w *walker) enter(fn *function, targets []*function, depth int, how string) {
	for _, t := range targets {
		if t == nil || !t.ran || w.walked[t] {
			continue
		}
		w.walk(t, depth+1, how)
		st := step{depth: depth}
		w.move(fn.file, &st)
		if st.file != "" {
			w.out.steps = append(w.out.steps, st)
		}
	}
}

// resolve finds what a call in fn may enter: its declaration for a static
// call; for a method called through an interface, the methods of that name
// and signature that ran; for a function value, the function values of its
// signature that ran: those met on the way, or if the reader met none of
// that signature (read or not), any in the library.
func (w *walker) resolve(fn *function, call *ast.CallExpr) ([]*function, string) {
	info := fn.info
	fun := unparen(info, call.Fun)
	var obj types.Object
	switch f := fun.(type) {
	case *ast.FuncLit:
		return []*function{w.p.lits[f]}, ""
	case *ast.Ident:
		obj = info.Uses[f]
	case *ast.SelectorExpr:
		if sel := info.Selections[f]; sel != nil {
			obj = sel.Obj()
			if m, ok := obj.(*types.Func); ok && sel.Kind() != types.FieldVal {
				recv := m.Type().(*types.Signature).Recv()
				if recv != nil && types.IsInterface(recv.Type()) {
					return w.implementations(m), "interface"
				}
			}
		} else {
			obj = info.Uses[f.Sel]
		}
	default:
		return w.values(typeOf(info, fun)), "value"
	}
	switch o := obj.(type) {
	case *types.Func:
		if d := w.p.declOf(o); d != nil {
			return []*function{d}, ""
		}
	case *types.Var:
		return w.values(o.Type()), "value"
	}
	return nil, ""
}

// implementations are the library's methods named as the interface method
// m with a matching signature whose receiver type implements m's interface
// (for a generic receiver, the name and signature only).
func (w *walker) implementations(m *types.Func) []*function {
	iface, _ := m.Type().(*types.Signature).Recv().Type().Underlying().(*types.Interface)
	var out []*function
	for _, fn := range w.p.funcs {
		if fn.obj == nil || fn.obj.Name() != m.Name() || !fn.ran || w.walked[fn] {
			continue
		}
		recv := fn.obj.Type().(*types.Signature).Recv()
		if recv == nil || !matchSig(m.Type().(*types.Signature), fn.sig) {
			continue
		}
		t := recv.Type()
		if p, ok := t.(*types.Pointer); ok {
			t = p.Elem()
		}
		if iface != nil && !hasTypeParam(t) && !types.Implements(t, iface) && !types.Implements(types.NewPointer(t), iface) {
			continue
		}
		out = append(out, fn)
	}
	return out
}

// values are the function values a call through a value of type t may
// enter. A value of a named function type declared outside the library (a
// context.CancelFunc) is not followed.
func (w *walker) values(t types.Type) []*function {
	if !followable(t) {
		return nil
	}
	sig, ok := t.Underlying().(*types.Signature)
	if !ok {
		return nil
	}
	var met, any []*function
	seen := false
	for _, fn := range w.pending {
		if matchSig(sig, fn.sig) {
			seen = true
			if !w.walked[fn] {
				met = append(met, fn)
			}
		}
	}
	if seen {
		return met
	}
	for _, fn := range w.p.funcs {
		if fn.value && fn.ran && !w.walked[fn] && matchSig(sig, fn.sig) {
			any = append(any, fn)
		}
	}
	return any
}

// matchSig reports whether a function of signature b may be called as a,
// a type parameter matching any type.
func matchSig(a, b *types.Signature) bool {
	if a == nil || b == nil || a.Variadic() != b.Variadic() ||
		a.Params().Len() != b.Params().Len() || a.Results().Len() != b.Results().Len() {
		return false
	}
	for i := range a.Params().Len() {
		if !matchType(a.Params().At(i).Type(), b.Params().At(i).Type()) {
			return false
		}
	}
	for i := range a.Results().Len() {
		if !matchType(a.Results().At(i).Type(), b.Results().At(i).Type()) {
			return false
		}
	}
	return true
}

func matchType(a, b types.Type) bool {
	return types.Identical(a, b) || hasTypeParam(a) || hasTypeParam(b)
}

// hasTypeParam reports whether t mentions a type parameter.
func hasTypeParam(t types.Type) bool {
	switch t := t.(type) {
	case *types.TypeParam:
		return true
	case *types.Pointer:
		return hasTypeParam(t.Elem())
	case *types.Slice:
		return hasTypeParam(t.Elem())
	case *types.Array:
		return hasTypeParam(t.Elem())
	case *types.Chan:
		return hasTypeParam(t.Elem())
	case *types.Map:
		return hasTypeParam(t.Key()) || hasTypeParam(t.Elem())
	case *types.Signature:
		for i := range t.Params().Len() {
			if hasTypeParam(t.Params().At(i).Type()) {
				return true
			}
		}
		for i := range t.Results().Len() {
			if hasTypeParam(t.Results().At(i).Type()) {
				return true
			}
		}
	case *types.Named:
		if t.TypeParams().Len() > 0 && t.TypeArgs().Len() == 0 {
			return true
		}
		for i := range t.TypeArgs().Len() {
			if hasTypeParam(t.TypeArgs().At(i)) {
				return true
			}
		}
	}
	return false
}

// list prints the functions in reading order, indented by call depth, with
// each change of file: "> file" to a new file, "< file (return n)" back to
// one already left.
func (p *path) list(w io.Writer) {
	n := 0
	for _, st := range p.steps {
		ind := strings.Repeat("  ", st.depth)
		if st.file != "" {
			if st.back {
				n++
				fmt.Fprintf(w, "  %s< %s (return %d)\n", ind, st.file, n)
			} else {
				fmt.Fprintf(w, "  %s> %s\n", ind, st.file)
			}
		}
		if st.fn != nil {
			how := ""
			if st.how != "" {
				how = "  [" + st.how + "]"
			}
			fmt.Fprintf(w, "  %s  %s :%d%s\n", ind, st.fn.name, st.fn.line, how)
		}
	}
	for _, fn := range p.unreached {
		fmt.Fprintf(w, "  ran, not reached from the entry: %s %s:%d\n", fn.name, fn.file, fn.line)
	}
}
