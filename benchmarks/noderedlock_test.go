package benchmarks

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/internal/redistest"
	"github.com/quorumlock/quorumlock/redlock"
)

// nodeRedlockDir holds the node-redlock side of TestInterop_nodeRedlock:
// package.json pins npm "redlock" 4.2.0 and ioredis; `npm ci` there
// installs them (.ci/run does).
const nodeRedlockDir = "testdata/noderedlock"

// TestInterop_nodeRedlock: a rolling migration from node-redlock. A
// node-redlock process (npm "redlock" 4.2.0, the Node.js Redlock of the
// Redis docs) and a quorumlock Client (WithKeyPrefix("")) take turns on one
// key of three real nodes for 4s. Each side counts itself in on a marker
// key while it holds: never two holders at once, and both sides get the
// lock. A quorumlock release that finds nobody of its own queued deletes
// the key, so node-redlock's next attempt takes it; one that hands the key
// to a quorumlock waiter sets it to that waiter's token, which node-redlock
// finds taken, as it finds any holder's.
//
// Skipped without node on PATH or without `npm ci` in testdata/noderedlock,
// unless CI is set.
func TestInterop_nodeRedlock(t *testing.T) {
	if _, err := exec.LookPath("node"); err != nil {
		skipOrFail(t, "node is not on PATH (apt-get install -y nodejs npm)")
	}
	if _, err := os.Stat(filepath.Join(nodeRedlockDir, "node_modules", "redlock")); err != nil {
		skipOrFail(t, "node-redlock is not installed: (cd benchmarks/"+nodeRedlockDir+" && npm ci)")
	}
	rc := redistest.Start(t, 3)
	// A 1s node timeout: each Lock below waits at most 500ms, and a
	// request that misses a derived 200ms under load made its call a
	// "no quorum" instead of a refusal (issue 31).
	q := newRedlock(t, rc.Clients(), redlock.WithKeyPrefix(""), redlock.WithTTL(5*time.Second), redlock.WithNodeTimeout(time.Second))
	const resource, marker, run = "interop:noderedlock", "interop:inside", 4 * time.Second
	addrs := make([]string, rc.N())
	for i := range addrs {
		addrs[i] = rc.ServerAddr(i)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "interop.js", strings.Join(addrs, ","), resource,
		"4000", "2000", rc.ServerAddr(0), marker)
	cmd.Dir = nodeRedlockDir
	cmd.Stderr = os.Stderr
	var out []byte
	var nodeErr error
	var wg sync.WaitGroup
	wg.Go(func() { out, nodeErr = cmd.Output() })

	admin := rc.Admin(0)
	var acquired, overlaps int
	for end := time.Now().Add(run); time.Now().Before(end); {
		lctx, lcancel := context.WithTimeout(ctx, 500*time.Millisecond)
		l, err := q.Lock(lctx, resource)
		lcancel()
		if errors.Is(err, redlock.ErrNotObtained) || errors.Is(err, context.DeadlineExceeded) {
			continue // node-redlock held it for the 500ms this call waits
		}
		if err != nil {
			t.Fatalf("quorumlock Lock: %v", err)
		}
		acquired++
		if n, err := admin.Incr(ctx, marker).Result(); err != nil || n != 1 {
			overlaps++
			t.Errorf("quorumlock holds the lock with %d holders counted in (%v)", n, err)
		}
		time.Sleep(2 * time.Millisecond)
		admin.Decr(ctx, marker)
		if err := l.Unlock(ctx); err != nil {
			t.Errorf("quorumlock Unlock: %v", err)
		}
	}
	wg.Wait()
	if nodeErr != nil {
		t.Fatalf("node interop.js: %v", nodeErr)
	}
	var nr struct{ Acquired, Overlaps, UnlockErrors, Refused int }
	if err := json.Unmarshal(out, &nr); err != nil {
		t.Fatalf("node interop.js printed %q: %v", out, err)
	}
	t.Logf("in %v on one key: quorumlock %d acquisitions, node-redlock %d (%d refused attempts, %d unlock errors); overlaps seen: quorumlock %d, node-redlock %d",
		run, acquired, nr.Acquired, nr.Refused, nr.UnlockErrors, overlaps, nr.Overlaps)
	if nr.Overlaps > 0 {
		t.Errorf("node-redlock held the lock beside another holder %d times", nr.Overlaps)
	}
	if acquired == 0 || nr.Acquired == 0 {
		t.Errorf("quorumlock %d, node-redlock %d acquisitions; want both to get the lock", acquired, nr.Acquired)
	}
}

// skipOrFail skips t, or fails it when CI is set (CI installs what the
// test needs).
func skipOrFail(t *testing.T, why string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatal(why)
	}
	t.Skip(why)
}
