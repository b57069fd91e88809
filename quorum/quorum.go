// Package quorum fans one request out to N nodes in parallel and decides as
// soon as the outcome is known: a majority agreed, or a majority can no longer
// agree. It also holds the validity arithmetic of the Redlock algorithm.
//
// The package knows nothing about Redis: a request is a function of the node
// index, and the caller says what each reply means with a [Vote].
package quorum

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
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

// TimeoutError is the error of a node that did not answer within the node
// timeout, or before the caller's deadline (Caller). It matches
// context.DeadlineExceeded.
type TimeoutError struct {
	After  time.Duration
	Caller bool // the caller's ctx deadline came first
}

func (e *TimeoutError) Error() string {
	if e.Caller {
		return fmt.Sprintf("no reply before the caller's deadline (%v)", e.After.Round(time.Millisecond))
	}
	return fmt.Sprintf("no reply within %v", e.After.Round(time.Millisecond))
}

// Unwrap makes errors.Is(err, context.DeadlineExceeded) hold.
func (e *TimeoutError) Unwrap() error { return context.DeadlineExceeded }

// Reply is one node's answer.
type Reply[T any] struct {
	Val T
	Err error
}

// Round is one request sent to every node at once. Each node's goroutine
// writes only its own slot, and the notification channel is buffered to N,
// so a node that answers after the decision never blocks: it finishes in the
// background, bounded by the node timeout, and is waited for by whoever
// passed the WaitGroup to Start.
//
// A Round is safe for concurrent use once started.
type Round[T any] struct {
	start   time.Time
	timeout time.Duration
	g       errgroup.Group // the zero Group: it never cancels the others on an error
	replies []Reply[T]     // slot i written once by node i's goroutine, before done[i] is closed
	done    []chan struct{}
	notify  chan int // buffered to N: node i sends i once
}

// Start sends call to nodes 0..n-1 in parallel, one goroutine each, and
// returns at once. The calls share a context bounded by timeout (only when
// the caller's deadline is later), released when the last one returns. If wg is not nil, each goroutine is added to
// it, so that an owner can wait for stragglers after an early decision.
func Start[T any](ctx context.Context, n int, timeout time.Duration, wg *sync.WaitGroup, call func(ctx context.Context, node int) (T, error)) *Round[T] {
	r := &Round[T]{
		start:   time.Now(),
		timeout: timeout,
		replies: make([]Reply[T], n),
		done:    make([]chan struct{}, n),
		notify:  make(chan int, n),
	}
	if wg != nil {
		wg.Add(n)
	}
	// One context for the round: every request starts now with the same
	// timeout, so one deadline serves them all. The last node to answer
	// releases it.
	cctx, cancel := withTimeout(ctx, timeout)
	if dl, ok := ctx.Deadline(); timeout > 0 && (!ok || time.Until(dl) > timeout) {
		// The node timeout, not the caller, sets the requests' deadline.
		cctx = context.WithValue(cctx, timeoutKey{}, timeout)
	}
	var left atomic.Int32
	left.Store(int32(n))
	if n == 0 {
		cancel()
	}
	for i := range n {
		r.done[i] = make(chan struct{})
		r.g.Go(func() error {
			if wg != nil {
				defer wg.Done()
			}
			v, err := call(cctx, i)
			if left.Add(-1) == 0 {
				cancel()
			}
			r.replies[i] = Reply[T]{Val: v, Err: err}
			close(r.done[i])
			r.notify <- i
			return nil
		})
	}
	return r
}

type timeoutKey struct{}

// NodeTimeout returns the node timeout of the round whose request ctx is,
// when that timeout (not the caller's earlier deadline) bounds it, so that a
// request that timed out can say "no reply within" it.
func NodeTimeout(ctx context.Context) (time.Duration, bool) {
	d, ok := ctx.Value(timeoutKey{}).(time.Duration)
	return d, ok
}

// withTimeout bounds ctx by d, unless ctx already ends sooner.
func withTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 {
		return context.WithCancel(ctx)
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= d {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}

// Started returns when the round's requests were sent: validity is measured
// from here.
func (r *Round[T]) Started() time.Time { return r.start }

// N returns the number of nodes.
func (r *Round[T]) N() int { return len(r.done) }

// Done returns a channel closed when node i has answered (or given up).
func (r *Round[T]) Done(i int) <-chan struct{} { return r.done[i] }

// Reply returns node i's answer and true, or false if it has not answered.
func (r *Round[T]) Reply(i int) (Reply[T], bool) {
	select {
	case <-r.done[i]:
		return r.replies[i], true
	default:
		return Reply[T]{}, false
	}
}

// Settled reports whether every node has answered (or given up).
func (r *Round[T]) Settled() bool {
	for _, d := range r.done {
		select {
		case <-d:
		default:
			return false
		}
	}
	return true
}

// Wait waits for every node's goroutine, however late.
func (r *Round[T]) Wait() { _ = r.g.Wait() }

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

// CutShort returns how many Failed nodes were cut short by the caller.
func (t Tally) CutShort() int {
	n := 0
	for _, c := range t.Cut {
		if c {
			n++
		}
	}
	return n
}

func (t *Tally) cut(i int) {
	if t.Cut == nil {
		t.Cut = make([]bool, len(t.Votes))
	}
	t.Cut[i] = true
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
	n := len(r.done)
	t := Tally{Pending: n, Votes: make([]Vote, n), Errs: make([]error, n)}
	var timeout <-chan time.Time
	if r.timeout > 0 {
		tm := time.NewTimer(r.timeout - time.Since(r.start))
		defer tm.Stop()
		timeout = tm.C
	}
	for !decide(t) {
		select {
		case i := <-r.notify:
			v, err := classify(i, r.replies[i])
			t.Votes[i], t.Errs[i] = v, err
			t.Pending--
			switch v {
			case Yes:
				t.Yes++
			case No:
				t.No++
			default:
				t.Votes[i] = Failed
				t.Failed++
				if ended(ctx) && !r.timedOut() {
					t.cut(i)
				}
			}
		case <-timeout:
			t.failPending(&TimeoutError{After: r.timeout}, false)
		case <-ctx.Done():
			var err error = &TimeoutError{After: time.Since(r.start), Caller: true}
			if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
				err = ctx.Err() // cancelled, not timed out
			}
			t.failPending(err, !r.timedOut())
		}
	}
	t.Elapsed = time.Since(r.start)
	return t
}

// ended reports whether ctx is done or past its deadline: a request may
// report the deadline (as an i/o timeout, say) a moment before ctx does.
func ended(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

// timedOut reports whether the node timeout has passed since Start.
func (r *Round[T]) timedOut() bool {
	return r.timeout > 0 && time.Since(r.start) >= r.timeout
}

func (t *Tally) failPending(err error, cut bool) {
	for i, v := range t.Votes {
		if v == Pending {
			t.Votes[i], t.Errs[i] = Failed, err
			t.Failed++
			if cut {
				t.cut(i)
			}
		}
	}
	t.Pending = 0
}
