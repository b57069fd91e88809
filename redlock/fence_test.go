package redlock

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/internal/redistest"
)

// fenceRun has clients take turns on one resource and records the fence of
// every acquisition, in the order the holds happened.
type fenceRun struct {
	mu     sync.Mutex
	fences []int64
	holder int // holders at once; must never exceed 1
	bad    int
}

func (r *fenceRun) cycle(t *testing.T, c *Client, resource string) {
	// Bounded: a starved machine fails the test with a message instead of
	// running into go test's -timeout.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	l, err := c.Lock(ctx, resource, WithFencing(true), WithRetryDelay(5*time.Millisecond, 20*time.Millisecond))
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Lock = %v", err)
		}
		return
	}
	r.mu.Lock()
	r.holder++
	if r.holder > 1 {
		r.bad++
	}
	r.fences = append(r.fences, l.Fence())
	r.mu.Unlock()
	time.Sleep(time.Millisecond)
	r.mu.Lock()
	r.holder--
	r.mu.Unlock()
	_ = l.Unlock(context.Background())
}

func (r *fenceRun) check(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.bad > 0 {
		t.Errorf("%d overlapping holds", r.bad)
	}
	dec := 0
	for i := 1; i < len(r.fences); i++ {
		if r.fences[i] <= r.fences[i-1] {
			dec++
			if dec < 5 {
				t.Errorf("fence %d after %d (acquisition %d): not strictly increasing", r.fences[i], r.fences[i-1], i)
			}
		}
	}
	if len(r.fences) < 20 {
		t.Errorf("only %d acquisitions; want many", len(r.fences))
	}
	t.Logf("%d acquisitions, fences %d..%d, %d not increasing", len(r.fences), r.fences[0], r.fences[len(r.fences)-1], dec)
}

func TestReal_fenceStrictlyIncreases(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 5)
	run := &fenceRun{}
	var wg sync.WaitGroup
	for range 3 {
		// A release that fails (no majority answered in time, on a loaded
		// machine) leaves the key until its TTL: with the default 30s, a
		// few of them stalled this test for 7 minutes. 5s, with the
		// default's 1s node timeout.
		c := newClient(t, rc.Clients(), WithTTL(5*time.Second), WithNodeTimeout(time.Second))
		wg.Go(func() {
			for range 25 {
				run.cycle(t, c, "fenced")
			}
		})
	}
	wg.Wait()
	run.check(t)
}

func TestReal_fenceStrictlyIncreasesUnderMinorityFaults(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 5)
	run := &fenceRun{}
	var wg sync.WaitGroup
	for range 3 {
		c := newClient(t, rc.Clients(), WithTTL(2*time.Second))
		wg.Go(func() {
			for range 30 {
				run.cycle(t, c, "fenced")
			}
		})
	}
	// A minority at a time: pause node 0, kill node 1, restart it empty,
	// resume node 0, pause node 4.
	time.Sleep(50 * time.Millisecond)
	rc.Pause(0)
	time.Sleep(100 * time.Millisecond)
	rc.Kill(1)
	time.Sleep(100 * time.Millisecond)
	rc.Resume(0)
	rc.Restart(1)
	time.Sleep(100 * time.Millisecond)
	rc.Pause(4)
	time.Sleep(100 * time.Millisecond)
	rc.Resume(4)
	wg.Wait()
	run.check(t)
}

// A holder paused past its TTL (here: its renewals cannot get through) loses
// the lock; the next holder writes; the old holder's late write with its old
// token is refused by the resource.
func TestReal_staleHolderWriteRefused(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 5)
	a := newClient(t, rc.Clients())
	b := bystander(t, directClients(t, rc)) // the next holder
	store := rc.Admin(0)                    // the resource lives in some Redis; node 0's will do
	old, err := a.Lock(t.Context(), "acct", WithFencing(true), WithTTL(400*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if err := FencedSet(t.Context(), store, "acct:balance", old.Fence(), "100"); err != nil {
		t.Fatalf("holder's write = %v", err)
	}
	for i := range 5 {
		rc.SetLatency(i, 2*time.Second) // a's process is frozen, as far as the nodes can tell
	}
	<-old.Lost()
	next, err := b.Lock(t.Context(), "acct", WithFencing(true), WithRetryDelay(10*time.Millisecond, 30*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if next.Fence() <= old.Fence() {
		t.Fatalf("next fence %d ≤ old fence %d", next.Fence(), old.Fence())
	}
	if err := FencedSet(t.Context(), store, "acct:balance", next.Fence(), "70"); err != nil {
		t.Fatalf("next holder's write = %v", err)
	}
	// The old holder wakes up and writes with its old token.
	if err := FencedSet(t.Context(), store, "acct:balance", old.Fence(), "130"); !errors.Is(err, ErrStaleFence) {
		t.Errorf("stale write = %v; want ErrStaleFence", err)
	}
	if v := store.HGet(t.Context(), "acct:balance", "value").Val(); v != "70" {
		t.Errorf("balance = %q; want 70 (the stale write must not land)", v)
	}
	for i := range 5 {
		rc.SetLatency(i, 0)
	}
	next.Unlock(t.Context())
}

// The boundary of the guarantee: counters must survive restarts. If a
// majority of nodes restarts empty, the next holder can get a token that is
// not larger. Run with QUORUMLOCK_BOUNDARY=1.
func TestReal_fenceBoundaryMajorityRestartedEmpty(t *testing.T) {
	if os.Getenv("QUORUMLOCK_BOUNDARY") == "" {
		t.Skip("documents the boundary of the fencing guarantee; set QUORUMLOCK_BOUNDARY=1 to run")
	}
	rc := redistest.Start(t, 5)
	c := newClient(t, rc.Clients())
	var last int64
	for range 5 {
		l, err := c.Lock(t.Context(), "b", WithFencing(true))
		if err != nil {
			t.Fatal(err)
		}
		last = l.Fence()
		l.Unlock(t.Context())
	}
	for _, i := range []int{0, 1, 2} {
		rc.Restart(i) // empty: no persistence
	}
	rc.Kill(3)
	rc.Kill(4)
	l, err := c.Lock(t.Context(), "b", WithFencing(true))
	if err != nil {
		t.Fatal(err)
	}
	if l.Fence() > last {
		t.Errorf("fence %d > %d after a majority restarted empty; the violation was expected", l.Fence(), last)
	}
	t.Logf("boundary shown: fence went from %d back to %d after 3 of 5 nodes restarted empty", last, l.Fence())
	l.Unlock(t.Context())
}

func TestFencedSet_invalid(t *testing.T) {
	t.Parallel()
	_, nodes := miniNodes(t, 1)
	s := nodes[0]
	if err := FencedSet(t.Context(), s, "", 1, "v"); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("FencedSet(empty key) = %v; want ErrInvalidArgument", err)
	}
	if err := FencedSet(t.Context(), s, "k", 0, "v"); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("FencedSet(token 0) = %v; want ErrInvalidArgument", err)
	}
}
