// Command mutate measures the simulator's power (issue 33): it applies
// each one-line mutant of mutants.txt (beside this file) to a scratch copy
// of the repository, runs the simulator's seeds against it, and prints a
// table: the mutant, and the invariant, seed and fake time that caught it,
// or "survived", "stale" (its original text is not where the list says),
// "ambiguous" (the text is found more than once), "build" (it does not
// compile) or "equivalent" (not run; the list says why it cannot change
// behaviour).
//
//	go run ./internal/sim/mutate                     # every mutant, 500 seeds each
//	go run ./internal/sim/mutate -ci                 # the CI subset (mutants marked ci)
//	go run ./internal/sim/mutate -seeds 3000 NAME... # some mutants, more seeds
//	go run ./internal/sim/mutate -check              # only report stale or ambiguous mutants
//
// Why a driver of our own and not a mutation tool: the Go module proxy list
// this project may draw from holds none (no go-mutesting, no gremlins), and
// the tools of that kind draw their mutants from operators over the whole
// AST (thousands, most of them in code the simulator does not run), which
// can neither name a mutant across a refactoring nor mutate the Lua
// scripts. Here a mutant is a named, reviewed edit of one line of real
// code — Go or Lua — matched by its text, not its line number, in any of
// several candidate files, so it survives code moving between files and
// packages (redlock's node layer is moving to internal/node): a mutant
// whose text is found nowhere is reported stale, loudly, never as a
// survivor.
//
// The scratch copy is made once per run from the files git knows of in the
// working tree (tracked and untracked, not ignored; uncommitted edits
// included), outside the repository; each mutant is applied to it,
// the simulator's test binary built there and run from its package
// directory, and the file restored. The real checkout is never written.
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"
)

// Mutant is one entry of mutants.txt.
type Mutant struct {
	Name       string
	Files      []string // candidate paths (globs allowed), relative to the repository root
	From, To   string   // the original text (unique across the candidates) and its replacement
	Why        string   // the bug a developer would write
	Equivalent string   // why it cannot change behaviour ("" if it can)
	Note       string   // what a survivor shows (a layer in front of it, a gap of the simulator)
	CI         bool     // in the CI subset
	Args       []string // extra flags for the simulator's test binary (-sim.only=semaphore, ...)
	// Test is a real-node test that catches the mutant where the simulator
	// cannot reach it ("./redlock TestName"): the driver runs that test
	// (go test -run '^TestName$' ./redlock, redis-server needed) instead
	// of the simulator, and the mutant is caught if it fails.
	Test []string
}

// Outcome is what the run of one mutant found.
type Outcome struct {
	Mutant    Mutant
	Status    string // caught, survived, stale, ambiguous, build, equivalent, error
	Invariant string
	Seed      string
	At        string // the violation's fake time from the run's start
	Wall      time.Duration
	File      string // where the mutant was applied
	Detail    string
}

func main() {
	list := flag.String("list", "", "the mutant list (default: mutants.txt beside this command)")
	seeds := flag.Int("seeds", 500, "seeds per mutant (the simulator's CI count by default)")
	ci := flag.Bool("ci", false, "run only the mutants marked ci (CI's subset)")
	check := flag.Bool("check", false, "only check that every mutant's text is found once (stale, ambiguous)")
	timeout := flag.Duration("timeout", 20*time.Minute, "per mutant")
	verbose := flag.Bool("v", false, "print each mutant's test output")
	jobs := flag.Int("j", 1, "mutants run at once (each builds and runs the simulator: 2 cores per job keep its seeds' timing)")
	flag.Parse()
	root, err := repoRoot()
	if err != nil {
		fatal(err)
	}
	if *list == "" {
		*list = filepath.Join(root, "internal", "sim", "mutate", "mutants.txt")
	}
	ms, err := parseFile(*list)
	if err != nil {
		fatal(err)
	}
	if names := flag.Args(); len(names) > 0 {
		ms = slices.DeleteFunc(ms, func(m Mutant) bool { return !slices.Contains(names, m.Name) })
		if len(ms) != len(names) {
			fatal(fmt.Errorf("some of %v are not in %s", names, *list))
		}
	}
	if *ci {
		ms = slices.DeleteFunc(ms, func(m Mutant) bool { return !m.CI })
	}
	var outs []Outcome
	bad := 0
	if *check {
		for _, m := range ms {
			o := Outcome{Mutant: m}
			if _, _, err := locate(root, m); err != nil {
				o.Status, o.Detail = statusOf(err), err.Error()
				bad++
			} else {
				o.Status = "ok"
			}
			outs = append(outs, o)
		}
		printTable(os.Stdout, outs, 0)
		if bad > 0 {
			os.Exit(1)
		}
		return
	}
	// -j workers, each with a scratch copy of its own, take the mutants
	// in turn; the table keeps the list's order.
	outs = make([]Outcome, len(ms))
	next := make(chan int)
	var wg sync.WaitGroup
	for range max(1, min(*jobs, len(ms))) {
		scratch, err := os.MkdirTemp("", "quorumlock-mutate-")
		if err != nil {
			fatal(err)
		}
		defer os.RemoveAll(scratch)
		if err := copyRepo(root, scratch); err != nil {
			fatal(err)
		}
		wg.Go(func() {
			for k := range next {
				m := ms[k]
				o := run(scratch, m, *seeds, *timeout, *verbose)
				fmt.Fprintf(os.Stderr, "mutate: %-32s %-10s %s %s %s (%v)\n", m.Name, o.Status, o.Invariant, o.Seed, o.At, o.Wall.Round(time.Second))
				outs[k] = o
			}
		})
	}
	for k := range ms {
		next <- k
	}
	close(next)
	wg.Wait()
	for _, o := range outs {
		if o.Status != "caught" && o.Status != "equivalent" {
			bad++
		}
	}
	printTable(os.Stdout, outs, *seeds)
	if bad > 0 {
		os.Exit(1)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "mutate:", err)
	os.Exit(2)
}

func repoRoot() (string, error) {
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		return "", fmt.Errorf("git rev-parse --show-toplevel: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// parseFile reads a mutant list: records separated by blank lines, each
// line a keyword and its value ("name", "in", "from", "to", "why",
// "equivalent", "note", "args", and "ci" alone); # starts a comment line.
func parseFile(path string) ([]Mutant, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var ms []Mutant
	var cur *Mutant
	names := map[string]bool{}
	flush := func(line int) error {
		if cur == nil {
			return nil
		}
		m := *cur
		cur = nil
		switch {
		case m.Name == "" || len(m.Files) == 0 || m.From == "":
			return fmt.Errorf("%s:%d: a mutant needs name, in and from", path, line)
		case names[m.Name]:
			return fmt.Errorf("%s:%d: mutant %s twice", path, line, m.Name)
		case m.From == m.To:
			return fmt.Errorf("%s:%d: mutant %s changes nothing", path, line, m.Name)
		}
		names[m.Name] = true
		ms = append(ms, m)
		return nil
	}
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		n++
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") {
			continue
		}
		if trimmed == "" {
			if err := flush(n); err != nil {
				return nil, err
			}
			continue
		}
		key, val, _ := strings.Cut(trimmed, " ")
		val = strings.TrimSpace(val)
		if cur == nil {
			cur = &Mutant{}
		}
		switch key {
		case "name":
			cur.Name = val
		case "in":
			cur.Files = strings.Fields(val)
		case "from":
			cur.From = val
		case "to":
			cur.To = val
		case "why":
			cur.Why = joinText(cur.Why, val)
		case "equivalent":
			cur.Equivalent = joinText(cur.Equivalent, val)
		case "note":
			cur.Note = joinText(cur.Note, val)
		case "args":
			cur.Args = strings.Fields(val)
		case "ci":
			cur.CI = true
		case "test":
			cur.Test = strings.Fields(val)
			if len(cur.Test) != 2 {
				return nil, fmt.Errorf("%s:%d: test wants a package and a test name", path, n)
			}
		default:
			return nil, fmt.Errorf("%s:%d: unknown keyword %q", path, n, key)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if err := flush(n); err != nil {
		return nil, err
	}
	return ms, nil
}

func joinText(a, b string) string {
	if a == "" {
		return b
	}
	return a + " " + b
}

var (
	errStale     = errors.New("stale")
	errAmbiguous = errors.New("ambiguous")
)

func statusOf(err error) string {
	switch {
	case errors.Is(err, errStale):
		return "stale"
	case errors.Is(err, errAmbiguous):
		return "ambiguous"
	}
	return "error"
}

// locate finds the one candidate file under root that holds m.From, once.
func locate(root string, m Mutant) (string, []byte, error) {
	var found []string
	var data []byte
	count := 0
	for _, pat := range m.Files {
		paths, err := filepath.Glob(filepath.Join(root, pat))
		if err != nil {
			return "", nil, err
		}
		for _, p := range paths {
			b, err := os.ReadFile(p)
			if err != nil {
				return "", nil, err
			}
			if k := bytes.Count(b, []byte(m.From)); k > 0 {
				count += k
				rel, _ := filepath.Rel(root, p)
				found = append(found, rel)
				data = b
			}
		}
	}
	switch {
	case count == 0:
		return "", nil, fmt.Errorf("%w: %q is in none of %v", errStale, m.From, m.Files)
	case count > 1:
		return "", nil, fmt.Errorf("%w: %q is found %d times (%v)", errAmbiguous, m.From, count, found)
	}
	return found[0], data, nil
}

// copyRepo copies the files git knows of in root's working tree to dst.
func copyRepo(root, dst string) error {
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("git ls-files: %w", err)
	}
	for _, rel := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		src := filepath.Join(root, rel)
		st, err := os.Lstat(src)
		if err != nil || !st.Mode().IsRegular() {
			continue // deleted in the working tree, or a symlink
		}
		b, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		p := filepath.Join(dst, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, b, st.Mode().Perm()); err != nil {
			return err
		}
	}
	return nil
}

var (
	failedRE = regexp.MustCompile(`seed (\d+) failed \(replay`)
	violRE   = regexp.MustCompile(`VIOLATION (\S+) at (\S+):`)
)

// run applies m in scratch, runs the simulator's seeds with -sim.failfast,
// and restores the file.
func run(scratch string, m Mutant, seeds int, timeout time.Duration, verbose bool) Outcome {
	o := Outcome{Mutant: m}
	if m.Equivalent != "" {
		o.Status = "equivalent"
		return o
	}
	rel, orig, err := locate(scratch, m)
	if err != nil {
		o.Status, o.Detail = statusOf(err), err.Error()
		return o
	}
	o.File = rel
	path := filepath.Join(scratch, rel)
	if err := os.WriteFile(path, bytes.Replace(orig, []byte(m.From), []byte(m.To), 1), 0o644); err != nil {
		o.Status, o.Detail = "error", err.Error()
		return o
	}
	defer os.WriteFile(path, orig, 0o644)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if len(m.Test) == 2 {
		return runTest(ctx, scratch, o, start, verbose)
	}
	bin := filepath.Join(scratch, "sim.test")
	// No -trimpath: the standard library and the dependencies are then
	// served by the build cache of any earlier build (.ci/run's simulator
	// step, a go test), and the module's packages are built once per
	// scratch copy (the mutated ones again per mutant). With -trimpath the
	// first mutant of a cache that never built with it compiled the
	// standard library again: the CI subset took 306 s from a cold cache,
	// 2m47s of it the first mutant.
	build := exec.CommandContext(ctx, "go", "test", "-c", "-o", bin, "./internal/sim")
	build.Dir = scratch
	if out, err := build.CombinedOutput(); err != nil {
		o.Status, o.Detail = "build", firstLines(string(out), 5)
		return o
	}
	args := append([]string{"-test.run", "TestSim$", "-test.count=1", "-test.timeout=0",
		fmt.Sprintf("-sim.seeds=%d", seeds), "-sim.failfast"}, m.Args...)
	test := exec.CommandContext(ctx, bin, args...)
	test.Dir = filepath.Join(scratch, "internal", "sim")
	out, err := test.CombinedOutput()
	o.Wall = time.Since(start)
	if verbose {
		os.Stderr.Write(out)
	}
	if ctx.Err() != nil {
		o.Status, o.Detail = "error", "timed out after "+timeout.String()
		return o
	}
	if err == nil {
		o.Status = "survived"
		return o
	}
	o.Status = "caught"
	// The lowest failing seed and its first violation.
	text := string(out)
	best := -1
	for _, loc := range failedRE.FindAllStringSubmatchIndex(text, -1) {
		var s int
		fmt.Sscan(text[loc[2]:loc[3]], &s)
		if best >= 0 && s >= best {
			continue
		}
		if v := violRE.FindStringSubmatch(text[loc[1]:]); v != nil {
			best, o.Seed, o.Invariant, o.At = s, text[loc[2]:loc[3]], v[1], v[2]
		}
	}
	if best < 0 {
		// It failed, but not with a seed's violation: a panic, a
		// deadlock, a build of the test binary's own checks.
		o.Status, o.Detail = "error", firstLines(text, 8)
	}
	return o
}

// runTest runs the mutant's real-node test (Mutant.Test) in scratch, where
// the mutant is applied: caught if it fails, survived if it passes.
func runTest(ctx context.Context, scratch string, o Outcome, start time.Time, verbose bool) Outcome {
	pkg, name := o.Mutant.Test[0], o.Mutant.Test[1]
	test := exec.CommandContext(ctx, "go", "test", "-count=1", "-run", "^"+name+"$", pkg)
	test.Dir = scratch
	out, err := test.CombinedOutput()
	o.Wall = time.Since(start)
	if verbose {
		os.Stderr.Write(out)
	}
	switch {
	case ctx.Err() != nil:
		o.Status, o.Detail = "error", "timed out"
	case err == nil:
		o.Status = "survived"
	case strings.Contains(string(out), "--- FAIL: "+name):
		o.Status, o.Invariant, o.Seed, o.At = "caught", name+" ("+pkg+")", "-", "-"
	default:
		o.Status, o.Detail = "error", firstLines(string(out), 8)
	}
	return o
}

func firstLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[:min(n, len(lines))], "\n")
}

// printTable prints the outcomes as a Markdown table (docs/simulation.md
// carries it) and the counts.
func printTable(w io.Writer, outs []Outcome, seeds int) {
	fmt.Fprintln(w, "| mutant | the bug | file | caught by | seed | at | wall |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
	counts := map[string]int{}
	for _, o := range outs {
		counts[o.Status]++
		by, seed, at, wall := o.Status, "", "", ""
		switch o.Status {
		case "caught":
			by, seed, at, wall = "`"+o.Invariant+"`", o.Seed, o.At, o.Wall.Round(time.Second).String()
		case "survived":
			by = fmt.Sprintf("survived %d seeds", seeds)
			if o.Mutant.Note != "" {
				by += ": " + o.Mutant.Note
			}
			wall = o.Wall.Round(time.Second).String()
		case "equivalent":
			by = "equivalent: " + o.Mutant.Equivalent
		case "stale", "ambiguous", "build", "error":
			by = "**" + strings.ToUpper(o.Status) + "**: " + strings.ReplaceAll(o.Detail, "\n", " ")
		}
		file := o.File
		if file == "" {
			file = strings.Join(o.Mutant.Files, " ")
		}
		fmt.Fprintf(w, "| `%s` | %s | %s | %s | %s | %s | %s |\n", o.Mutant.Name, o.Mutant.Why, file, strings.ReplaceAll(by, "|", `\|`), seed, at, wall)
	}
	var keys []string
	for k := range counts {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, counts[k]))
	}
	fmt.Fprintf(w, "\n%d mutants: %s\n", len(outs), strings.Join(parts, ", "))
}
