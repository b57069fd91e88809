package benchmarks

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/quorumlock/quorumlock/internal/redistest"
)

// TestMixedVersions is the rolling upgrade of issue 32: processes of this
// tree's library and of an older one (QUORUMLOCK_VERSIONS_REV, a git revision
// of this repository: default ced73d4, the last before the queue entries
// carried their own lapse) lock one resource on the same three nodes at
// once, each through one Client, for QUORUMLOCK_VERSIONS_SECONDS (default 5).
// No two hold it at once (each holder creates a directory no other holder
// may have), every process acquires, and neither version starves the other
// (each gets at least a quarter of the other's acquisitions). The old version is built from that
// revision's tree (git archive); the test is skipped unless
// QUORUMLOCK_VERSIONS=1 (it builds two binaries) or when git cannot produce
// the tree (a shallow clone).
//
//	QUORUMLOCK_VERSIONS=1 go test -run TestMixedVersions -v .
func TestMixedVersions(t *testing.T) {
	if os.Getenv("QUORUMLOCK_VERSIONS") == "" {
		t.Skip("set QUORUMLOCK_VERSIONS=1 to build the old and new versions and run them on the same keys")
	}
	rev := os.Getenv("QUORUMLOCK_VERSIONS_REV")
	if rev == "" {
		rev = baselineRev
	}
	secs := envInt(t, "QUORUMLOCK_VERSIONS_SECONDS", 5)
	tmp := t.TempDir()
	oldTree := filepath.Join(tmp, "old")
	// The old tree from git's objects (git archive: nothing in the
	// repository changes).
	if err := os.MkdirAll(oldTree, 0o755); err != nil {
		t.Fatal(err)
	}
	archive := exec.Command("sh", "-c", `git -C .. archive --format=tar "$0" | tar -x -C "$1"`, rev, oldTree)
	if out, err := archive.CombinedOutput(); err != nil {
		t.Skipf("git archive %s: %v\n%s", rev, err, out)
	}
	src, err := os.ReadFile("testdata/mixedworker/main.go")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(oldTree, "cmd", "mixedworker"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(oldTree, "cmd", "mixedworker", "main.go"), src, 0o644); err != nil {
		t.Fatal(err)
	}
	bins := map[string]string{"new": filepath.Join(tmp, "worker-new"), "old": filepath.Join(tmp, "worker-old")}
	build := func(dir, pkg, out string) {
		t.Helper()
		cmd := exec.Command("go", "build", "-o", out, pkg)
		cmd.Dir = dir
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s in %s: %v\n%s", pkg, dir, err, b)
		}
	}
	build(".", "./testdata/mixedworker", bins["new"])
	build(oldTree, "./cmd/mixedworker", bins["old"])

	rc := redistest.Start(t, 3)
	addrs := make([]string, rc.N())
	for i := range addrs {
		addrs[i] = rc.Addr(i)
	}
	held := t.TempDir()
	type result struct {
		version string
		out     string
		err     error
	}
	var (
		mu      sync.Mutex
		results []result
		wg      sync.WaitGroup
	)
	// Two processes of each version, interleaved in start order.
	for _, v := range []string{"old", "new", "old", "new"} {
		wg.Go(func() {
			var stdout, stderr bytes.Buffer
			cmd := exec.Command(bins[v], "-nodes", strings.Join(addrs, ","), "-dir", held,
				"-duration", fmt.Sprintf("%ds", secs))
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			if stderr.Len() > 0 {
				t.Logf("%s worker stderr:\n%s", v, stderr.String())
			}
			mu.Lock()
			results = append(results, result{v, strings.TrimSpace(stdout.String()), err})
			mu.Unlock()
		})
	}
	wg.Wait()
	total := map[string]int{}
	for _, r := range results {
		if r.err != nil {
			t.Errorf("%s worker: %v (%s)", r.version, r.err, r.out)
			continue
		}
		var acquired, overlaps, errs int
		if _, err := fmt.Sscanf(r.out, "acquired %d overlaps %d errors %d", &acquired, &overlaps, &errs); err != nil {
			t.Errorf("%s worker printed %q: %v", r.version, r.out, err)
			continue
		}
		t.Logf("%s worker: %s", r.version, r.out)
		total[r.version] += acquired
		if overlaps > 0 {
			t.Errorf("%s worker: %d acquisitions while another process held the resource", r.version, overlaps)
		}
		if acquired == 0 {
			t.Errorf("%s worker: no acquisition in %ds", r.version, secs)
		}
		if errs > 0 {
			t.Errorf("%s worker: %d errors", r.version, errs)
		}
	}
	t.Logf("acquisitions in %ds: old %d, new %d (load %s)", secs, total["old"], total["new"], loadavg())
	// Fair across versions: while an old version queues on the key, new
	// scripts write the entry form it reads (queue.lua), so neither
	// version's releases drop the other's waiters. Before that, an old
	// release dropped every new entry at the head: old 1,345, new 4.
	if lo, hi := min(total["old"], total["new"]), max(total["old"], total["new"]); lo*4 < hi {
		t.Errorf("acquisitions old %d, new %d; want within a factor of 4 of each other (the queue serves both versions in turn)", total["old"], total["new"])
	}
}
