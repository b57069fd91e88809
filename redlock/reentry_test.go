package redlock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
)

// quick is how long a call that must not wait may take: it does no I/O
// (10ms in the terms), with far more than 5× slack for a loaded
// machine under -race; before the fix these calls waited until their ctx
// ended (lockWait), or for ever.
const quick = time.Second

// lockWait bounds the ctx of a call that would wait for itself, so that the
// test ends before the fix too.
const lockWait = 5 * time.Second

// reentryClient is a Client of 3 fresh miniredis nodes, with a TTL that
// no test here outlives (no renewal) and a node timeout of 3s, the most
// under its 3.33s renew interval: at load ~23 (the redlock package beside
// stress-ng and others' runs) an Unlock missed the derived 1s on two
// in-process nodes under -race.
func reentryClient(t *testing.T) *Client {
	_, nodes := miniNodes(t, 3)
	return newClient(t, nodes, WithTTL(10*time.Second), WithNodeTimeout(3*time.Second))
}

// failsFast calls lock with a ctx derived from ctx (lockWait at most) and
// checks that it returned ErrAlreadyHeld, which matches ErrNotObtained
// too, within quick; a lock it got all the same is unlocked.
func failsFast(t *testing.T, what string, ctx context.Context, lock func(context.Context) (*Lock, error)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, lockWait)
	defer cancel()
	start := time.Now()
	l, err := lock(ctx)
	took := time.Since(start)
	if !errors.Is(err, ErrAlreadyHeld) || !errors.Is(err, ErrNotObtained) || took > quick {
		t.Errorf("%s = %v after %v; want ErrAlreadyHeld (and ErrNotObtained) within %v", what, err, took, quick)
	}
	if err == nil && l != nil {
		l.Unlock(context.Background())
	}
}

// lockAndUnlock runs lock in a goroutine of its own and unlocks what it
// got; the channel gives the first error.
func lockAndUnlock(lock func() (*Lock, error)) <-chan error {
	got := make(chan error, 1)
	go func() {
		l, err := lock()
		if err == nil {
			err = l.Unlock(context.Background())
		}
		got <- err
	}()
	return got
}

// issue 44 item 2: the holder locking again, with a ctx that comes from its
// lock, gets ErrAlreadyHeld at once; another caller of the same Client
// (a ctx of its own) still waits its turn and gets the lock on Unlock.
func TestReentry_holderFailsFastOthersWait(t *testing.T) {
	t.Parallel()
	c := reentryClient(t)
	l, err := c.Lock(t.Context(), "self")
	if err != nil {
		t.Fatal(err)
	}
	for _, call := range []struct {
		name string
		fn   func(ctx context.Context) error
	}{
		{"Lock", func(ctx context.Context) error { _, err := c.Lock(ctx, "self"); return err }},
		{"TryLock", func(ctx context.Context) error { _, err := c.TryLock(ctx, "self"); return err }},
		{"WLock", func(ctx context.Context) error { _, err := c.WLock(ctx, "self"); return err }},
		{"RLock", func(ctx context.Context) error { _, err := c.RLock(ctx, "self"); return err }},
		{"LockAll", func(ctx context.Context) error { _, err := c.LockAll(ctx, []string{"other", "self"}); return err }},
		{"Do", func(ctx context.Context) error { return c.Do(ctx, "self", func(context.Context) error { return nil }) }},
	} {
		failsFast(t, call.name+" with the holder's ctx", l.Context(), func(ctx context.Context) (*Lock, error) { return nil, call.fn(ctx) })
	}
	// Another caller of this Client: its ctx does not come from the lock.
	got := lockAndUnlock(func() (*Lock, error) { return c.Lock(context.Background(), "self") })
	select {
	case err := <-got:
		t.Fatalf("another caller's Lock returned %v while the lock was held; want it to wait", err)
	case <-time.After(50 * time.Millisecond):
	}
	if err := l.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Errorf("another caller's Lock after Unlock = %v; want the lock", err)
		}
	case <-time.After(lockWait):
		t.Fatal("another caller's Lock did not get the lock after Unlock")
	}
	// Once unlocked, the lock's ctx names no holder any more.
	l3, err := c.Lock(context.WithoutCancel(l.Context()), "self")
	if err != nil {
		t.Fatalf("Lock with an unlocked lock's ctx = %v; want the lock", err)
	}
	l3.Unlock(t.Context())
}

// Do's fn ctx carries the lock: a nested Do of the same resource fails
// fast, one of another resource is granted (and its own fn ctx carries both).
func TestReentry_nestedDo(t *testing.T) {
	t.Parallel()
	c := reentryClient(t)
	err := c.Do(t.Context(), "outer", func(ctx context.Context) error {
		return c.Do(ctx, "inner", func(ctx context.Context) error {
			failsFast(t, "Lock(outer) inside Do(outer) → Do(inner)", ctx, func(ctx context.Context) (*Lock, error) { return c.Lock(ctx, "outer") })
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A reader reading again is refused at once (no recursive read locking);
// a semaphore's holder may take another permit while one is free, and is
// told at once when it holds them all.
func TestReentry_readersAndPermits(t *testing.T) {
	t.Parallel()
	c := reentryClient(t)
	r, err := c.RLock(t.Context(), "rw")
	if err != nil {
		t.Fatal(err)
	}
	failsFast(t, "RLock with a reader's ctx (no recursive read locking)", r.Context(), func(ctx context.Context) (*Lock, error) { return c.RLock(ctx, "rw") })
	r.Unlock(t.Context())

	s, err := c.Semaphore("sem", 2)
	if err != nil {
		t.Fatal(err)
	}
	p1, err := s.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer p1.Unlock(t.Context())
	p2, err := s.Acquire(p1.Context())
	if err != nil {
		t.Fatalf("Acquire with a permit's ctx, one permit free = %v; want the other permit", err)
	}
	defer p2.Unlock(t.Context())
	failsFast(t, "Acquire by the holder of every permit", p2.Context(), func(ctx context.Context) (*Lock, error) { return s.Acquire(ctx) })
}

// The holder of every permit calling Acquire with its permit's ctx while
// another caller waits in line: it used to join the line behind that
// waiter, which waits for the caller's permit, and wait for itself until
// ctx ended (issue 44 review, D2). It returns ErrAlreadyHeld at once.
func TestReentry_allPermitsHolderWithAWaiter(t *testing.T) {
	t.Parallel()
	c := reentryClient(t)
	s, err := c.Semaphore("sem", 1)
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(t.Context(), 4*lockWait)
	defer wcancel()
	got := lockAndUnlock(func() (*Lock, error) { return s.Acquire(wctx) })
	// The other caller is in line once it holds the waiters' lock.
	if !eventually(lockWait, func() bool {
		held, err := c.IsLocked(t.Context(), "sem"+turnstileSuffix)
		return err == nil && held
	}) {
		t.Fatal("the other caller never joined the line")
	}
	failsFast(t, "Acquire by the holder of every permit, another waiter in line", p.Context(), func(ctx context.Context) (*Lock, error) { return s.Acquire(ctx) })
	p.Unlock(t.Context())
	if err := <-got; err != nil {
		t.Errorf("the waiter, after the permit was released: %v", err)
	}
}

// A reader's RLock with its lock's ctx while a writer waits: rw.lua queues
// the new reader behind the writer, which waits for our reader, so letting
// it through waited for itself until ctx ended (issue 44 review, D1). It
// returns ErrAlreadyHeld at once.
func TestReentry_readerAgainWhileAWriterWaits(t *testing.T) {
	t.Parallel()
	c := reentryClient(t)
	r, err := c.RLock(t.Context(), "rw")
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(t.Context(), 4*lockWait)
	defer wcancel()
	wrote := lockAndUnlock(func() (*Lock, error) { return c.WLock(wctx, "rw") })
	// The writer waits once another caller's reader is refused.
	if !eventually(lockWait, func() bool {
		o, err := c.TryRLock(t.Context(), "rw")
		if err == nil {
			o.Unlock(t.Context())
		}
		return err != nil
	}) {
		t.Fatal("the writer never waited")
	}
	failsFast(t, "RLock with a reader's ctx while a writer waits", r.Context(), func(ctx context.Context) (*Lock, error) { return c.RLock(ctx, "rw") })
	r.Unlock(t.Context())
	if err := <-wrote; err != nil {
		t.Errorf("the writer, after the reader unlocked: %v", err)
	}
}

// issue 44 item 3: a ctx done before the call — cancelled, or its deadline
// passed — sends nothing and says nothing about the nodes: the error
// matches ctx's error, and neither ErrNoQuorum nor ErrNotObtained (before,
// a passed deadline read as ErrNoQuorum and a cancel as context.Canceled).
func TestLock_ctxDoneBeforeTheCall(t *testing.T) {
	t.Parallel()
	nodes, count := countingNodes(t, 3)
	c := newClient(t, nodes, WithTTL(time.Minute)) // no renewal within the test
	held, err := c.Lock(t.Context(), "held")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Unlock(context.Background())
	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	past, cancel2 := context.WithDeadline(t.Context(), time.Now().Add(-time.Second))
	defer cancel2()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		want error
	}{{"cancelled", cancelled, context.Canceled}, {"deadline passed", past, context.DeadlineExceeded}} {
		for _, call := range []struct {
			name string
			fn   func(ctx context.Context) error
		}{
			{"Lock", func(ctx context.Context) error { _, err := c.Lock(ctx, "done"); return err }},
			{"TryLock", func(ctx context.Context) error { _, err := c.TryLock(ctx, "done"); return err }},
			{"Do", func(ctx context.Context) error { return c.Do(ctx, "done", func(context.Context) error { return nil }) }},
			{"IsLocked", func(ctx context.Context) error { _, err := c.IsLocked(ctx, "done"); return err }},
			{"Extend", func(ctx context.Context) error { return held.Extend(ctx) }},
			{"Resume", func(ctx context.Context) error { _, err := c.Resume(ctx, "done", uuid.NewString()); return err }},
		} {
			before := count.n.Load()
			err := call.fn(tc.ctx)
			if !errors.Is(err, tc.want) || errors.Is(err, ErrNoQuorum) || errors.Is(err, ErrNotObtained) {
				t.Errorf("%s with ctx %s = %v; want %v, neither ErrNoQuorum nor ErrNotObtained", call.name, tc.name, err, tc.want)
			}
			if n := count.n.Load() - before; n != 0 {
				t.Errorf("%s with ctx %s sent %d commands; want none", call.name, tc.name, n)
			}
		}
	}
}

// Hand-over-hand locking, each lock taken on the previous one's Context and
// that one unlocked after: the locks a ctx carries are pruned to those
// still held, so the list stays short (it grew by one per lock before: the
// 1,000th lock carried 999 released ones), and the holder is still told
// it holds the lock it holds. 100 locks show it as 1,000 did (the list
// would reach 99; a list that stays at one is bounded), in a tenth of the
// time: 1,000 took 7.6-9.5s under -race, the package's CPU.
func TestReentry_handOverHandChainBounded(t *testing.T) {
	t.Parallel()
	_, nodes := miniNodes(t, 3)
	c := newClient(t, nodes, WithTTL(10*time.Second), WithAutoRenew(false))
	prev, err := c.Lock(t.Context(), "hoh:0")
	if err != nil {
		t.Fatal(err)
	}
	longest := 0
	for i := 1; i <= 100; i++ {
		l, err := c.Lock(prev.Context(), "hoh:"+string(rune('a'+i%2)))
		if err != nil {
			t.Fatalf("lock %d: %v", i, err)
		}
		if err := prev.Unlock(t.Context()); err != nil {
			t.Fatalf("unlock %d: %v", i-1, err)
		}
		longest = max(longest, len(l.outer))
		prev = l
	}
	if longest > 1 {
		t.Errorf("longest outer list = %d; want ≤ 1 (one lock held at a time beside the new one)", longest)
	}
	if _, err := c.Lock(prev.Context(), prev.Resource()); !errors.Is(err, ErrAlreadyHeld) {
		t.Errorf("Lock of the held resource on its Context = %v; want ErrAlreadyHeld", err)
	}
	if err := prev.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
}
