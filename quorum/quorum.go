// Package quorum fans one request out to N nodes in parallel and decides as
// soon as the outcome is known: a majority agreed, or a majority can no longer
// agree. It also holds the validity arithmetic of the Redlock algorithm.
//
// The package knows nothing about Redis: a request is a function of the node
// index, and the caller says what each reply means with a [Vote].
//
// The hot path — every acquire, extend and release round — runs its
// requests on a [Workers], not on golang.org/x/sync/errgroup: a round
// decides at a majority and leaves its stragglers running, which a Group's
// Wait cannot express, and reused goroutines were measured cheaper. Profiled
// on 5 local nodes, 15% of the client's CPU in an uncontended Lock+Unlock
// was runtime.newstack/copystack with one fresh goroutine per request (each
// grows its stack several times deep in the Redis client's call path); on
// Workers a round costs two allocations and one timer, against 16
// allocations plus a closure per node with errgroup. Fan-outs that wait for
// every node and run rarely (redlock's Dial probes, Close's per-node
// release pipelines, the per-node release-retry loops) use a zero
// errgroup.Group, with SetLimit where it bounds work: there the clarity
// wins and the cost does not show.
package quorum

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Vote is what one node's reply means for the decision.
type Vote int8

// The votes.
const (
	Pending Vote = iota // no reply yet
	Yes                 // counts toward the quorum
	No                  // a definite refusal, e.g. the key is held by another owner
	Failed              // the node could not answer: an error or a timeout
)

func (v Vote) String() string {
	switch v {
	case Pending:
		return "pending"
	case Yes:
		return "yes"
	case No:
		return "no"
	case Failed:
		return "failed"
	}
	return fmt.Sprintf("Vote(%d)", int8(v))
}

// Reply is one node's answer.
type Reply[T any] struct {
	Val T
	Err error
}

// Collect waits until decide settles the tally, the node timeout has passed
// since Start (nodes still silent then count as Failed with a
// [*TimeoutError]; the fan-out enforces the timeout itself, since a Redis
// client may ignore a context deadline on a blocked read), or ctx is done
// (silent nodes count as Failed with ctx's error). classify turns a reply into
// a vote; it runs on the caller's goroutine. A node that failed after ctx
// ended and before the node timeout — silent, or answering with the error
// its request got from ctx's end (a Redis client may report it as an i/o
// timeout) — is marked in Tally.Cut: the caller gave up on it.
//
// Collect must be called at most once per Round.
func (r *Round[T]) Collect(ctx context.Context, classify func(node int, rep Reply[T]) (Vote, error), decide Decider) Tally {
	return r.CollectWake(ctx, classify, decide, nil)
}

// CollectWake is Collect that also asks decide again whenever wake
// delivers, without a new reply: for a decider that depends on something
// besides the tally (redlock counts a key handed over to the attempt by a
// node that refused it). A nil wake never delivers.
func (r *Round[T]) CollectWake(ctx context.Context, classify func(node int, rep Reply[T]) (Vote, error), decide Decider, wake <-chan struct{}) Tally {
	n := len(r.slots)
	t := Tally{Pending: n}
	if n <= smallN {
		t.Votes, t.Errs = r.votesA[:n:n], r.errsA[:n:n]
	} else {
		t.Votes, t.Errs = make([]Vote, n), make([]error, n)
	}
	take := func(i int) {
		v, err := classify(i, r.slots[i].rep)
		t.Record(i, v, err)
		if t.Votes[i] == Failed && ended(ctx) && !r.timedOut() {
			t.cut(i)
		}
	}
	// The round's ctx ends at the node timeout (when it, not the caller's
	// deadline, bounds the requests), when the caller's ctx given to Start
	// ends, or when every node has answered: one timer serves the requests
	// and the collector.
	rdone := r.ctx.Done()
	var late <-chan time.Time // the node timeout, once rdone no longer says it
	for t.Pending > 0 && !decide(t) {
		select {
		case i := <-r.notify:
			take(i)
		case <-rdone:
			// Replies sent before the end are in the channel already.
			for drained := false; !drained && !decide(t); {
				select {
				case i := <-r.notify:
					take(i)
				default:
					drained = true
				}
			}
			switch {
			case decide(t):
			case ended(ctx):
				r.callerEnded(ctx, &t)
			case r.timedOut():
				t.failPending(&TimeoutError{After: r.timeout}, false)
			default:
				// Start's ctx ended but not this one: the requests
				// return with its error; wait for them, but not past
				// the node timeout (a client may ignore ctx).
				rdone = nil
				if r.timeout > 0 {
					tm := time.NewTimer(r.timeout - time.Since(r.start))
					defer tm.Stop()
					late = tm.C
				}
			}
		case <-late:
			t.failPending(&TimeoutError{After: r.timeout}, false)
		case <-wake: // decide is asked again
		case <-ctx.Done():
			r.callerEnded(ctx, &t)
		}
	}
	t.Elapsed = time.Since(r.start)
	return t
}

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
	ctx     roundCtx           // the requests' ctx: the caller's values, bounded by the deadline
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
	// last node to answer releases it. It keeps ctx's values, not its
	// cancellation, and ends at start+timeout or at ctx's deadline,
	// whichever comes first (no deadline when timeout ≤ 0 and ctx has
	// none); r.ctx.timeout is the node timeout when it sets the deadline,
	// else 0 (see NodeTimeout).
	base := context.WithoutCancel(ctx)
	var cctx context.Context
	switch dl, ok := ctx.Deadline(); {
	case timeout > 0 && (!ok || dl.After(start.Add(timeout))):
		cctx, r.cancel = context.WithDeadline(base, start.Add(timeout))
		r.ctx.timeout = timeout
	case ok:
		cctx, r.cancel = context.WithDeadline(base, dl)
	default:
		cctx, r.cancel = context.WithCancel(base)
	}
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

// Started returns when the round's requests were sent: validity is measured
// from here.
func (r *Round[T]) Started() time.Time { return r.start }

// Reply returns node i's answer and true, or false if it has not answered.
func (r *Round[T]) Reply(i int) (Reply[T], bool) {
	s := &r.slots[i]
	if !s.in.Load() {
		return Reply[T]{}, false
	}
	return s.rep, true
}

// Tally is the state of a round when it was decided.
type Tally struct {
	Yes, No, Failed, Pending int
	Votes                    []Vote  // per node; Pending for a node whose reply was not waited for
	Errs                     []error // per node; the error of a Failed node
	// Cut is set for a Failed node that was cut short because the caller's
	// ctx ended before the node timeout: the caller gave up on it, which
	// says nothing about the node. Nil when there is none.
	Cut     []bool
	Elapsed time.Duration
}

// Record counts node i's vote v in t, with err for a Failed one, in place
// of what t held for it (Pending, as a rule): every tally's counts are
// made here. A vote other than Yes or No counts as Failed.
func (t *Tally) Record(i int, v Vote, err error) {
	switch t.Votes[i] { // what node i held leaves the counts
	case Pending:
		t.Pending--
	case Yes:
		t.Yes--
	case No:
		t.No--
	default:
		t.Failed--
	}
	switch v {
	case Pending:
		t.Pending++
	case Yes:
		t.Yes++
	case No:
		t.No++
	default:
		v = Failed
		t.Failed++
	}
	t.Votes[i], t.Errs[i] = v, err
}

// Counted returns the tally of votes (one per node) and their errors.
func Counted(votes []Vote, errs []error) Tally {
	t := Tally{Votes: votes, Errs: errs, Pending: len(votes)}
	for i, v := range votes {
		t.Votes[i] = Pending
		t.Record(i, v, errs[i])
	}
	return t
}

// Size returns the number of nodes that make a majority of n: n/2+1. For
// even n it is one more than half, so two disjoint halves can never both win.
// Size(0) is 1, so that no empty set of nodes is ever a quorum.
func Size(n int) int {
	if n <= 0 {
		return 1
	}
	return n/2 + 1
}

// Quorum reports whether a majority voted yes.
func (t Tally) Quorum() bool { return t.Yes >= Size(len(t.Votes)) }

// Decider says whether a tally settles the round. See [Majority] and [All].
type Decider func(t Tally) bool

// Majority settles a round as soon as a majority voted yes, or a majority of
// yes votes has become impossible.
func Majority(t Tally) bool {
	q := Size(len(t.Votes))
	return t.Yes >= q || t.Yes+t.Pending < q
}

// All settles a round only when every node has answered.
func All(t Tally) bool { return t.Pending == 0 }
