package redlock

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/redistest"
)

// cohortHooks records the local acquisitions and releases.
type cohortHooks struct {
	NoHooks
	localAcq, nodeAcq, localRel atomic.Int64
}

func (h *cohortHooks) Acquire(_ context.Context, i AcquireInfo) {
	if i.Err == nil && i.Local {
		h.localAcq.Add(1)
	} else if i.Err == nil {
		h.nodeAcq.Add(1)
	}
}

func (h *cohortHooks) Release(_ context.Context, i ReleaseInfo) {
	if i.Local {
		h.localRel.Add(1)
	}
}

// inLineNow returns how many Lock calls of c wait in resource's line.
func inLineNow(c *Client, resource string) int {
	c.lineMu.Lock()
	defer c.lineMu.Unlock()
	if co := c.cohorts[resource]; co != nil {
		return len(co.line)
	}
	return 0
}

// waitInLine waits until n calls of c wait in resource's line.
func waitInLine(t *testing.T, c *Client, resource string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for inLineNow(c, resource) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls in line after 10s; want %d", inLineNow(c, resource), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// requestsSettled returns requestsServed once it has stopped moving: a's
// requests to its slowest node and its clock probes may still land after
// Lock returned (under load, one of them was counted as the handoff's: "a
// local handoff sent 2 requests"). Stable over 100ms, within 10s.
func requestsSettled(t *testing.T, stats []redis.UniversalClient) int64 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	n := requestsServed(t, stats)
	for {
		time.Sleep(100 * time.Millisecond)
		m := requestsServed(t, stats)
		if m == n {
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("requests to the nodes still moving 10s after Lock returned (%d then %d)", n, m)
		}
		n = m
	}
}

// A lock unlocked while another goroutine of the Client waits for it is
// passed to it with no request to any node (INFO commandstats): the lease
// carries over (token, validity), the old *Lock is unlocked at once, the
// hooks see a local acquisition and release; the next Unlock with nobody
// waiting releases it on the nodes.
func TestCohort_handoffSendsNothing(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	h := &cohortHooks{}
	c := newClient(t, rc.Clients(), WithHooks(h), WithLocalHandoff(16, time.Minute))
	ctx := t.Context()
	a, err := c.Lock(ctx, "co:1")
	if err != nil {
		t.Fatal(err)
	}
	got := lockAsyncCtx(context.Background(), c, "co:1")
	waitInLine(t, c, "co:1", 1)
	stats := rc.Clients() // connections of their own, opened by a first INFO
	before := requestsSettled(t, stats)
	if err := a.Unlock(ctx); err != nil {
		t.Fatalf("Unlock with a waiter = %v; want nil", err)
	}
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	b := r.l
	if n := requestsServed(t, stats) - before; n != 0 {
		t.Errorf("a local handoff sent %d requests to the nodes; want 0", n)
	}
	if b.Token() != a.Token() || !b.Valid() || !b.ValidUntil().Equal(a.lease.validUntil) {
		t.Errorf("new holder: token carried %v, Valid %v, ValidUntil %v (lease's %v)", b.Token() == a.Token(), b.Valid(), b.ValidUntil(), a.lease.validUntil)
	}
	if a.Valid() {
		t.Error("old *Lock Valid after the handoff")
	}
	if err := a.Extend(ctx); !errors.Is(err, ErrNotHeld) {
		t.Errorf("old *Lock Extend = %v; want ErrNotHeld", err)
	}
	if err := a.Unlock(ctx); !errors.Is(err, ErrNotHeld) {
		t.Errorf("old *Lock Unlock again = %v; want ErrNotHeld", err)
	}
	if err := a.Detach(); !errors.Is(err, ErrNotHeld) {
		t.Errorf("old *Lock Detach = %v; want ErrNotHeld", err)
	}
	if cause := context.Cause(a.Context()); !errors.Is(cause, ErrUnlocked) {
		t.Errorf("old *Lock Context cause = %v; want ErrUnlocked", cause)
	}
	if held := c.Held(); len(held) != 1 || held[0] != b {
		t.Errorf("Held = %v; want the new *Lock only", held)
	}
	if n := requestsServed(t, stats) - before; n != 0 {
		t.Errorf("the old *Lock's calls sent %d requests; want 0", n)
	}
	if err := b.Extend(ctx); err != nil {
		t.Errorf("new *Lock Extend = %v", err)
	}
	if got, want := h.localAcq.Load(), int64(1); got != want {
		t.Errorf("local acquisitions reported = %d; want %d", got, want)
	}
	if got, want := h.localRel.Load(), int64(1); got != want {
		t.Errorf("local releases reported = %d; want %d", got, want)
	}
	select {
	case <-a.Lost():
		t.Error("old *Lock's Lost closed")
	default:
	}
	if err := b.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if !noLockKey(t, rc, "lock:co:1", 10*time.Second) {
		t.Error("key left on the nodes after the last Unlock")
	}
}

// The budget: with four goroutines of one Client passing the lock round,
// a waiter of another Client queued on the nodes gets it once the lease's
// time budget ran out, and no lease is passed on more than the count.
func TestCohort_budgetServesOtherClient(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	const budget, hold = 50 * time.Millisecond, time.Millisecond
	a := newClient(t, rc.Clients(), WithLocalHandoff(5, budget))
	b := newClient(t, rc.Clients())
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	var locals, overCount atomic.Int64
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				l, err := a.Lock(ctx, "co:2")
				if err != nil {
					continue
				}
				l.mu.Lock()
				if l.handoffs > 5 {
					overCount.Add(1)
				}
				l.mu.Unlock()
				if l.lease.cur != l || l.acquired != l.taken {
					locals.Add(1)
				}
				time.Sleep(hold)
				l.Unlock(context.Background())
			}
		})
	}
	// The other Client, queued on the nodes: each of its calls waits at
	// most two leases of the first Client (below), under load far less
	// than the 10s its ctx allows (without the bound it would wait for
	// ever).
	var longest time.Duration
	var waits []time.Duration
	for range 5 {
		start := time.Now()
		lctx, lcancel := context.WithTimeout(t.Context(), 10*time.Second)
		l, err := b.Lock(lctx, "co:2")
		lcancel()
		if err != nil {
			t.Fatalf("other Client's Lock = %v after %v", err, time.Since(start))
		}
		longest = max(longest, time.Since(start))
		waits = append(waits, time.Since(start))
		time.Sleep(hold)
		if err := l.Unlock(t.Context()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // let the first Client's goroutines have it again
	}
	cancel()
	wg.Wait()
	t.Logf("other Client's waits %v (budget %v, hold %v); %d local handoffs", waits, budget, hold, locals.Load())
	// Its first call subscribes and may poll first. Each of the others
	// has the bound of every Lock call (docs/fairness.md): G × I leases of
	// d + hold + t_n, with G = 1 and I = 2 — its attempt may still be on
	// its way to the nodes when the first Client's lease goes back, and
	// that Client's next call may take one more lease before it queues
	// (t_n allowed 10ms; 5× slack for a loaded machine: 610ms). With
	// 5 × (d + hold) it failed once beside stress-ng (373ms).
	for _, w := range waits[1:] {
		if bound := 5 * 1 * 2 * (budget + hold + 10*time.Millisecond); w > bound {
			t.Errorf("a call of the other Client waited %v; want ≤ %v (G × I × (d + hold + t_n), 5× slack)", w, bound)
		}
	}
	if locals.Load() == 0 {
		t.Error("no local handoff happened")
	}
	if n := overCount.Load(); n > 0 {
		t.Errorf("%d leases passed on more than the count", n)
	}
}

// A waiter whose ctx ends leaves the line at once; the lock, unlocked
// after, goes back through the nodes.
func TestCohort_waiterCtxEnds(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	c := newClient(t, rc.Clients())
	a, err := c.Lock(t.Context(), "co:3")
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer wcancel()
	start := time.Now()
	_, err = c.Lock(wctx, "co:3")
	if took := time.Since(start); !errors.Is(err, ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) || took > 100*time.Millisecond+quick {
		t.Errorf("Lock in line = %v after %v; want ErrNotObtained and DeadlineExceeded within %v", err, took, 100*time.Millisecond+quick)
	}
	if n := inLineNow(c, "co:3"); n != 0 {
		t.Errorf("%d calls left in line", n)
	}
	if err := a.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !noLockKey(t, rc, "lock:co:3", 10*time.Second) {
		t.Error("key left on the nodes")
	}
}

// The lease lost while a goroutine waits for it (its keys taken by
// another owner, then an Extend that finds them so, racing the holder's
// Unlock): the waiter
// gets a valid lock all the same, from the nodes when the lease is gone,
// and nothing is left on them.
func TestCohort_unlockRacesLoss(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	c := newClient(t, rc.Clients())
	for i := range 10 {
		a, err := c.Lock(t.Context(), "co:4")
		if err != nil {
			t.Fatal(err)
		}
		got := lockAsync(t, c, "co:4")
		waitInLine(t, c, "co:4", 1)
		for j := range rc.N() { // another owner's key (Extend would heal an absent one), for 100ms
			rc.Client(j).Set(t.Context(), "lock:co:4", "someone else", 100*time.Millisecond)
		}
		var wg sync.WaitGroup
		wg.Go(func() { a.Extend(context.Background()) })
		if i%2 == 0 {
			time.Sleep(time.Duration(i) * 50 * time.Microsecond)
		}
		wg.Go(func() { a.Unlock(context.Background()) })
		wg.Wait()
		r := <-got
		if r.err != nil {
			t.Fatalf("round %d: waiter's Lock = %v", i, r.err)
		}
		// It may hold a lease lost just after it got it: Extend tells.
		if err := r.l.Extend(t.Context()); err == nil {
			if n := holders(t, rc, "lock:co:4", r.l.Token()); n < 2 {
				t.Errorf("round %d: a held lock on %d nodes", i, n)
			}
		} else if !errors.Is(err, ErrLockLost) {
			t.Errorf("round %d: Extend = %v", i, err)
		}
		r.l.Unlock(t.Context())
		if !noLockKey(t, rc, "lock:co:4", 10*time.Second) {
			t.Fatalf("round %d: key left on the nodes", i)
		}
	}
}

// Close with goroutines waiting in line: they return ErrClosed at once.
func TestCohort_closeWithWaiters(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	c, err := New(rc.Clients())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Lock(t.Context(), "co:5"); err != nil {
		t.Fatal(err)
	}
	w1, w2 := lockAsync(t, c, "co:5"), lockAsync(t, c, "co:5")
	waitInLine(t, c, "co:5", 2)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for _, w := range []<-chan lockResult{w1, w2} {
		select {
		case r := <-w:
			if !errors.Is(r.err, ErrClosed) {
				t.Errorf("waiter's Lock after Close = %v; want ErrClosed", r.err)
			}
		case <-time.After(quick):
			t.Fatal("a waiter still waits after Close")
		}
	}
	if !noLockKey(t, rc, "lock:co:5", 10*time.Second) {
		t.Error("key left on the nodes after Close")
	}
}

// Fencing turns local handoff off: a goroutine that unlocked keeps
// writing with its fence, and the fenced resource refuses it once the next
// holder (served through the nodes, with a greater fence) has written.
func TestCohort_fencingRefusesFormerHolder(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	h := &cohortHooks{}
	c := newClient(t, rc.Clients(), WithFencing(true), WithHooks(h))
	store := rc.Client(0)
	a, err := c.Lock(t.Context(), "co:6")
	if err != nil {
		t.Fatal(err)
	}
	if err := FencedSet(t.Context(), store, "co:6:res", a.Fence(), "a"); err != nil {
		t.Fatal(err)
	}
	got := lockAsync(t, c, "co:6")
	// Fenced locks stay with the line: the next call contends on the
	// nodes at once, queued there.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		c.lineMu.Lock()
		co := c.cohorts["co:6"]
		contends := co != nil && co.head && co.held == nil
		c.lineMu.Unlock()
		if contends {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the second call does not contend after 10s")
		}
	}
	if err := a.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.l.Fence() <= a.Fence() || h.localAcq.Load() != 0 {
		t.Errorf("next holder's fence %d after %d, %d local acquisitions; want a greater fence, none local", r.l.Fence(), a.Fence(), h.localAcq.Load())
	}
	if err := FencedSet(t.Context(), store, "co:6:res", r.l.Fence(), "b"); err != nil {
		t.Fatal(err)
	}
	if err := FencedSet(t.Context(), store, "co:6:res", a.Fence(), "a again"); !errors.Is(err, ErrStaleFence) {
		t.Errorf("former holder's write = %v; want ErrStaleFence", err)
	}
	r.l.Unlock(t.Context())
}

// A lease lost while a goroutine of its Client waits in line, its holder
// never unlocking: the waiter contends on the nodes at once and gets the
// lock (the line is not left waiting for an Unlock that never comes).
func TestCohort_lossFreesLine(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	c := newClient(t, rc.Clients())
	a, err := c.Lock(t.Context(), "co:7")
	if err != nil {
		t.Fatal(err)
	}
	got := lockAsync(t, c, "co:7")
	waitInLine(t, c, "co:7", 1)
	for j := range rc.N() { // another owner's key, with a short TTL (Extend would heal an absent one)
		rc.Client(j).Set(t.Context(), "lock:co:7", "someone else", 300*time.Millisecond)
	}
	if err := a.Extend(t.Context()); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Extend of a lock whose keys are gone = %v; want ErrLockLost", err)
	}
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.l.Token() == a.Token() || !r.l.Valid() {
			t.Errorf("waiter got token carried %v, Valid %v; want a lock of its own from the nodes", r.l.Token() == a.Token(), r.l.Valid())
		}
		r.l.Unlock(t.Context())
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter still waits 10s after the lease in front of it was lost")
	}
	a.Unlock(t.Context())
}

// Every Lock call's bound, the local line's included (docs/fairness.md):
// with I Clients of G goroutines each contending for one resource, a call
// waits at most G × I leases (each at most the budget d plus one hold
// plus one release and grant through the nodes, t_n): ahead of it in its
// Client's line are at most G − 1 calls, each lease of its Client serves
// at least one of them, and between two of its Client's leases each other
// Client holds one lease. 2 Clients × 4 goroutines, d = 20ms, holds of
// 1ms, for 3s; t_n allowed 10ms (about 1ms measured on local nodes, more
// when a loaded machine deschedules a node), 5× slack: 1.24s. Without the
// budget (the mutant cohort-budget-ignored) one Client's line starves the
// other's for the whole run.
func TestCohort_everyCallWithinItsBound(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	const (
		clients, goroutines = 2, 4
		budget, hold, tn    = 20 * time.Millisecond, time.Millisecond, 10 * time.Millisecond
		run                 = 3 * time.Second
	)
	bound := 5 * goroutines * clients * (budget + hold + tn)
	ctx, cancel := context.WithTimeout(t.Context(), run)
	defer cancel()
	var (
		mu      sync.Mutex
		longest [clients]time.Duration
		got     [clients]int
		wg      sync.WaitGroup
	)
	for ci := range clients {
		c := newClient(t, rc.Clients(), WithLocalHandoff(DefaultLocalHandoffs, budget))
		for g := range goroutines {
			wg.Go(func() {
				first := true
				for ctx.Err() == nil {
					start := time.Now()
					l, err := c.Lock(ctx, "co:bound")
					w := time.Since(start)
					if !first || err != nil { // a Client's first call subscribes and may poll once
						mu.Lock()
						longest[ci] = max(longest[ci], w)
						mu.Unlock()
					}
					first = false
					if err != nil {
						return // the run ended while it waited: counted above
					}
					time.Sleep(hold)
					if err := l.Unlock(context.Background()); err != nil {
						t.Errorf("client %d goroutine %d: Unlock = %v", ci, g, err)
					}
					mu.Lock()
					got[ci]++
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	total := got[0] + got[1]
	t.Logf("%d acquisitions, per Client %v; longest Lock call per Client %v; bound %v", total, got, longest, bound)
	for ci := range clients {
		if longest[ci] > bound {
			t.Errorf("a Lock call of Client %d waited %v; want ≤ %v (G × I × (d + hold + t_n), 5× slack)", ci, longest[ci], bound)
		}
		if total > 0 && got[ci]*5 < total {
			t.Errorf("Client %d got %d of %d acquisitions; want ≥ 20%%", ci, got[ci], total)
		}
	}
}
