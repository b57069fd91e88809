package redlock

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/internal/redistest"
)

// DESIGN step 4, issue 21 item 10: a request of ours held on its way past
// the node timeout, then queued in a paused node's socket for 3×TTL —
// far past the release's guard — while we Unlock, runs when the node
// resumes; its not-after bound has passed on the node's clock, so it
// changes nothing: the key never holds our token again.
func TestReal_lateRequestPausedPastGuardChangesNothing(t *testing.T) {
	t.Parallel()
	const ttl, nt = 500 * time.Millisecond, 100 * time.Millisecond
	rc := redistest.Start(t, 3)
	c := newClient(t, rc.Clients(), WithTTL(ttl), WithNodeTimeout(nt), WithAutoRenew(false))
	ctx := t.Context()
	const j = 2 // the node that gets the late request
	admin := rc.Admin(j)
	// Every command node j runs goes to its slow log, with its arguments:
	// the test sees the late acquire run.
	if err := admin.ConfigSet(ctx, "slowlog-log-slower-than", "0").Err(); err != nil {
		t.Fatal(err)
	}
	admin.ConfigSet(ctx, "slowlog-max-len", "1024")
	// The clocks learned and the scripts loaded on every node: a late
	// EVALSHA finds the script (a NOSCRIPT reply would change nothing
	// either, and prove nothing). Lock retries: a loaded machine may not
	// fit a first round (dial, TIME, NOSCRIPT, EVAL) in the node timeout.
	lock := func(res string) *Lock {
		t.Helper()
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		l, err := c.Lock(lctx, res)
		if err != nil {
			t.Fatalf("Lock(%q) = %v", res, err)
		}
		return l
	}
	for try := 0; ; try++ {
		w := lock("late-warm")
		onJ := keyOn(t, rc, j, "lock:late-warm") == w.Token()
		if err := w.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if onJ {
			break
		}
		if try == 20 {
			t.Fatalf("node %d granted none of 20 locks", j)
		}
	}
	known := func() bool {
		for i := range c.clocks {
			if c.clocks[i].est.Load() == nil {
				return false
			}
		}
		return true
	}
	if !eventually(5*time.Second, known) {
		t.Fatal("the nodes' clocks are not known 5s after the first Lock")
	}
	for trial := range 3 {
		res := "late-paused-" + string(rune('a'+trial))
		key := "lock:" + res
		admin.SlowLogReset(ctx)
		// The acquire to node j is held 4× the node timeout on its way.
		rc.SetLatency(j, 4*nt)
		l := lock(res)
		time.Sleep(20 * time.Millisecond) // the proxy has read it
		rc.SetLatency(j, 0)
		// Paused before the held request reaches it: it waits in the
		// socket. The release to node j fails meanwhile (its retries too).
		rc.Pause(j)
		if err := l.Unlock(ctx); err != nil {
			t.Fatalf("trial %d: Unlock with node %d paused = %v", trial, j, err)
		}
		time.Sleep(3 * ttl)
		rc.Resume(j)
		resumed := time.Now()
		for time.Since(resumed) < 2*ttl {
			for i := range rc.N() {
				if v := keyOn(t, rc, i, key); v == l.Token() {
					pttl := rc.Admin(i).PTTL(ctx, key).Val()
					t.Fatalf("trial %d: node %d holds our token %v after the node resumed (TTL left %v)", trial, i, time.Since(resumed), pttl)
				}
			}
			time.Sleep(2 * time.Millisecond)
		}
		// The late acquire did run on node j (after the resume): the
		// script refused it. Its arguments: keys, then token, TTL ms.
		logs, err := admin.SlowLogGet(ctx, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		ran := false
		for _, e := range logs {
			if k := slices.Index(e.Args, l.Token()); len(e.Args) > 0 && e.Args[0] == "evalsha" && k > 0 && k+1 < len(e.Args) && e.Args[k+1] == "500" {
				ran = true
			}
		}
		if !ran {
			t.Errorf("trial %d: node %d's slow log has no acquire of our token: the late request never ran, and the test proves nothing", trial, j)
		}
	}
}
