package redlock

import (
	"context"
	"errors"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/internal/redistest"
	"github.com/quorumlock/quorumlock/internal/scripts"
	"github.com/quorumlock/quorumlock/renew"
)

// Tests of the promises the library keeps on fault paths, one per defect
// found in review (issue 12). Each failed before its fix.

// neverHolds reports whether, for d, node i never shows token in key.
func neverHolds(t *testing.T, rc *redistest.Cluster, i int, key, token string, d time.Duration) bool {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if v := keyOn(t, rc, i, key); v == token {
			pttl, _ := rc.Admin(i).PTTL(context.Background(), key).Result()
			t.Logf("node %d holds our token again, PTTL %v", i, pttl)
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// subscribed opens a raw subscription to channel on node i, as another
// client waiting for the lock would.
func subscribed(t *testing.T, rc *redistest.Cluster, i int, channel string) {
	t.Helper()
	ps := rc.Admin(i).Subscribe(t.Context(), channel)
	t.Cleanup(func() { ps.Close() })
	if _, err := ps.Receive(t.Context()); err != nil {
		t.Fatalf("SUBSCRIBE %s on node %d: %v", channel, i, err)
	}
}

// 1. An Extend of ours delayed on a slow node lands after our Unlock: it
// must not set the key again, with a subscriber on the node or not, and
// whatever the key held when the release ran.
func TestReal_lateExtendAfterUnlockSetsNothing(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name       string
		subscriber bool // someone is subscribed to the wake-up channel
		foreign    bool // when the release runs, node 0's key holds another token
	}{
		{"with a subscriber", true, false},
		{"without a subscriber", false, false},
		{"another token holds the key at release", false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rc := redistest.Start(t, 3)
			c := newClient(t, rc.Clients())
			const key = "lock:late"
			if tc.subscriber {
				subscribed(t, rc, 0, key)
			}
			// TTL 6s: a node timeout of 600ms, which nodes 1 and 2 must
			// meet while node 0's request is held twice as long (at TTL
			// 2s, 200ms against 400ms, all 3 missed it in the full suite
			// beside stress-ng, load 8-11).
			l, err := c.Lock(t.Context(), "late", WithTTL(6*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Extend(t.Context()); err != nil { // loads the script
				t.Fatal(err)
			}
			rc.SetLatency(0, 1200*time.Millisecond)
			if err := l.Extend(t.Context()); err != nil { // node 0's request is held 1.2s
				t.Fatalf("Extend with one slow node = %v", err)
			}
			time.Sleep(750 * time.Millisecond)
			rc.SetLatency(0, 0)
			if tc.foreign {
				rc.Admin(0).Set(t.Context(), key, "another-token", time.Minute)
			}
			if err := l.Unlock(t.Context()); err != nil {
				t.Fatalf("Unlock = %v", err)
			}
			if tc.foreign {
				rc.Admin(0).Del(t.Context(), key) // the other holder releases
			}
			// Unlock returns once a majority confirmed; node 0's release
			// lands a moment later (step 4).
			if !eventually(2*time.Second, func() bool { return keyOn(t, rc, 0, key) != l.Token() }) {
				t.Fatalf("node 0 still holds our token after Unlock")
			}
			if !neverHolds(t, rc, 0, key, l.Token(), 5*time.Second) {
				t.Errorf("node 0 holds our token again after Unlock: a late request of ours set the key")
			}
		})
	}
}

// 2. Lock never returns a lock past its validity, whatever the waiter's
// subscription connections are doing: here one hangs in its re-dial (the
// node was restarted and paused at once) while the holder unlocks.
func TestReal_lockNeverReturnsExpiredWhileSubscriptionHangs(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	a := newClient(t, rc.Clients())
	// A node timeout of 300ms, the most under the 333ms renew interval of
	// b's 1s TTL: at 100ms, b's attempts missed it in the full suite (load
	// 11-13), and with its 5s retry delay it never queued in 10s.
	const bTimeout = 300 * time.Millisecond
	b := newClient(t, rc.Clients(), WithNodeTimeout(bTimeout))
	held, err := a.Lock(t.Context(), "hang", WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		l   *Lock
		at  time.Time
		err error
	}
	got := make(chan result, 1)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	go func() {
		l, err := b.Lock(ctx, "hang", WithTTL(time.Second), WithAutoRenew(false), WithRetryDelay(5*time.Second, 5*time.Second))
		got <- result{l, time.Now(), err}
	}()
	// Wait until b listens on every node and waits in the queue (a few
	// of its attempts, 5s apart, if the first missed the node timeout).
	if !eventually(20*time.Second, func() bool {
		for i := range 3 {
			n, err := rc.Admin(i).PubSubNumSub(t.Context(), b.wake.channel).Result()
			if err != nil || n[b.wake.channel] == 0 {
				return false
			}
		}
		// In the queue on nodes 0 and 1, which stay up: its handoff
		// comes from them.
		for i := range 2 {
			if q, _ := rc.Admin(i).ZCard(t.Context(), "lock:hang"+scripts.QueueSuffix).Result(); q != 1 {
				return false
			}
		}
		return true
	}) {
		t.Fatal("the waiter never subscribed")
	}
	rc.Kill(2)
	rc.Restart(2)
	rc.Pause(2) // b's reader re-dials node 2 and hangs in the handshake
	t.Cleanup(func() { rc.Resume(2) })
	time.Sleep(300 * time.Millisecond) // the reader notices and re-dials
	unlocked := time.Now()
	if err := held.Unlock(t.Context()); err != nil && !errors.Is(err, ErrNoQuorum) {
		t.Fatalf("Unlock = %v", err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("waiter Lock = %v", r.err)
	}
	defer r.l.Unlock(context.Background())
	if !r.at.Before(r.l.ValidUntil()) {
		t.Errorf("Lock returned %v after ValidUntil", r.at.Sub(r.l.ValidUntil()))
	}
	// A woken waiter acquires in milliseconds; 2s is the bound of a hang.
	if d := r.at.Sub(unlocked); d > 2*time.Second {
		t.Errorf("waiter's Lock returned %v after the Unlock; want promptly", d)
	}
	// Close, too, is bounded while the subscription hangs.
	start := time.Now()
	b.Close()
	if d := time.Since(start); d > bTimeout+time.Second {
		t.Errorf("Close took %v with a hanging subscription; want node timeout + 1s at most", d)
	}
}

// 3. A failed attempt's cleanup wakes nobody: with one node restarted empty
// (a waiter is granted there, then gives it back), waiters attempt no more
// often than with healthy nodes, and no wake-up message is sent at all.
func TestReal_restartedNodeCausesNoWakeUpStorm(t *testing.T) {
	t.Parallel()
	run := func(t *testing.T, restart bool) (attempts int64, messages int) {
		rc := redistest.Start(t, 3)
		holder := newClient(t, rc.Clients())
		l, err := holder.Lock(t.Context(), "storm", WithTTL(30*time.Second), WithAutoRenew(false))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Unlock(context.Background())
		if restart {
			rc.Restart(2) // empty: node 2 grants until the holder heals it
		}
		var msgs atomic.Int32
		for i := range 3 {
			ps := rc.Admin(i).Subscribe(t.Context(), "lock:storm")
			t.Cleanup(func() { ps.Close() })
			if _, err := ps.Receive(t.Context()); err != nil {
				t.Fatal(err)
			}
			go func() {
				for range ps.Channel() {
					msgs.Add(1)
				}
			}()
		}
		var n atomic.Int64
		hooks := attemptCounter{n: &n}
		var wg sync.WaitGroup
		for range 4 {
			w := newClient(t, rc.Clients(), WithHooks(hooks))
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(t.Context(), time.Second)
				defer cancel()
				if l, err := w.Lock(ctx, "storm"); err == nil {
					l.Unlock(context.Background())
					t.Errorf("a waiter acquired a held lock")
				}
			})
		}
		wg.Wait()
		time.Sleep(50 * time.Millisecond) // messages in flight
		return n.Load(), int(msgs.Load())
	}
	control, _ := run(t, false)
	faulty, msgs := run(t, true)
	t.Logf("attempts in 1s by 4 waiters: %d healthy, %d with a node restarted empty; %d wake-up messages", control, faulty, msgs)
	// A control starved by a loaded machine is no baseline: the most the
	// retry delay (50ms at least) allows 4 waiters in 1s is about 80.
	if limit := max(2*control, int64(4*(time.Second/DefaultRetryDelayMin))+8); faulty > limit {
		t.Errorf("%d attempts with a node restarted empty; want at most %d (2x the healthy %d)", faulty, limit, control)
	}
	if msgs != 0 {
		t.Errorf("%d wake-up messages with no release; want none", msgs)
	}
}

type attemptCounter struct {
	NoHooks
	n *atomic.Int64
}

func (h attemptCounter) Attempt(context.Context, AttemptInfo) { h.n.Add(1) }

// 4. An outage is ErrNoQuorum with node errors whatever ends the call, and
// contention is ErrNotObtained even when ctx ends mid-attempt.
func TestReal_outageIsNoQuorumWhateverEndsTheCall(t *testing.T) {
	t.Parallel()
	for _, fault := range []string{"killed", "paused"} {
		for _, d := range []time.Duration{500 * time.Millisecond, 2 * time.Second} {
			t.Run(fault+"/ctx "+d.String(), func(t *testing.T) {
				t.Parallel()
				rc := redistest.Start(t, 3)
				c := newClient(t, rc.Clients())
				for i := 1; i < 3; i++ {
					if fault == "killed" {
						rc.Kill(i)
					} else {
						rc.Pause(i)
						t.Cleanup(func() { rc.Resume(i) })
					}
				}
				ctx, cancel := context.WithTimeout(t.Context(), d)
				defer cancel()
				_, err := c.Lock(ctx, "outage")
				var ne *NodeError
				if !errors.Is(err, ErrNoQuorum) || errors.Is(err, ErrNotObtained) || !errors.As(err, &ne) {
					t.Errorf("Lock with 2 of 3 nodes %s = %v; want ErrNoQuorum with node errors, not ErrNotObtained", fault, err)
				}
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("Lock = %v; want the ctx error joined", err)
				}
			})
		}
	}
	t.Run("contended, ctx ends mid-attempt", func(t *testing.T) {
		t.Parallel()
		rc := redistest.Start(t, 3)
		a := bystander(t, rc.Clients()) // it holds the lock throughout
		// A node timeout far above the ctx: nodes are slow, not failed.
		b := newClient(t, rc.Clients(), WithNodeTimeout(3*time.Second))
		held, err := a.Lock(t.Context(), "busy")
		if err != nil {
			t.Fatal(err)
		}
		defer held.Unlock(context.Background())
		for i := range 3 {
			rc.SetLatency(i, 60*time.Millisecond) // each attempt takes 120ms
		}
		for trial := range 5 {
			// The deadline falls inside an attempt (go-redis may report
			// it as an i/o timeout).
			ctx, cancel := context.WithTimeout(t.Context(), time.Duration(1500+37*trial)*time.Millisecond)
			_, err := b.Lock(ctx, "busy", WithRetryDelay(time.Millisecond, 2*time.Millisecond), WithWakeUp(false))
			cancel()
			if !errors.Is(err, ErrNotObtained) || errors.Is(err, ErrNoQuorum) {
				t.Errorf("trial %d: contended Lock whose ctx ended mid-attempt = %v; want ErrNotObtained", trial, err)
			}
		}
	})
}

// 5. A renewal that races Close (it finds the Client closed) reports no
// loss: no Lost(), no Lost hook; Close ends the lock with cause ErrClosed.
func TestLock_renewalRacingCloseReportsNoLoss(t *testing.T) {
	t.Parallel()
	for _, batched := range []bool{false, true} {
		t.Run("batched="+strconv.FormatBool(batched), func(t *testing.T) {
			t.Parallel()
			_, nodes := miniNodes(t, 3)
			var lost atomic.Int32
			c := newClient(t, nodes, WithHooks(lostCounter{n: &lost}))
			l, err := c.Lock(t.Context(), "race")
			if err != nil {
				t.Fatal(err)
			}
			// The race: Close has marked the Client closed, the scheduler
			// has not stopped yet, and a renewal starts.
			c.mu.Lock()
			c.closed = true
			c.mu.Unlock()
			var rerr error
			if batched {
				rerr = batcher{c}.RenewBatch(context.Background(), []renew.Target{watch{l}}, []time.Time{time.Now()})[0]
			} else {
				rerr = renewError(watch{l}.Renew(context.Background(), time.Now()))
			}
			if !errors.Is(rerr, ErrClosed) {
				t.Fatalf("renewal after closed = %v; want ErrClosed", rerr)
			}
			watch{l}.Lose(rerr) // what the scheduler does with a permanent error
			select {
			case <-l.Lost():
				t.Errorf("Lost() closed by a renewal that raced Close")
			default:
			}
			if n := lost.Load(); n != 0 {
				t.Errorf("Lost hook called %d times; want 0", n)
			}
			c.mu.Lock()
			c.closed = false
			c.mu.Unlock()
			c.Close()
			if cause := context.Cause(l.Context()); !errors.Is(cause, ErrClosed) {
				t.Errorf("Context cause after Close = %v; want ErrClosed", cause)
			}
		})
	}
}

type lostCounter struct {
	NoHooks
	n *atomic.Int32
}

func (h lostCounter) Lost(context.Context, LostInfo) { h.n.Add(1) }

// 6. Close with a node that hangs costs the node timeout plus a short
// grace on top of what the healthy nodes need for the releases (issue 21:
// those are sent chunk after chunk while a node answers, so that time
// grows with the locks: about 14µs per lock per node, 7.1s for 100,000
// locks on 5 nodes; the bound allows 100µs per lock). The 4 healthy nodes
// keep no lock key. QUORUMLOCK_CLOSE_LOCKS sets the number of locks (the
// issue's figure is 100,000), for a quiet machine, and with it the
// stricter grace of 1s.
//
// By default, for `go test ./...` on a loaded machine: 300 locks and node
// timeout + 2s. With 1,000 locks at load 14–20, the release pipelines (1,000
// scripts per node under -race) once missed the 2s node timeout on 3 of 5
// nodes and Close took 3.4s; otherwise 2.04–2.31s. With 300 locks:
// 2.01–2.32s in 10 runs at load 13–15, so at most 316ms past the node
// timeout, and 2s is 6× that. 300 locks are still 5 rounds of 64 for a
// Close that scales with the locks: 11s here.
func TestReal_closeBoundedWithManyLocksAndAPausedNode(t *testing.T) {
	t.Parallel()
	locks, grace := 300, 2*time.Second
	if s := os.Getenv("QUORUMLOCK_CLOSE_LOCKS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			t.Fatalf("QUORUMLOCK_CLOSE_LOCKS=%q: want a positive number", s)
		}
		locks, grace = n, time.Second
	}
	rc := redistest.Start(t, 5)
	// A node timeout a loaded machine does not reach while acquiring: with
	// 200ms, acquires on a 2-core machine at load 14–20 kept timing out and
	// retrying, and this test ran for minutes before Close. Close's bound
	// below is still far from what a Close that scales with the locks
	// takes: one round of node timeout + 250ms per 64 locks.
	const timeout = 2 * time.Second
	c, err := New(rc.Clients(), WithTTL(30*time.Second), WithNodeTimeout(timeout))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	holdMany(t, c, locks) // release_test.go
	rc.Pause(4)
	t.Cleanup(func() { rc.Resume(4) })
	start := time.Now()
	if err := c.Close(); err != nil {
		t.Errorf("Close = %v; want nil (4 of 5 nodes released every lock)", err)
	}
	took := time.Since(start)
	t.Logf("Close of %d locks with 1 of 5 nodes paused: %v", locks, took)
	if bound := timeout + grace + time.Duration(locks)*100*time.Microsecond; took > bound {
		t.Errorf("Close took %v; want %v at most (node timeout + %v + 100µs per lock)", took, bound, grace)
	}
	for i := range 4 {
		if n := lockKeys(t, rc, i, "lock:many:"); n != 0 {
			t.Errorf("node %d keeps %d of %d lock keys after Close", i, n, locks)
		}
	}
}

// 7. An Extend whose round ends at or after ValidUntil without a majority
// leaves the lock lost: ErrLockLost, not "not yet lost" ErrNoQuorum.
func TestReal_extendDecidedAfterValidUntilIsLost(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	c := newClient(t, rc.Clients())
	l, err := c.Lock(t.Context(), "late-ext", WithTTL(time.Second), WithAutoRenew(false), WithNodeTimeout(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	rc.Pause(1)
	rc.Pause(2)
	t.Cleanup(func() { rc.Resume(1); rc.Resume(2) })
	time.Sleep(time.Until(l.ValidUntil().Add(-100 * time.Millisecond)))
	err = l.Extend(t.Context()) // its round ends 300ms later: after ValidUntil
	if !errors.Is(err, ErrLockLost) || errors.Is(err, ErrNoQuorum) {
		t.Errorf("Extend decided after ValidUntil = %v; want ErrLockLost", err)
	}
	select {
	case <-l.Lost():
	default:
		t.Errorf("Lost() not closed after an Extend decided past ValidUntil")
	}
}

// Lock never hands out a lock whose validity ran out before it could
// return it (the process was starved between the grant and the return;
// here an Attempt hook sleeps past the TTL).
func TestLock_neverReturnsAnExpiredLock(t *testing.T) {
	t.Parallel()
	_, nodes := miniNodes(t, 3)
	var slept atomic.Bool
	c := newClient(t, nodes, WithHooks(sleepyAttempt{slept: &slept, d: 1200 * time.Millisecond}))
	opts := []Option{WithTTL(time.Second), WithNodeTimeout(300 * time.Millisecond), WithAutoRenew(false), WithRetryDelay(time.Millisecond, 2*time.Millisecond)}
	// The Client's first requests to each node (identity check, clock,
	// script load) come first, with the hook off: under -race at load 5
	// they made the first attempt miss 300ms on every node.
	slept.Store(true)
	if w, err := c.Lock(t.Context(), "warm"); err == nil {
		w.Unlock(t.Context())
	}
	slept.Store(false)
	if l, err := c.TryLock(t.Context(), "slow", opts...); err == nil || l != nil {
		t.Errorf("TryLock whose lock expired before its return = %v, %v; want an error matching ErrNotObtained", l, err)
	} else if !errors.Is(err, ErrNotObtained) {
		t.Errorf("TryLock = %v; want ErrNotObtained", err)
	}
	slept.Store(false)
	l, err := c.Lock(t.Context(), "slow", opts...)
	if err != nil {
		t.Fatal(err)
	}
	if !l.Valid() {
		t.Errorf("Lock returned a lock that is not Valid()")
	}
	if err := l.Unlock(t.Context()); err != nil {
		t.Errorf("Unlock = %v", err)
	}
}

// sleepyAttempt sleeps d in the first Attempt hook.
type sleepyAttempt struct {
	NoHooks
	slept *atomic.Bool
	d     time.Duration
}

func (h sleepyAttempt) Attempt(context.Context, AttemptInfo) {
	if h.slept.CompareAndSwap(false, true) {
		time.Sleep(h.d)
	}
}
