package redlock

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/internal/redistest"
	"github.com/quorumlock/quorumlock/internal/scripts"
)

func TestReal_wakeUpOnRelease(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 5)
	// A node timeout of 3s: at the default 1s, every attempt of the waiter
	// missed it on all 5 nodes in the full suite beside stress-ng (load
	// 10-20), until its Lock gave up.
	a := newClient(t, rc.Clients(), WithNodeTimeout(3*time.Second))
	b := newClient(t, rc.Clients(), WithNodeTimeout(3*time.Second))
	held, err := a.Lock(t.Context(), "w")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan time.Time, 1)
	go func() {
		// The fallback delay is 10-11s from its refused attempt: only a
		// wake-up can be faster.
		l, err := b.Lock(t.Context(), "w", WithRetryDelay(10*time.Second, 11*time.Second))
		if err != nil {
			t.Errorf("waiter Lock = %v", err)
			close(got)
			return
		}
		got <- time.Now()
		l.Unlock(context.Background())
	}()
	// The waiter is queued on a majority: its refused attempt is over.
	if !eventually(10*time.Second, func() bool { return queuedOnMajority(t, rc, "lock:w"+scripts.QueueSuffix, 1) }) {
		t.Fatal("the waiter never queued on a majority")
	}
	if err := held.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	unlocked := time.Now()
	select {
	case at, ok := <-got:
		// Measured a few ms unloaded, 408ms in the full suite beside
		// stress-ng (load 10-20); 5s keeps 10× that, and is half the
		// fallback.
		if d := at.Sub(unlocked); ok && d > 5*time.Second {
			t.Errorf("waiter acquired %v after Unlock; want a wake-up, not the 10-11s retry delay", d)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("waiter did not acquire")
	}
}

func TestReal_fallbackWithoutMessage(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 5)
	a := newClient(t, rc.Clients())
	b := newClient(t, rc.Clients())
	// The holder never unlocks: its fixed lease expires, and no release is
	// ever published. The waiter must get the lock through its retry delay.
	if _, err := a.Lock(t.Context(), "f", WithTTL(300*time.Millisecond), WithAutoRenew(false)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	l, err := b.Lock(t.Context(), "f", WithRetryDelay(50*time.Millisecond, 100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("waiter took %v to get an expired lock", d)
	}
	l.Unlock(t.Context())
}

func TestReal_subscriptionDroppedStillAcquires(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 5)
	a := newClient(t, rc.Clients())
	b := newClient(t, rc.Clients())
	held, err := a.Lock(t.Context(), "d")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		l, err := b.Lock(t.Context(), "d", WithRetryDelay(200*time.Millisecond, 300*time.Millisecond))
		if err == nil {
			l.Unlock(context.Background())
		}
		got <- err
	}()
	time.Sleep(200 * time.Millisecond)
	// Drop every subscription connection, then release at once: the
	// message may be lost; the fallback must still get the waiter the lock.
	for i := range 5 {
		rc.Admin(i).ClientKillByFilter(t.Context(), "TYPE", "pubsub")
	}
	held.Unlock(t.Context())
	select {
	case err := <-got:
		if err != nil {
			t.Errorf("waiter Lock = %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("waiter did not acquire after the subscription was dropped")
	}
}

// contend runs g goroutines on one resource for d, each looping
// Lock → hold briefly → Unlock (with an immediate re-Lock, the pattern that
// starves waiters when a releaser can take the lock straight back).
type contention struct {
	acquisitions int
	handoffs     int // acquisitions by another goroutine than the previous holder
	maxWait      time.Duration
	waits        []time.Duration
	perGoroutine []int
	overlaps     int
	elapsed      time.Duration
}

// contend runs g goroutines for at least d, and on until each has acquired
// the lock once (a busy machine makes fewer rounds in d), at most until
// limit.
func contend(t *testing.T, clients []*Client, g int, d, limit time.Duration, opts ...Option) contention {
	t.Helper()
	var (
		mu      sync.Mutex
		res     = contention{perGoroutine: make([]int, g)}
		last    = -1
		holding atomic.Int32
	)
	ctx, cancel := context.WithTimeout(t.Context(), limit)
	defer cancel()
	begin := time.Now()
	done := func() bool {
		if time.Since(begin) < d {
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		return !slices.Contains(res.perGoroutine, 0)
	}
	var wg sync.WaitGroup
	for id := range g {
		c := clients[id%len(clients)]
		wg.Go(func() {
			for ctx.Err() == nil && !done() {
				start := time.Now()
				l, err := c.Lock(ctx, "hot", opts...)
				if err != nil {
					if ctx.Err() == nil {
						t.Errorf("Lock = %v", err)
					}
					return
				}
				wait := time.Since(start)
				if holding.Add(1) > 1 {
					mu.Lock()
					res.overlaps++
					mu.Unlock()
				}
				mu.Lock()
				res.acquisitions++
				res.perGoroutine[id]++
				if last != id && last != -1 {
					res.handoffs++
				}
				last = id
				res.waits = append(res.waits, wait)
				res.maxWait = max(res.maxWait, wait)
				mu.Unlock()
				time.Sleep(time.Millisecond) // the critical section
				holding.Add(-1)
				_ = l.Unlock(context.Background())
			}
		})
	}
	wg.Wait()
	res.elapsed = time.Since(begin)
	return res
}

// The nodes' queue serves 16 goroutines of 4 Clients about in turn. The
// local handoff is off here: it serves a Client's goroutines in batches
// (a lease passed on up to 16 times within 10ms), so a round robin across
// goroutines is not its model — its bound, G × I leases, is
// TestCohort_everyCallWithinItsBound's. With it on, this test's longest
// wait reached 9–15× a round robin's under load (issue 43's helper: 5 of
// 6 failures in loaded group runs).
func TestReal_contentionNoStarvation(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 5)
	var clients []*Client
	for range 4 {
		clients = append(clients, newClient(t, rc.Clients(), WithLocalHandoff(0, 0)))
	}
	const g = 16
	res := contend(t, clients, g, 4*time.Second, time.Minute)
	slices.Sort(res.waits)
	share := float64(res.handoffs) / float64(max(res.acquisitions-1, 1))
	// fair is the wait of a strict round robin at this run's pace: g
	// acquisitions of the others, each taking elapsed/acquisitions.
	fair := time.Duration(g) * res.elapsed / time.Duration(max(res.acquisitions, 1))
	t.Logf("%d goroutines, 4 clients, 5 nodes, %v: %d acquisitions, %.0f%% handed to another goroutine, wait p50 %v p99 %v max %v (%.1f× a round robin's %v), per goroutine %v",
		g, res.elapsed.Round(time.Millisecond), res.acquisitions, 100*share, res.waits[len(res.waits)/2], res.waits[len(res.waits)*99/100], res.maxWait,
		float64(res.maxWait)/float64(max(fair, 1)), fair.Round(time.Millisecond), res.perGoroutine)
	if res.overlaps > 0 {
		t.Errorf("%d overlapping holds", res.overlaps)
	}
	for id, n := range res.perGoroutine {
		if n == 0 {
			t.Errorf("goroutine %d never acquired in %v: starved", id, res.elapsed.Round(time.Millisecond))
		}
	}
	if share < 0.5 {
		t.Errorf("%.0f%% of handoffs went to another goroutine; want most", 100*share)
	}
	// The bound that matters: no goroutine waits many rounds of the
	// others. It is relative to this run's pace, since a loaded machine
	// makes every round slower (a fixed 3s failed at load 13-15 with a
	// 4s run of 28-53 acquisitions). Measured longest waits: 2.2–3.0× a
	// round robin's wait in 10 runs with stress-ng beside (load 6–8),
	// 1.6–2.7× in full runs at load 13–15, 2.8× idle; 15× is 5× the worst
	// of those. It still fails a goroutine passed over for 15 rounds, and
	// one that never acquires (above).
	if res.maxWait > 15*fair {
		t.Errorf("longest wait %v; want at most 15× a round robin's wait (%v)", res.maxWait, fair)
	}
}

func TestWakeups_leaveUnregistersAndDequeues(t *testing.T) {
	t.Parallel()
	ms, nodes := miniNodes(t, 3)
	c := newClient(t, nodes)
	held, err := c.Lock(t.Context(), "u")
	if err != nil {
		t.Fatal(err)
	}
	other := newClient(t, nodes)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if _, err := other.Lock(ctx, "u"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock = %v; want DeadlineExceeded", err)
	}
	other.wake.mu.Lock()
	left := len(other.wake.waiters)
	other.wake.mu.Unlock()
	if left != 0 {
		t.Errorf("%d waiters left registered after the waiter gave up; want 0", left)
	}
	// The call's cleanup runs in the background once ctx has ended.
	for i, m := range ms {
		if !eventually(5*time.Second, func() bool { members, _ := m.ZMembers("lock:u" + scripts.QueueSuffix); return len(members) == 0 }) {
			members, _ := m.ZMembers("lock:u" + scripts.QueueSuffix)
			t.Errorf("node %d: queue %q after the waiter gave up; want empty", i, members)
		}
	}
	held.Unlock(t.Context())
}
