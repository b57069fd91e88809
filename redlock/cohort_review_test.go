package redlock

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/internal/redistest"
)

// Review of the local handoff (issue 41): the old *Lock of a lease passed
// on must be unlocked, on every face, before the new holder can run.

// The old *Lock's Context is cancelled before the new holder's Lock call
// can return: a goroutine of the old holder that writes while its lock's
// Context lives must have stopped by the time the next holder starts, as
// with a release on the nodes (finish cancels it before anything is sent).
// The turn's channel is unbuffered here, so the waiter runs while Unlock is
// still at its send: one legal interleaving of the buffered send, made
// certain.
func TestCohortReview_oldContextCancelledBeforeHandoff(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	c := newClient(t, rc.Clients(), WithLocalHandoff(16, time.Minute))
	ctx := t.Context()
	a, err := c.Lock(ctx, "rev:ctx")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := buildConfig(c.cfg, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	tr := &turn{ctx: context.Background(), cfg: cfg, ch: make(chan *Lock)}
	c.lineMu.Lock()
	co := c.cohorts["rev:ctx"]
	co.line = append(co.line, tr)
	c.lineMu.Unlock()
	type seen struct {
		n     *Lock
		cause error
	}
	got := make(chan seen, 1)
	go func() {
		n := <-tr.ch
		got <- seen{n, context.Cause(a.Context())} // what the old holder's workers see now
	}()
	if err := a.Unlock(ctx); err != nil {
		t.Fatalf("Unlock with a waiter = %v", err)
	}
	s := <-got
	if s.n == nil {
		t.Fatal("the waiter was given a turn to contend; want the lease")
	}
	if !s.n.handOut() {
		t.Fatal("the lease passed on is not valid")
	}
	if !errors.Is(s.cause, ErrUnlocked) {
		t.Errorf("old *Lock's Context cause when the new holder got the lease = %v; want ErrUnlocked", s.cause)
	}
	if err := s.n.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if !noLockKey(t, rc, "lock:rev:ctx", 10*time.Second) {
		t.Error("key left on the nodes after the last Unlock")
	}
}

// An Extend of the old *Lock that was under way when its Unlock passed the
// lease on returns ErrNotHeld, not nil: after Unlock returned, the old
// holder must not be told it holds the lock (Extend's contract), while the
// new holder does. The extension itself landed for the lease, so the new
// holder's ValidUntil may move; the old handle is not told so.
// Not parallel: ExtendPause is process-wide.
func TestCohortReview_extendRacingHandoff(t *testing.T) {
	rc := redistest.Start(t, 3)
	c := newClient(t, rc.Clients(), WithLocalHandoff(16, time.Minute))
	ctx := t.Context()
	a, err := c.Lock(ctx, "rev:ext")
	if err != nil {
		t.Fatal(err)
	}
	got := lockAsync(t, c, "rev:ext")
	waitInLine(t, c, "rev:ext", 1)
	paused, letGo := pauseFirstExtend(t)
	defer letGo()
	extended := make(chan error, 1)
	go func() { extended <- a.Extend(context.Background()) }()
	select {
	case <-paused: // a's Extend passed its checks and registered its round
	case <-time.After(10 * time.Second):
		t.Fatal("Extend never reached its send")
	}
	if err := a.Unlock(ctx); err != nil {
		t.Fatalf("Unlock with a waiter = %v", err)
	}
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	letGo()
	if err := <-extended; !errors.Is(err, ErrNotHeld) {
		t.Errorf("old *Lock's Extend that raced the handoff = %v; want ErrNotHeld (its Unlock returned nil before)", err)
	}
	if !r.l.Valid() {
		t.Error("new holder not Valid after the old handle's Extend")
	}
	if err := r.l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if !noLockKey(t, rc, "lock:rev:ext", 10*time.Second) {
		t.Error("key left on the nodes after the last Unlock")
	}
}

// Detach and Unlock of one *Lock, racing while another goroutine of the
// Client waits for the resource: exactly one of them succeeds. Both
// returning nil is two holders: the Detached token goes to another
// process (Resume) while the lease, passed on locally, lives on in this
// one (or, with no handoff, Unlock releases the token Detach handed over).
func TestCohortReview_detachRacingUnlock(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	c := newClient(t, rc.Clients(), WithLocalHandoff(16, time.Minute))
	ctx := t.Context()
	both := 0
	for i := range 200 {
		res := "rev:det:" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		a, err := c.Lock(ctx, res)
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithCancel(ctx)
		got := lockAsyncCtx(wctx, c, res)
		waitInLine(t, c, res, 1)
		start := make(chan struct{})
		detached, unlocked := make(chan error, 1), make(chan error, 1)
		go func() { <-start; detached <- a.Detach() }()
		go func() { <-start; unlocked <- a.Unlock(ctx) }()
		close(start)
		derr, uerr := <-detached, <-unlocked
		if derr == nil && uerr == nil {
			both++
		}
		if derr == nil { // the detached token is ours to clean up
			cancel()
			if l, err := c.Resume(ctx, res, a.Token()); err == nil {
				_ = l.Unlock(ctx)
			}
		}
		if r := <-got; r.err == nil {
			_ = r.l.Unlock(ctx)
		}
		cancel()
	}
	if both > 0 {
		t.Errorf("Detach and Unlock of one *Lock both returned nil in %d of 200 races; want at most one", both)
	}
}

// A semaphore's permits are not passed on locally (doc.go, WithLocalHandoff:
// "semaphore permits never are"): a permit the head waiter got through
// Lock on its slot, unlocked while the next Acquire of the same Client
// waits on that slot, goes back through the nodes.
func TestCohortReview_semaphorePermitNotPassedOn(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	h := &cohortHooks{}
	c := newClient(t, rc.Clients(), WithHooks(h), WithLocalHandoff(16, time.Minute))
	ctx := t.Context()
	s, err := c.Semaphore("rev:sem", 1)
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	acquire := func() <-chan lockResult {
		got := make(chan lockResult, 1)
		go func() {
			l, err := s.Acquire(ctx)
			got <- lockResult{l: l, err: err}
		}()
		return got
	}
	gotB := acquire()
	// B waits on the permit itself (Lock on its slot, contending on the
	// nodes), not in TryAcquire's rounds.
	contending := func() bool {
		c.lineMu.Lock()
		defer c.lineMu.Unlock()
		co := c.cohorts[s.slots[0]]
		return co != nil && co.head
	}
	if !eventually(30*time.Second, contending) {
		t.Fatal("the second Acquire never waited on the permit")
	}
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	b := <-gotB
	if b.err != nil {
		t.Fatal(b.err)
	}
	gotC := acquire()
	// C waits on the permit: in the slot's line (passed on locally), or
	// contending on the nodes.
	if !eventually(30*time.Second, func() bool { return inLineNow(c, s.slots[0]) == 1 || contending() }) {
		t.Fatal("the third Acquire never waited on the permit")
	}
	if err := b.l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-gotC
	if r.err != nil {
		t.Fatal(r.err)
	}
	if n := h.localAcq.Load(); n != 0 {
		t.Errorf("%d semaphore permits passed on locally; want 0", n)
	}
	if err := r.l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// The old *Lock's ValidUntil does not follow the lease it passed on: the
// new holder's renewals move the lease's validity on, and a former holder
// that guards its writes with ValidUntil would trust it for as long as the
// new holder keeps it. It reads the zero time; the new holder's is the
// lease's, and moves with its Extend.
func TestCohortReview_oldValidUntilAfterHandoff(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	c := newClient(t, rc.Clients(), WithLocalHandoff(16, time.Minute))
	ctx := t.Context()
	a, err := c.Lock(ctx, "rev:until")
	if err != nil {
		t.Fatal(err)
	}
	got := lockAsync(t, c, "rev:until")
	waitInLine(t, c, "rev:until", 1)
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	before := r.l.ValidUntil()
	time.Sleep(2 * time.Millisecond) // so that the Extend's round starts later
	if err := r.l.Extend(ctx); err != nil {
		t.Fatal(err)
	}
	if !r.l.ValidUntil().After(before) {
		t.Errorf("new holder's ValidUntil %v did not move on with its Extend (was %v)", r.l.ValidUntil(), before)
	}
	if vu := a.ValidUntil(); time.Now().Before(vu) {
		t.Errorf("old *Lock's ValidUntil = %v, in the future after its lease was passed on (the new holder's is %v)", vu, r.l.ValidUntil())
	}
	if err := r.l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// detachInLost calls Detach on its lock from the Lost hook, once an Unlock
// of the lock holds relMu (that Unlock waits for the Lost hook).
type detachInLost struct {
	NoHooks
	l      atomic.Pointer[Lock]
	detach chan error
}

func (h *detachInLost) Lost(context.Context, LostInfo) {
	l := h.l.Load()
	deadline := time.Now().Add(10 * time.Second)
	for l.relMu.TryLock() { // until the Unlock holds it
		l.relMu.Unlock()
		if time.Now().After(deadline) {
			h.detach <- errors.New("no Unlock took relMu within 10s")
			return
		}
		time.Sleep(100 * time.Microsecond)
	}
	h.detach <- l.Detach()
}

// A Detach from the Lost hook, while an Unlock of the lost lock waits for
// that hook (release reports after it), returns ErrNotHeld at once: it
// must not wait for the Unlock's relMu (Detach takes it to exclude a
// racing local handoff), or neither ever returns.
func TestCohortReview_detachInLostHookDuringUnlock(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	h := &detachInLost{detach: make(chan error, 1)}
	c := newClient(t, rc.Clients(), WithHooks(h))
	ctx := t.Context()
	l, err := c.Lock(ctx, "rev:lost")
	if err != nil {
		t.Fatal(err)
	}
	h.l.Store(l)
	for i := range rc.N() {
		if err := rc.Admin(i).Set(ctx, "lock:rev:lost", "00000000-0000-4000-8000-000000000000", time.Minute).Err(); err != nil { // another owner's
			t.Fatal(err)
		}
	}
	if err := l.Extend(ctx); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Extend with the key gone = %v; want ErrLockLost (another token on every node)", err)
	}
	unlocked := make(chan error, 1)
	go func() { unlocked <- l.Unlock(context.Background()) }()
	select {
	case err := <-h.detach:
		if !errors.Is(err, ErrNotHeld) {
			t.Errorf("Detach from the Lost hook = %v; want ErrNotHeld", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Detach from the Lost hook did not return within 10s of an Unlock waiting for the hook")
	}
	select {
	case <-unlocked:
	case <-time.After(10 * time.Second):
		t.Fatal("Unlock of the lost lock did not return within 10s")
	}
}
