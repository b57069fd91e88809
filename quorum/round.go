package quorum

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Round is one request sent to every node at once. Each node's request
// writes only its own slot, and the notification channel is buffered to N,
// so a node that answers after the decision never blocks: it finishes in the
// background, bounded by the node timeout, and is waited for by whoever
// started it (see [Spawner]).
//
// A Round is safe for concurrent use once started.
type Round[T any] struct {
	start   time.Time
	timeout time.Duration
	call    func(ctx context.Context, node int) (T, error)
	base    noCancel           // the caller's ctx without its cancellation
	ctx     roundCtx           // the requests' ctx: base, bounded by the deadline
	cancel  context.CancelFunc // releases ctx; called by the last request to return
	left    atomic.Int32       // requests not returned yet
	wg      sync.WaitGroup     // requests not returned yet, for Wait
	slots   []slot[T]          // slot i written once by node i's request, before its done is set
	notify  chan int           // buffered to N: node i sends i once

	mu   sync.Mutex      // protects done
	done []chan struct{} // per node, made by Done on demand; nil until then

	// Backing arrays for rounds of up to smallN nodes, so that a round is
	// one allocation (plus its channel and ctx) whatever it tallies.
	slotsA [smallN]slot[T]
	votesA [smallN]Vote
	errsA  [smallN]error
}

// smallN is the largest round whose slots and tally live in the Round itself.
const smallN = 8

// slot is node i's part of a round: its reply, and whether it is in.
type slot[T any] struct {
	r   *Round[T]
	i   int
	in  atomic.Bool // Reply is set
	rep Reply[T]
}

// run sends node i's request, records the reply and notifies the
// collector. It is the task a Spawner runs.
func (s *slot[T]) run() {
	r := s.r
	v, err := r.call(&r.ctx, s.i)
	s.rep = Reply[T]{Val: v, Err: err}
	r.mu.Lock() // with Done: exactly one of them closes done[i]
	s.in.Store(true)
	if r.done != nil && r.done[s.i] != nil {
		close(r.done[s.i])
	}
	r.mu.Unlock()
	r.notify <- s.i
	// After the notification, so that a collector woken by the end of
	// ctx finds every reply of a round that ended because all answered.
	if r.left.Add(-1) == 0 {
		r.cancel()
	}
	r.wg.Done()
}

// Spawner starts a round's requests, each on a goroutine, and owns them
// until they return: a *sync.WaitGroup does, and so does [*Workers], which
// reuses its goroutines.
type Spawner interface {
	Go(f func())
}

// Start sends call to nodes 0..n-1 in parallel and returns at once: it is
// StartAt from now.
func Start[T any](ctx context.Context, n int, timeout time.Duration, sp Spawner, call func(ctx context.Context, node int) (T, error)) *Round[T] {
	return StartAt(ctx, time.Now(), n, timeout, sp, call)
}

// StartAt sends call to nodes 0..n-1 in parallel and returns at once, as a
// round that began at start (a moment the caller fixed before it could be
// delayed: when it registered the round). The calls share a context whose
// deadline is start plus timeout, or the caller's deadline when that comes
// first — fixed here from start, so that a caller descheduled between
// fixing start and sending cannot push its requests' deadline later
// (DESIGN step 4). The calls do not inherit the caller's cancellation:
// once sent, a request finishes in the background within its deadline
// (DESIGN step 2), so that a caller that cancels its ctx as it returns
// (defer cancel()) leaves no grant half-made. Collect still returns when
// the caller's ctx ends. sp starts the calls (nil: plain goroutines nobody
// waits for but Wait), so that an owner can wait for stragglers after an
// early decision. The context is released when the last call returns.
func StartAt[T any](ctx context.Context, start time.Time, n int, timeout time.Duration, sp Spawner, call func(ctx context.Context, node int) (T, error)) *Round[T] {
	r := &Round[T]{
		start:   start,
		timeout: timeout,
		call:    call,
		notify:  make(chan int, n),
	}
	if n <= smallN {
		r.slots = r.slotsA[:n]
	} else {
		r.slots = make([]slot[T], n)
	}
	// One context for the round: every request has the same deadline, so
	// one timer serves them all, and the collector waits on it too. The
	// last node to answer releases it.
	var cctx context.Context
	r.base.ctx = ctx
	cctx, r.cancel, r.ctx.timeout = deadlineFrom(&r.base, ctx, start, timeout)
	r.ctx.Context = cctx
	if n == 0 {
		r.cancel()
		return r
	}
	r.left.Store(int32(n))
	r.wg.Add(n)
	w, pooled := sp.(*Workers)
	if wg, ok := sp.(*sync.WaitGroup); (ok && wg == nil) || (pooled && w == nil) {
		sp, pooled = nil, false // a typed nil: no owner
	}
	for i := range r.slots {
		s := &r.slots[i]
		s.r, s.i = r, i
		switch {
		case pooled:
			w.run(s) // the slot is the task: nothing to allocate
		case sp != nil:
			sp.Go(s.run)
		default:
			go s.run()
		}
	}
	return r
}

type timeoutKey struct{}

// roundCtx is a round's request context: it says the node timeout (see
// NodeTimeout) without a context.WithValue of its own.
type roundCtx struct {
	context.Context
	timeout time.Duration // 0: the caller's deadline bounds the requests
}

func (c *roundCtx) Value(key any) any {
	if _, ok := key.(timeoutKey); ok {
		if c.timeout > 0 {
			return c.timeout
		}
		return nil
	}
	return c.Context.Value(key)
}

// NodeTimeout returns the node timeout of the round whose request ctx is,
// when that timeout (not the caller's earlier deadline) bounds it, so that a
// request that timed out can say "no reply within" it.
func NodeTimeout(ctx context.Context) (time.Duration, bool) {
	d, ok := ctx.Value(timeoutKey{}).(time.Duration)
	return d, ok
}

// noCancel is a context's values without its cancellation or deadline,
// like context.WithoutCancel; it lives in the Round, so that a round
// allocates no context of its own for it.
type noCancel struct{ ctx context.Context }

func (noCancel) Deadline() (time.Time, bool) { return time.Time{}, false }

func (noCancel) Done() <-chan struct{} { return nil }

func (noCancel) Err() error { return nil }

func (c *noCancel) Value(key any) any { return c.ctx.Value(key) }

// deadlineFrom returns the requests' context of a round that began at
// start: base (ctx's values without its cancellation), ending at start+d or at
// ctx's deadline, whichever comes first (no deadline when d ≤ 0 and ctx has
// none). timeout is d when it sets the deadline, else 0 (see NodeTimeout).
func deadlineFrom(base *noCancel, ctx context.Context, start time.Time, d time.Duration) (context.Context, context.CancelFunc, time.Duration) {
	dl, ok := ctx.Deadline()
	switch {
	case d > 0 && (!ok || dl.After(start.Add(d))):
		c, cancel := context.WithDeadline(base, start.Add(d))
		return c, cancel, d
	case ok:
		c, cancel := context.WithDeadline(base, dl)
		return c, cancel, 0
	}
	c, cancel := context.WithCancel(base)
	return c, cancel, 0
}

// Started returns when the round's requests were sent: validity is measured
// from here.
func (r *Round[T]) Started() time.Time { return r.start }

// N returns the number of nodes.
func (r *Round[T]) N() int { return len(r.slots) }

// Done returns a channel closed when node i has answered (or given up).
func (r *Round[T]) Done(i int) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done == nil {
		r.done = make([]chan struct{}, len(r.slots))
	}
	if r.done[i] == nil {
		r.done[i] = make(chan struct{})
		if r.slots[i].in.Load() {
			close(r.done[i])
		}
	}
	return r.done[i]
}

// Reply returns node i's answer and true, or false if it has not answered.
func (r *Round[T]) Reply(i int) (Reply[T], bool) {
	s := &r.slots[i]
	if !s.in.Load() {
		return Reply[T]{}, false
	}
	return s.rep, true
}

// Settled reports whether every node has answered (or given up).
func (r *Round[T]) Settled() bool {
	for i := range r.slots {
		if !r.slots[i].in.Load() {
			return false
		}
	}
	return true
}

// Wait waits for every node's request, however late.
func (r *Round[T]) Wait() { r.wg.Wait() }
