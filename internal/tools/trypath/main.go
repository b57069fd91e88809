// Command trypath measures what a reader pays to follow the uncontended
// TryLock, Lock and Unlock from call to return: the library functions
// entered, the files they are in, and the returns to a file already left.
//
// Run it from the module root (it needs redis-server on PATH):
//
//	go run ./internal/tools/trypath     # -v lists the functions in reading order
//
// # What runs
//
// It builds itself with coverage of every package of the module, starts 3
// redis-server nodes (internal/redistest), makes a redlock.Client, warms it
// with 3 TryLocks and 3 Locks, each unlocked (so first-use work such as
// clock probes and script loading is not counted), then, one after the
// other: a TryLock of "p", a Lock of "q" (nobody else holds it) and the
// Unlock of "p". Before each it waits 300ms for the work left from before
// and clears the coverage counters; after each it waits 300ms more, so that
// the call's own stragglers are in (they run the functions the deciding
// answers ran, and waiting makes the figures repeatable), and writes the
// counters.
//
// # What is counted
//
// The library is every non-test package of the module except the harness
// (internal/redistest), the tools (internal/tools), the commands and the
// examples. It is type-checked from source with go/types (export data from
// `go list -export` for the rest; no golang.org/x/tools). A function is a
// declaration or a function literal (closures count, named as the compiler
// names them: run.func1, try.func1.1); it ran if one of its coverage blocks
// ran (each block goes to the innermost function it starts in).
//
// Each call is read from its entry point ((*Client).TryLock, (*Client).Lock,
// (*Lock).Unlock): the body of a function is read in source order, skipping
// statements that did not run (a statement with a block inside it that ran
// is read: the loop of a worker started before the call), and at each call
// that ran, after its arguments, the reader enters every callee that ran and
// that was not read yet, reads it the same way, and comes back. The callees
// of a call are:
//
//   - a function or method called by name: its declaration (a generic one's
//     origin);
//   - a method called through an interface (or a type parameter): the
//     library's methods of that name and signature that ran, whose receiver
//     type implements the interface;
//   - a function value (a variable, field or parameter of function type):
//     the function values of a matching signature (a type parameter
//     matches any type) that ran, were not read yet and that the reader has
//     met on the way (a literal written, or a function named without being
//     called); if the reader has met none of that signature, read or not,
//     any in the library (one stored before the call). A value of a named
//     function type from outside the library (context.CancelFunc) is not
//     followed;
//   - a function value passed as an argument that nothing read from the call
//     called (code outside the library called it: sync.Once.Do, or the
//     reader could not see the call): read right after the call;
//   - a send of a function or of a library type on a channel: the functions
//     that ran and receive that type from a channel (a worker taking its
//     task);
//   - a deferred call: read when the function's body is read to its end.
//
// A function is read once: a second call of it costs nothing. Reading a
// function puts the reader in its file; coming back from a callee in another
// file puts the reader back in the caller's file. Each time the reader's
// file changes to one they have been in before, one return is counted.
// functions is the number of functions read, files the number of distinct
// files.
//
// -v prints each call's functions in reading order, indented by depth, with
// how a callee was reached when not by name ([value], [interface], [send],
// [passed]); "> file" marks a file entered for the first time, "< file
// (return n)" a return. It ends with the functions that ran but that no read
// reaches (background goroutines woken without a value handed over, such as
// the renewal scheduler's loop, and methods called only by code outside the
// library, such as container/heap's calls of Less); these are not counted,
// and the table shows how many there are in parentheses.
//
// walk_test.go reads a small fixture package with a hand-made coverage
// profile (no redis), so that the rules above are checked by go test.
//
// # Known differences from a walk by hand
//
// A reader reads every branch they cannot rule out; this reads only what
// ran. The candidates of an interface or function-value call are those that
// ran somewhere during the call, so a method that ran only inside code
// outside the library (a context's Done, called by the context package) is
// read at the first library call of that name and signature. Two function
// values of one signature met on the way are both read at the first call
// through a value of that signature. The return to the caller's file is
// counted even when nothing is left to read there but the return statement.
// Goroutines woken by a signal (a close, a struct{} send) are not followed.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/coverage"
	"time"

	"github.com/quorumlock/quorumlock/internal/redistest"
	"github.com/quorumlock/quorumlock/redlock"
)

const module = "github.com/quorumlock/quorumlock/"

func main() {
	measure := flag.String("measure", "", "internal: run the measured TryLock and write coverage data into this directory")
	verbose := flag.Bool("v", false, "list the executed blocks too")
	flag.Parse()
	if *measure != "" {
		if err := run(*measure); err != nil {
			fmt.Fprintln(os.Stderr, "trypath:", err)
			os.Exit(1)
		}
		return
	}
	if err := drive(*verbose); err != nil {
		fmt.Fprintln(os.Stderr, "trypath:", err)
		os.Exit(1)
	}
}

// calls are the measured calls, in the order the measured program makes
// them, with their entry points.
var calls = []struct{ name, entry string }{
	{"TryLock", "redlock.(*Client).TryLock"},
	{"Lock", "redlock.(*Client).Lock"},
	{"Unlock", "redlock.(*Lock).Unlock"},
}

// drive builds this command with coverage, runs it with -measure, reads
// each measured call from its entry point and prints the figures.
func drive(verbose bool) error {
	tmp, err := os.MkdirTemp("", "trypath")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "trypath")
	build := exec.Command("go", "build", "-cover", "-covermode=atomic",
		"-coverpkg="+module+"...", "-o", bin, module+"internal/tools/trypath")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("go build -cover: %w", err)
	}
	data := filepath.Join(tmp, "cov")
	if err := os.Mkdir(data, 0o755); err != nil {
		return err
	}
	child := exec.Command(bin, "-measure", data)
	// The counters written at exit (of the warm-up too) go to a directory
	// of their own, which is not read.
	child.Env = append(os.Environ(), "GOCOVERDIR="+tmp)
	child.Stdout, child.Stderr = os.Stderr, os.Stderr
	if err := child.Run(); err != nil {
		return fmt.Errorf("measured run: %w", err)
	}
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	prog, err := loadModule(root)
	if err != nil {
		return err
	}
	paths := make([]*path, len(calls))
	for i, c := range calls {
		text := filepath.Join(tmp, c.name+".txt")
		conv := exec.Command("go", "tool", "covdata", "textfmt", "-i="+filepath.Join(data, c.name), "-o="+text)
		conv.Stdout, conv.Stderr = os.Stderr, os.Stderr
		if err := conv.Run(); err != nil {
			return fmt.Errorf("go tool covdata textfmt: %w", err)
		}
		if err := prog.cover(text); err != nil {
			return err
		}
		entry := prog.find(c.entry)
		if entry == nil {
			return fmt.Errorf("no function %s in the library", c.entry)
		}
		if !entry.ran {
			return fmt.Errorf("%s did not run", c.entry)
		}
		paths[i] = read(prog, entry)
		if verbose {
			fmt.Printf("%s\n", c.name)
			paths[i].list(os.Stdout)
			fmt.Println()
		}
	}
	fmt.Printf("%-11s %9s %6s %8s   %s\n", "uncontended", "functions", "files", "returns", "(ran, not reached: not counted)")
	for i, c := range calls {
		p := paths[i]
		fmt.Printf("%-11s %9d %6d %8d   (%d)\n", c.name, p.funcs, p.files, p.returns, len(p.unreached))
	}
	return nil
}

// run is the measured program: on a warm Client over 3 real nodes, one
// TryLock, one Lock (uncontended) and the Unlock of the TryLock's lock, each
// with the coverage counters cleared before it and written, into a
// directory of its own under dir, once its background work is over.
func run(dir string) error {
	rc, err := redistest.StartCluster(3)
	if err != nil {
		return err
	}
	defer rc.Close()
	c, err := redlock.New(rc.Clients())
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 3 {
		for _, acquire := range []func(context.Context, string, ...redlock.Option) (*redlock.Lock, error){c.TryLock, c.Lock} {
			l, err := acquire(ctx, fmt.Sprintf("warm-%d", i))
			if err != nil {
				return fmt.Errorf("warm-up: %w", err)
			}
			if err := l.Unlock(ctx); err != nil {
				return fmt.Errorf("warm-up Unlock: %w", err)
			}
		}
	}
	var tried, locked *redlock.Lock
	measured := map[string]func() error{
		"TryLock": func() (err error) { tried, err = c.TryLock(ctx, "p"); return err },
		"Lock":    func() (err error) { locked, err = c.Lock(ctx, "q"); return err },
		"Unlock":  func() error { return tried.Unlock(ctx) },
	}
	for _, call := range calls {
		// Let the work left from before (releases, stragglers) finish,
		// so that none of it is counted.
		time.Sleep(settle)
		if err := coverage.ClearCounters(); err != nil {
			return fmt.Errorf("%w (this mode must run in a binary built with -cover; run without -measure)", err)
		}
		if err := measured[call.name](); err != nil {
			return fmt.Errorf("measured %s: %w", call.name, err)
		}
		// The call's own background work (its stragglers) is counted:
		// it runs the same functions as the answers that decided, and
		// waiting for it makes the figures the same from run to run.
		time.Sleep(settle)
		sub := filepath.Join(dir, call.name)
		if err := os.Mkdir(sub, 0o755); err != nil {
			return err
		}
		if err := coverage.WriteMetaDir(sub); err != nil {
			return err
		}
		if err := coverage.WriteCountersDir(sub); err != nil {
			return err
		}
	}
	return locked.Unlock(ctx)
}

// settle is how long the measured program lets background work finish: a
// straggler on a local node answers within a millisecond or two.
const settle = 300 * time.Millisecond
