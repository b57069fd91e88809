package redlock

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

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
//
// The clock that matters is the one the key's scripts read: on a plain
// node, the server's; on a Redis Cluster node, the key's master's, and a
// Cluster's masters are separate hosts whose clocks may differ by seconds.
// TIME has no key, so go-redis sends it to any master; a Cluster node
// therefore keeps one estimate per master (masterClock), probed with a
// keyed script on that master (clockProbe), and a request's bound and a
// release's guard use the estimate of its key's master (clockFor).

// clockRefresh is how old a node's clock estimate may get before a request
// that uses it starts a new probe in the background. The estimate stays
// usable meanwhile: its error grows with its age by the drift factor.
const clockRefresh = time.Second

// maxMasterClocks is how many masters of one Cluster node keep a clock
// estimate before the idle ones are dropped (see clockFor).
const maxMasterClocks = 1024

// clockEstimate is what one TIME round trip to a node says of its clock:
// at the local instant at (monotonic), the node's clock read nodeUS
// (Unix µs), within ±err.
type clockEstimate struct {
	at     time.Time
	nodeUS int64
	err    time.Duration // half the round trip plus the drift over it, plus TIME's resolution
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

// masterClock is what a Client knows of one server's clock: a plain node,
// or one master of a Cluster node.
type masterClock struct {
	est atomic.Pointer[clockEstimate] // nil until the first probe answered
	// maxBound is the latest bound (the server's ms) any request to the
	// server was sent with; recorded before the request is sent.
	maxBound atomic.Int64
	probing  atomic.Bool // a background refresh is in flight
	dropped  atomic.Bool // Cluster: no longer in nodeClock.masters (set under mastersMu)

	mu      sync.Mutex    // protects first, lastErr
	first   chan struct{} // closed when the probe that learns the first estimate ends; nil when none runs
	lastErr error         // that probe's error, when it learned nothing
}

// idle reports whether dropping mc loses nothing a guard needs: no probe
// runs, and the server's clock has surely passed every bound sent to it
// (none is, before its clock is known). A request sent later learns the
// clock again.
func (mc *masterClock) idle(now time.Time, drift float64) bool {
	if mc.probing.Load() {
		return false
	}
	mc.mu.Lock()
	learning := mc.first != nil
	mc.mu.Unlock()
	if learning {
		return false
	}
	e := mc.est.Load()
	return e == nil || mc.maxBound.Load()*1000 < e.lower(now, drift)
}

// nodeClock is what a Client knows of one node's clock. A plain node is
// one server: its masterClock is the embedded one. A Cluster node has one
// per master, in masters.
type nodeClock struct {
	masterClock
	// unbounded is set once a request went out without a bound (a round
	// without a deadline): it may land at any later time, on any master.
	unbounded atomic.Bool

	mastersMu sync.RWMutex            // protects masters
	masters   map[string]*masterClock // Cluster: per master address
}

// clockProbe reads the clock of one server: TIME on a plain node (n),
// the keyed script for key on Cluster master m otherwise. It is a value,
// so that a request that needs no probe allocates nothing for it.
type clockProbe struct {
	n   redis.UniversalClient // a plain node
	cc  *redis.ClusterClient  // a Cluster node, with m and key
	m   *redis.Client
	key string
	// fake replaces the probe in tests.
	fake func(ctx context.Context) (time.Time, error)
}

// notAfter returns the bound for a request for key to node i whose caller
// stops waiting at ctx's deadline: the latest the clock of the server that
// runs it (key's master on a Cluster node) can read then, in whole ms
// rounded up, so that a request still waited for is never refused. Before
// that clock is known it learns it first (one round trip, bounded by ctx;
// later calls share it): New does no I/O, and no request goes out
// unbounded. A probe takes at most the Client's node timeout (see
// probeTimeout). The bound is recorded before it is returned (see
// guardLifetime). With testhooks.SkipNotAfter it returns 0 (no bound), the
// negative control.
func (c *Client) notAfter(ctx context.Context, i int, key string) (int64, error) {
	for {
		mc, probe, err := c.clockFor(ctx, i, key)
		if err != nil {
			return 0, err
		}
		b, err := c.boundOn(ctx, i, mc, probe)
		// A Cluster master's clock dropped meanwhile (nodeClock.master)
		// may have lost b before a guard saw it: take the master's clock
		// afresh. One not dropped keeps b until its clock has passed it.
		if err != nil || !mc.dropped.Load() {
			return b, err
		}
	}
}

// boundOn is notAfter on the clock mc.
func (c *Client) boundOn(ctx context.Context, i int, mc *masterClock, probe clockProbe) (int64, error) {
	e := mc.est.Load()
	if e == nil {
		var err error
		if e, err = c.learnClock(ctx, mc, probe); err != nil {
			return 0, err
		}
	}
	now := time.Now()
	if now.Sub(e.at) > clockRefresh && mc.probing.CompareAndSwap(false, true) {
		c.goCallback(func() {
			defer mc.probing.Store(false)
			_ = c.probeClock(mc, probe)
		})
	}
	dl, ok := ctx.Deadline()
	if !ok {
		c.clocks[i].unbounded.Store(true)
		return 0, nil
	}
	b := ceilMS(e.upper(dl, c.cfg.drift))
	for {
		old := mc.maxBound.Load()
		if b <= old || mc.maxBound.CompareAndSwap(old, b) {
			break
		}
	}
	if testhooks.SkipNotAfter.Load() {
		return 0, nil
	}
	return b, nil
}

// learnClock waits for the first estimate of mc's clock, starting the
// probe that learns it unless one runs, at most until ctx ends.
func (c *Client) learnClock(ctx context.Context, mc *masterClock, probe clockProbe) (*clockEstimate, error) {
	mc.mu.Lock()
	if e := mc.est.Load(); e != nil {
		mc.mu.Unlock()
		return e, nil
	}
	ch := mc.first
	if ch == nil {
		ch = make(chan struct{})
		mc.first = ch
		c.mu.Lock()
		closed := c.closed
		if !closed {
			c.wg.Go(func() {
				err := c.probeClock(mc, probe)
				mc.mu.Lock()
				mc.first, mc.lastErr = nil, err
				mc.mu.Unlock()
				close(ch)
				if err == nil {
					// The first round trip likely included the dial: one
					// more on the pooled connection tightens the error.
					_ = c.probeClock(mc, probe)
				}
			})
		}
		c.mu.Unlock()
		if closed {
			mc.first = nil
			mc.mu.Unlock()
			return nil, ErrClosed
		}
	}
	mc.mu.Unlock()
	select {
	case <-ch:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if e := mc.est.Load(); e != nil {
		return e, nil
	}
	mc.mu.Lock()
	err := mc.lastErr
	mc.mu.Unlock()
	return nil, fmt.Errorf("learning the node's clock (TIME): %w", err)
}

// probeTimeout bounds a TIME probe: the Client's node timeout, so that
// Close's wait covers it, and no estimate is worse than half of it.
func (c *Client) probeTimeout() time.Duration { return c.cfg.timeout() }

// probeClock reads mc's clock with probe, at most for probeTimeout, and
// keeps the estimate when it is better than the one known at that moment
// (or disagrees with it: the clock was set).
//
// The server read its clock at some local instant in [send, recv], at most
// half the round trip from their middle; over that half its clock ran at
// most drift faster or slower than ours. So at the middle it read within
// half·(1+drift) of what it answered, plus a µs for TIME's resolution.
func (c *Client) probeClock(mc *masterClock, probe clockProbe) error {
	ctx, cancel := context.WithTimeout(context.Background(), c.probeTimeout())
	defer cancel()
	send := time.Now()
	t, err := probe.read(ctx)
	recv := time.Now()
	if err != nil {
		return err
	}
	half := recv.Sub(send) / 2
	errUS := half + time.Duration(c.cfg.drift*float64(half)) + time.Microsecond
	e := &clockEstimate{at: send.Add(half), nodeUS: t.UnixMicro(), err: errUS}
	for {
		old := mc.est.Load()
		if old != nil {
			oldErr := old.errAt(e.at, c.cfg.drift)
			agree := abs64(old.mid(e.at)-e.nodeUS) <= (oldErr+e.err).Microseconds()+2
			if e.err > oldErr && agree {
				return nil // the known estimate is as good: keep it
			}
		}
		if mc.est.CompareAndSwap(old, e) {
			return nil
		}
	}
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
