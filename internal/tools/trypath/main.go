// Command trypath measures how many files one TryLock passes through, from
// call to return: the files a reader following it meets.
//
// Run it from the module root (it needs redis-server on PATH):
//
//	go run ./internal/tools/trypath
//
// It builds itself with coverage of every package of the module, starts 3
// redis-server nodes (internal/redistest), makes a redlock.Client, warms it
// with 3 TryLocks on other resources (so first-use work such as clock probes
// and script loading is not counted), clears the coverage counters, runs one
// TryLock, writes the counters, and prints each file with a block that ran,
// with its count of blocks, then the number of files. The harness
// (internal/redistest) and this command are not counted. Background work that
// is still running when TryLock returns (stragglers, a release) may add a
// block now and then; the counters are written at once after the return.
//
// -v also lists the executed blocks (file:line.col,line.col).
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/coverage"
	"sort"
	"strings"
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

// drive builds this command with coverage, runs it with -measure and prints
// the files that the measured TryLock executed.
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
	text := filepath.Join(tmp, "cov.txt")
	conv := exec.Command("go", "tool", "covdata", "textfmt", "-i="+data, "-o="+text)
	conv.Stdout, conv.Stderr = os.Stderr, os.Stderr
	if err := conv.Run(); err != nil {
		return fmt.Errorf("go tool covdata textfmt: %w", err)
	}
	files, err := executed(text)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(files))
	for f := range files {
		names = append(names, f)
	}
	sort.Slice(names, func(i, j int) bool {
		if len(files[names[i]]) != len(files[names[j]]) {
			return len(files[names[i]]) > len(files[names[j]])
		}
		return names[i] < names[j]
	})
	for _, f := range names {
		fmt.Printf("%4d  %s\n", len(files[f]), f)
		if verbose {
			blocks := files[f]
			sort.Strings(blocks)
			for _, b := range blocks {
				fmt.Printf("        %s\n", b)
			}
		}
	}
	fmt.Printf("%d files on the TryLock path\n", len(names))
	return nil
}

// executed reads a textfmt coverage profile and returns, per file of the
// module (relative to its root), the blocks that ran at least once.
func executed(path string) (map[string][]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	seen := map[string]bool{}
	files := map[string][]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "mode:") {
			continue
		}
		// file:start.col,end.col statements count
		fields := strings.Fields(line)
		if len(fields) != 3 || fields[2] == "0" {
			continue
		}
		name, block, ok := strings.Cut(fields[0], ":")
		if !ok || !strings.HasPrefix(name, module) {
			continue
		}
		name = strings.TrimPrefix(name, module)
		if strings.HasPrefix(name, "internal/redistest/") || strings.HasPrefix(name, "internal/tools/") {
			continue
		}
		if seen[fields[0]] {
			continue
		}
		seen[fields[0]] = true
		files[name] = append(files[name], block)
	}
	return files, sc.Err()
}

// run is the measured program: one TryLock on a warm Client over 3 real
// nodes, with the coverage counters cleared just before it.
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
		l, err := c.TryLock(ctx, fmt.Sprintf("warm-%d", i))
		if err != nil {
			return fmt.Errorf("warm-up TryLock: %w", err)
		}
		if err := l.Unlock(ctx); err != nil {
			return fmt.Errorf("warm-up Unlock: %w", err)
		}
	}
	// Let the warm-up's background work (releases, stragglers) finish, so
	// that none of it is counted.
	time.Sleep(500 * time.Millisecond)
	if err := coverage.ClearCounters(); err != nil {
		return fmt.Errorf("%w (this mode must run in a binary built with -cover; run without -measure)", err)
	}
	l, err := c.TryLock(ctx, "p")
	if err != nil {
		return fmt.Errorf("measured TryLock: %w", err)
	}
	if err := coverage.WriteMetaDir(dir); err != nil {
		return err
	}
	if err := coverage.WriteCountersDir(dir); err != nil {
		return err
	}
	return l.Unlock(ctx)
}
