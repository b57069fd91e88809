package redlock

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/quorumlock/quorumlock/internal/node"
	"github.com/quorumlock/quorumlock/internal/scripts"
	"github.com/quorumlock/quorumlock/renew"
)

type state int8

const (
	stateHeld     state = iota
	stateLost           // lost: Lost() closed, Context cancelled with ErrLockLost
	stateUnlocked       // Unlock was called
	stateClosed         // the Client was closed
	stateFinished       // a failed attempt; never handed out
)

// closedChan is what Lost returns for a nil *Lock.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Lock is a lock held on a majority of nodes. It is safe for concurrent use.
// Methods on a nil *Lock are safe: Unlock and Extend return ErrNotHeld, Valid
// is false, Lost returns a closed channel, Context returns a cancelled
// context.
//
// A Lock is a handle on a lease (what the nodes hold: the token, its keys,
// validity and renewal). A lease passed to another goroutine of the same
// Client without a round trip (a local handoff, cohort.go) gets a new
// handle: the old one is unlocked at once (its Context is cancelled with
// ErrUnlocked, Unlock and Extend return ErrNotHeld), the new one carries
// the lease on.
//
// Values of this type must not be copied.
type Lock struct {
	*lease // shared by the handles a lease was passed through; cur names the one that holds it
	// The acquisition's own, write-once before the Lock is handed out:
	id       uint64                  // the lock's ID for hooks
	acquired time.Time               // when this handle got the lease
	ctx      context.Context         // carries the lock (reentry.go)
	cancel   context.CancelCauseFunc // cancels ctx
	outer    []*Lock                 // the other locks ctx carried, held at acquisition (reentry.go)
	lost     chan struct{}           // closed once, on the lease's loss while this handle held it
	lostDone chan struct{}           // closed once the Lost hook has returned (at loss, without hooks)
}

// lease is what the nodes hold for a lock: its token, keys, validity,
// renewal and release, shared by every handle it was passed through.
type lease struct {
	c        *Client
	resource string
	keys     []scripts.Keys // per node
	token    string
	fence    int64 // write-once before the Lock is handed out
	// taken is when the lease was taken on the nodes (the local handoffs'
	// time budget counts from it); write-once before it is handed out.
	taken time.Time
	// firstRenewal is when the lock renews first (0: the interval): a lock
	// held from handoffs renews within its reservation (step 9).
	// Write-once before the Lock is handed out.
	firstRenewal time.Duration
	cfg          config
	extOnce      sync.Once          // builds ext
	ext          []scripts.Prepared // per node: the extend call (see extendCalls)

	mu         sync.Mutex // protects the fields below
	state      state
	validUntil time.Time
	lostErr    error
	handle     *renew.Handle
	// cur is the handle that holds the lease now: the only one of its
	// handles that is not unlocked. A local handoff moves it (cohort.go).
	cur *Lock
	// handoffs counts the local handoffs of the lease (cohort.go).
	handoffs int
	// returned is set by handOut: Lock's last check before it returns the
	// lock (step 6). Only then is the
	// lock registered with the renewal scheduler, so that no loss is
	// reported, and no hook or OnLost called, for a lock Lock did not
	// return.
	returned bool
	watched  bool // set by the first handOut: the lease is watched (watch)
	// tok is the lock's token as the node layer sees it (node.Token):
	// every round and release of the lock goes through it; rounds
	// register under mu, in one step with the check of state (rounds.go).
	tok *node.Token
	// waiter is how the Lock call queues on the nodes (step 9); its zero
	// value does not queue. Set by the call's goroutine between attempts.
	waiter scripts.Waiter
	// capTimer ends the lock at its WithMaxHold cap (nil: none); set by
	// watch, stopped when the lock ends.
	capTimer *time.Timer
	// detached is set by Detach (handover.go): Unlock must not release a
	// lock handed to another process.
	detached atomic.Bool
	// relMu serialises Unlock's releases; released is set under it once a
	// release reached a majority: the Client finishes the others in the
	// background, so a later Unlock has nothing to send (ErrNotHeld).
	relMu    sync.Mutex
	released bool
	// dequeued marks the nodes whose handoff took our entry out, named by
	// our latest attempt (so no later request of ours could queue it
	// again): a release sends no member there (release.go). Set by the
	// call's goroutine before the lock is handed out; nil: none.
	dequeued []bool
}

// Resource returns the name of the locked resource.
func (l *Lock) Resource() string {
	if l == nil {
		return ""
	}
	return l.resource
}

// Token returns the value stored under the lock key on the nodes: 122 random
// bits (a uuid v4), unique per acquisition on the nodes and unguessable. It
// is what proves ownership to the scripts; do not log it. A lock passed
// between goroutines of one Client (a local handoff, see WithLocalHandoff)
// keeps its token: the *Lock that passed it on can no longer Unlock,
// Extend or Detach it, and this Client's Resume refuses a token it holds.
func (l *Lock) Token() string {
	if l == nil {
		return ""
	}
	return l.token
}

// Fence returns the fencing token of this acquisition: it strictly increases
// across successive holders of the resource. It is 0 unless the lock was
// acquired with WithFencing(true).
func (l *Lock) Fence() int64 {
	if l == nil {
		return 0
	}
	return l.fence
}

// ValidUntil returns the local deadline until which the lock may be trusted,
// from the last successful acquire or extend: the start of that round plus
// the TTL minus the drift allowance. It is read on the monotonic clock.
// A *Lock whose lease Unlock passed to another goroutine (a local handoff,
// see WithLocalHandoff) returns the zero time: the lease's validity, which
// the new holder's renewals move on, is no longer this *Lock's.
func (l *Lock) ValidUntil() time.Time {
	if l == nil {
		return time.Time{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cur != l {
		return time.Time{}
	}
	return l.validUntil
}

// Valid reports whether the lock is held: not lost, not unlocked, not closed,
// and now is before ValidUntil. It never reports true at or after
// ValidUntil. It does no I/O.
func (l *Lock) Valid() bool {
	if l == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cur == l && l.state == stateHeld && time.Now().Before(l.validUntil)
}

// handOut is Lock's last check before it returns l (step 6): Valid, and,
// the first time the lease holds, its registration with the Client's
// renewal scheduler (step 7), so that the scheduler only ever watches a
// lock the caller got: a lock granted but then found expired is dropped
// without ever being watched, so its loss can never reach the caller's
// OnLost. A deadline that passes from here on is the returned lock's loss.
// A handle a lease was passed to (cohort.go) is checked the same way; its
// lease is watched already.
func (l *Lock) handOut() bool {
	l.mu.Lock()
	ok := l.cur == l && l.state == stateHeld && time.Now().Before(l.validUntil)
	if ok {
		l.returned = true
	}
	first := ok && !l.watched
	if first {
		l.watched = true
	}
	l.mu.Unlock()
	if !first {
		return ok
	}
	if l.cfg.maxHold > 0 {
		l.armMaxHold() // WithMaxHold (maxhold.go)
	}
	h, err := l.c.sched.Add(watch{l}, renew.Options{AutoRenew: l.cfg.autoRenew, Interval: l.cfg.renewInterval, First: l.firstRenewal})
	if err != nil { // closed meanwhile; Close releases it
		return true
	}
	l.mu.Lock()
	l.handle = h
	l.mu.Unlock()
	return true
}

// watch is what the renewal scheduler sees of a Lock.
type watch struct{ l *Lock }

var _ renew.Target = watch{}

func (w watch) Renew(ctx context.Context, due time.Time) error {
	return renewError(w.l.current().extend(ctx, due)) // the handle that holds the lease now reports it
}

// renewError marks the errors that end a lock's renewal for good.
func renewError(err error) error {
	if err != nil && (errors.Is(err, ErrLockLost) || errors.Is(err, ErrNotHeld) || errors.Is(err, ErrClosed)) {
		return backoff.Permanent(err)
	}
	return err
}

// ValidUntil is the lease's validity, whichever handle holds it.
func (w watch) ValidUntil() time.Time {
	le := w.l.lease
	le.mu.Lock()
	defer le.mu.Unlock()
	return le.validUntil
}

func (w watch) Lose(err error) {
	// A renewal that raced Close (it found the Client closed) is not a
	// loss: Close ends the lock with cause ErrClosed.
	if errors.Is(err, ErrClosed) {
		return
	}
	if errors.Is(err, renew.ErrExpired) && !errors.Is(err, ErrLockLost) {
		// The scheduler's deadline: err joins renew.ErrExpired with what
		// the last renewal saw.
		var last error
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			last = errors.Join(slices.DeleteFunc(slices.Clone(j.Unwrap()), func(e error) bool { return e == renew.ErrExpired })...)
		}
		err = w.l.expiredError(last)
	}
	w.l.lose(err)
}

// Lost returns a channel that is closed when the lock is lost: a majority of
// nodes said the key is no longer ours, or ValidUntil passed without a
// successful renewal. Unlock and Close do not close it, except to report a
// loss that has already happened: a lock whose ValidUntil passed before
// Unlock or Close ran is reported lost first.
func (l *Lock) Lost() <-chan struct{} {
	if l == nil {
		return closedChan
	}
	return l.lost
}

// Context returns a context that lives as long as the lock: it is cancelled
// on loss (context.Cause matches ErrLockLost), on Unlock (cause ErrUnlocked)
// and on Close (cause ErrClosed). It carries the values of the ctx given to
// Lock, but not its cancellation.
func (l *Lock) Context() context.Context {
	if l == nil {
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(ErrNotHeld)
		return ctx
	}
	return l.ctx
}

// usable returns nil while the lock is held and valid, or the error Extend
// returns otherwise (reporting the loss if validity just ran out).
func (l *Lock) usable() error {
	l.mu.Lock()
	st, until, lostErr := l.state, l.validUntil, l.lostErr
	if l.cur != l {
		st = stateUnlocked // passed on (cohort.go)
	}
	l.mu.Unlock()
	switch st {
	case stateLost:
		return lostErr
	case stateClosed:
		return ErrClosed
	case stateUnlocked, stateFinished:
		return ErrNotHeld
	}
	if !time.Now().Before(until) {
		return l.expire(nil)
	}
	return nil
}

// finish ends a held lock for a reason other than loss: cause is
// ErrUnlocked, ErrClosed, or ErrClosed for a lock never handed out. The
// lock leaves the Client's locks (Close has taken them all already).
func (l *Lock) finish(cause error) {
	l.mu.Lock()
	if l.state == stateHeld && l.cur == l { // a handle passed on has no say on the lease
		switch cause {
		case ErrUnlocked:
			l.state = stateUnlocked
		case ErrClosed:
			l.state = stateClosed
		default:
			l.state = stateFinished
		}
	}
	// WithMaxHold's cap (maxhold.go) ends with the lock.
	if l.capTimer != nil {
		l.capTimer.Stop()
	}
	l.mu.Unlock()
	if l.cancel != nil {
		l.cancel(cause)
	}
	c := l.c
	c.mu.Lock()
	if _, ok := c.locks[l]; ok {
		delete(c.locks, l)
		if c.held[l.resource]--; c.held[l.resource] <= 0 {
			delete(c.held, l.resource)
		}
	}
	c.mu.Unlock()
}
