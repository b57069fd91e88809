// What ends a round short of its answers: the node timeout (TimeoutError,
// NodeTimeout), the caller's ctx (callerEnded), and the tally of what was
// cut (CutShort); and waiting for a round's stragglers (Done, Settled,
// Wait).

package quorum

import (
	"context"
	"errors"
	"fmt"
	"time"
)

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

func (t *Tally) failPending(err error, cut bool) {
	for i, v := range t.Votes {
		if v == Pending {
			t.Record(i, Failed, err)
			if cut {
				t.cut(i)
			}
		}
	}
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

// callerEnded fails the nodes still pending when the caller's ctx ended.
func (r *Round[T]) callerEnded(ctx context.Context, t *Tally) {
	var err error = &TimeoutError{After: time.Since(r.start), Caller: true}
	if cerr := ctx.Err(); cerr != nil && !errors.Is(cerr, context.DeadlineExceeded) {
		err = cerr // cancelled, not timed out
	}
	t.failPending(err, !r.timedOut())
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
