package redlock

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quorumlock/quorumlock/internal/testhooks"
)

// Requests that carry their own deadline (DESIGN step 4). Every acquire and
// extend carries a "not after" bound in the node's own clock: the node's
// TIME past which the client no longer waits for the request. The scripts
// refuse a request that runs later, however long it sat in the network or
// in a paused node's socket, so it changes nothing there. The bound comes
// from an estimate of each node's clock (nodeClock), learned from TIME
// round trips; the release guard then only has to cover the window that
// the estimate's error leaves (guardLifetime). doc.go has the argument.

// clockRefresh is how old a node's clock estimate may get before a request
// that uses it starts a new probe in the background. The estimate stays
// usable meanwhile: its error grows with its age by the drift factor.
const clockRefresh = time.Second

// clockEstimate is what one TIME round trip to a node says of its clock:
// at the local instant at (monotonic), the node's clock read nodeUS
// (Unix µs), within ±err.
type clockEstimate struct {
	at     time.Time
	nodeUS int64
	err    time.Duration // half the round trip, plus TIME's resolution
}

// errAt is the estimate's error at local instant t: its own, plus the drift
// factor times the time since it was made (the two clocks' rates differ
// by at most drift).
func (e *clockEstimate) errAt(t time.Time, drift float64) time.Duration {
	d := t.Sub(e.at)
	if d < 0 {
		d = -d
	}
	return e.err + time.Duration(drift*float64(d))
}

// mid is the node's clock at local instant t, in µs, as the estimate
// predicts it (the error aside).
func (e *clockEstimate) mid(t time.Time) int64 {
	return e.nodeUS + t.Sub(e.at).Microseconds()
}

// upper is the latest the node's clock can read at local instant t, in µs.
func (e *clockEstimate) upper(t time.Time, drift float64) int64 {
	return e.mid(t) + e.errAt(t, drift).Microseconds() + 1
}

// lower is the earliest the node's clock can read at local instant t.
func (e *clockEstimate) lower(t time.Time, drift float64) int64 {
	return e.mid(t) - e.errAt(t, drift).Microseconds() - 1
}

// nodeClock is what a Client knows of one node's clock.
type nodeClock struct {
	est atomic.Pointer[clockEstimate] // nil until the first probe answered
	// maxBound is the latest bound (node ms) any request to the node was
	// sent with; recorded before the request is sent.
	maxBound atomic.Int64
	// unbounded is set once a request went out without a bound (a round
	// without a deadline): it may land at any later time.
	unbounded atomic.Bool
	probing   atomic.Bool // a background refresh is in flight

	mu      sync.Mutex    // protects first, lastErr
	first   chan struct{} // closed when the probe that learns the first estimate ends; nil when none runs
	lastErr error         // that probe's error, when it learned nothing
}

// notAfter returns the bound for a request to node i whose caller stops
// waiting at ctx's deadline: the latest the node's clock can read then, in
// whole ms rounded up, so that a request still waited for is never refused.
// Before the node's clock is known it learns it first (one TIME round
// trip, bounded by ctx; later calls share it): New does no I/O, and no
// request goes out unbounded. A probe takes at most the Client's node
// timeout (see probeTimeout). The bound is
// recorded before it is returned (see guardLifetime). With
// testhooks.SkipNotAfter it returns 0 (no bound), the negative control.
func (c *Client) notAfter(ctx context.Context, i int) (int64, error) {
	nc := &c.clocks[i]
	e := nc.est.Load()
	if e == nil {
		var err error
		if e, err = c.learnClock(ctx, i); err != nil {
			return 0, err
		}
	}
	now := time.Now()
	if now.Sub(e.at) > clockRefresh && nc.probing.CompareAndSwap(false, true) {
		c.goCallback(func() {
			defer nc.probing.Store(false)
			_ = c.probeClock(i)
		})
	}
	dl, ok := ctx.Deadline()
	if !ok {
		nc.unbounded.Store(true)
		return 0, nil
	}
	b := ceilMS(e.upper(dl, c.cfg.drift))
	for {
		old := nc.maxBound.Load()
		if b <= old || nc.maxBound.CompareAndSwap(old, b) {
			break
		}
	}
	if testhooks.SkipNotAfter.Load() {
		return 0, nil
	}
	return b, nil
}

// learnClock waits for the first estimate of node i's clock, starting the
// probe that learns it unless one runs, at most until ctx ends.
func (c *Client) learnClock(ctx context.Context, i int) (*clockEstimate, error) {
	nc := &c.clocks[i]
	nc.mu.Lock()
	if e := nc.est.Load(); e != nil {
		nc.mu.Unlock()
		return e, nil
	}
	ch := nc.first
	if ch == nil {
		ch = make(chan struct{})
		nc.first = ch
		c.mu.Lock()
		closed := c.closed
		if !closed {
			c.wg.Go(func() {
				err := c.probeClock(i)
				nc.mu.Lock()
				nc.first, nc.lastErr = nil, err
				nc.mu.Unlock()
				close(ch)
				if err == nil {
					// The first round trip likely included the dial: one
					// more on the pooled connection tightens the error.
					_ = c.probeClock(i)
				}
			})
		}
		c.mu.Unlock()
		if closed {
			nc.first = nil
			nc.mu.Unlock()
			return nil, ErrClosed
		}
	}
	nc.mu.Unlock()
	select {
	case <-ch:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if e := nc.est.Load(); e != nil {
		return e, nil
	}
	nc.mu.Lock()
	err := nc.lastErr
	nc.mu.Unlock()
	return nil, fmt.Errorf("learning the node's clock (TIME): %w", err)
}

// probeTimeout bounds a TIME probe: the Client's node timeout, so that
// Close's wait covers it, and no estimate is worse than half of it.
func (c *Client) probeTimeout() time.Duration { return c.cfg.timeout() }

// probeClock reads node i's clock with TIME, at most for probeTimeout, and
// keeps the estimate when it is better than the one known at that moment
// (or disagrees with it: the node's clock was set).
func (c *Client) probeClock(i int) error {
	ctx, cancel := context.WithTimeout(context.Background(), c.probeTimeout())
	defer cancel()
	send := time.Now()
	t, err := c.nodes[i].C.Time(ctx).Result()
	recv := time.Now()
	if err != nil {
		return err
	}
	half := recv.Sub(send) / 2
	e := &clockEstimate{at: send.Add(half), nodeUS: t.UnixMicro(), err: half + time.Microsecond}
	nc := &c.clocks[i]
	for {
		old := nc.est.Load()
		if old != nil {
			oldErr := old.errAt(e.at, c.cfg.drift)
			agree := abs64(old.mid(e.at)-e.nodeUS) <= (oldErr+e.err).Microseconds()+2
			if e.err > oldErr && agree {
				return nil // the known estimate is as good: keep it
			}
		}
		if nc.est.CompareAndSwap(old, e) {
			return nil
		}
	}
}

// guardLifetime is how long a release's guard must stay on the nodes
// (DESIGN step 4), for a lock with this TTL and node timeout: until every
// node's clock has surely passed the bound of every request of ours that
// can still land there. For each node that is the latest bound sent (or
// that a request of the lock, sent before now but not yet recorded, can
// carry: its deadline is at most a node timeout from now) less the earliest
// the node's clock can read now, plus a margin. A node whose clock is not
// known yet gets twice the node timeout and the probe's (a request waiting
// for the first probe gets an estimate whose error is at most half the
// probe's timeout). A node that was ever sent a
// request without a bound keeps the guard of before, twice the TTL.
func (c *Client) guardLifetime(ttl, timeout time.Duration) time.Duration {
	const margin = 2 * time.Millisecond
	now := time.Now()
	drift := c.cfg.drift
	g := time.Millisecond
	for i := range c.clocks {
		nc := &c.clocks[i]
		if nc.unbounded.Load() {
			return max(g, 2*ttl)
		}
		e := nc.est.Load()
		if e == nil {
			g = max(g, 2*(timeout+c.probeTimeout())+margin)
			continue
		}
		// A request sent meanwhile uses this estimate or a better one
		// (probeClock keeps the better): its bound is at most the upper
		// bound of the node's clock at its deadline plus twice that error.
		dl := now.Add(timeout)
		pending := e.upper(dl, drift) + 2*e.errAt(dl, drift).Microseconds()
		latest := max(nc.maxBound.Load()*1000, pending)
		need := time.Duration(latest-e.lower(now, drift))*time.Microsecond + margin
		g = max(g, need)
	}
	return (g + time.Millisecond - 1).Truncate(time.Millisecond)
}

// ceilMS converts µs to ms, rounding up.
func ceilMS(us int64) int64 {
	if us <= 0 {
		return 0
	}
	return (us + 999) / 1000
}

func abs64(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}
