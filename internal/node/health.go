package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/nodecheck"
)

// What a Client knows of each node's health, so that a call is answered by
// what the node is doing, not by the go-redis options its client was built
// with (issue 21):
//
//   - a node whose last dial failed (refused, unresolvable) is down: its
//     requests fail at once with the dialer's error, Kind "connection",
//     while one probe per node and Client checks it in the background;
//   - a node with requests in flight and no reply for longer than a
//     request's timeout is stuck (paused, or a link that drops packets): its
//     requests fail at once instead of queuing in its sockets behind the
//     earlier ones, which a client built without ContextTimeoutEnabled keeps
//     waiting until its read timeout (3s by default) — DESIGN step 2.
//
// Failing a request early is always safe for the algorithm: a node that
// fails grants nothing, and a request that was never sent cannot land.

// health is one node's health as seen by one Client.
type health struct {
	inflight atomic.Int32 // requests sent and not returned
	// due is when the node is late (monoNow time): the deadline of the
	// request that found none in flight, pushed to a node timeout after
	// each return while others are in flight.
	due     atomic.Int64
	probing atomic.Bool // a probe of a down node is running
	// grace is how late past its deadline a request in flight must be
	// for the node to count as stuck: 0 for a client that may ignore ctx
	// on reads (ContextTimeoutEnabled false: its requests wait for the read
	// timeout), lateGrace for one that honours it (a request late by more
	// is stuck in the node, not in a busy scheduler).
	grace time.Duration
	dials *dialState // shared by every Client over the same node client
}

// dialState records the dials of one node client (go-redis DialHook).
type dialState struct {
	err atomic.Pointer[error] // the last dial's error; nil once a dial or a request succeeded
}

func (d *dialState) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		switch {
		case err == nil:
			d.set(nil)
		case ctx.Err() == nil && !nodecheck.IsTimeout(err):
			// Refused, unresolvable, unreachable: the node is down. A dial
			// cut short by its ctx, or one that timed out, says less.
			d.set(err)
		}
		return conn, err
	}
}

func (d *dialState) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (d *dialState) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (d *dialState) set(err error) {
	if err == nil {
		d.up()
		return
	}
	d.err.Store(&err)
}

// dialStates holds one dialState per node client, so that Clients built
// one after another over the same clients add one hook in all (go-redis has
// no RemoveHook). Keys are weak: the entry goes with the client.
var dialStates sync.Map // weak.Pointer[redis.Client] or weak.Pointer[redis.ClusterClient] → *dialState

// dialsOf returns the dialState of n, adding its hook on first use; nil
// for a node client of another type (it is not watched).
func dialsOf(n redis.UniversalClient) *dialState {
	switch c := n.(type) {
	case *redis.Client:
		return stateFor(c, func(d *dialState) { c.AddHook(d) })
	case *redis.ClusterClient:
		// A Cluster client's own hooks do not see its nodes' dials.
		return stateFor(c, func(d *dialState) { c.OnNewNode(func(rdb *redis.Client) { rdb.AddHook(d) }) })
	}
	return nil
}

var dialStatesMu sync.Mutex // serializes adding hooks: one per client

func stateFor[T any](c *T, hook func(*dialState)) *dialState {
	key := weak.Make(c)
	if d, ok := dialStates.Load(key); ok {
		return d.(*dialState)
	}
	dialStatesMu.Lock()
	defer dialStatesMu.Unlock()
	if d, ok := dialStates.Load(key); ok {
		return d.(*dialState)
	}
	d := &dialState{}
	hook(d)
	dialStates.Store(key, d)
	// The hook keeps d alive as long as the client; the map entry goes
	// when the client does.
	runtime.AddCleanup(c, func(k weak.Pointer[T]) { dialStates.Delete(k) }, key)
	return d
}

// lateGrace is the grace of a node client that honours ctx deadlines.
const lateGrace = 250 * time.Millisecond

// newHealth returns the health of node n, adding the dial hook to its
// client on first use (once per client, whichever Clients share it).
func newHealth(n redis.UniversalClient) *health {
	h := &health{dials: dialsOf(n)}
	switch c := n.(type) {
	case *redis.Client:
		if c.Options().ContextTimeoutEnabled {
			h.grace = lateGrace
		}
	case *redis.ClusterClient:
		if c.Options().ContextTimeoutEnabled {
			h.grace = lateGrace
		}
	}
	return h
}

// Down returns the error of the node's last dial, or nil once a dial or a
// request succeeded.
func (h *health) Down() error { return h.dials.down() }

// setUp records that the node answered a probe.
func (h *health) setUp() { h.dials.set(nil) }

// startProbe reports whether the caller is to run the node's probe: false
// while one runs. The probe calls endProbe when it ends.
func (h *health) startProbe() bool { return h.probing.CompareAndSwap(false, true) }

// endProbe ends the probe that startProbe began.
func (h *health) endProbe() { h.probing.Store(false) }

// probeEvery is how often a down node is probed: its node timeout, within
// [250ms, 1s] — a dead node gets at most four dials a second from a Client
// (with the release loops' own requests, TestReal_releasesWithAKilledNodeStayBounded
// allows five), and one that is back is noticed within the interval. Not
// sooner than go-redis lets it: once its pool has counted PoolSize failed
// dials (reset only after that, by its own probe), it returns the last
// dial's error without dialing and dials once a second itself, so a node
// back from a long outage can take up to a second more
// (TestReal_nodeBackIsUsedAgain).
func probeEvery(timeout time.Duration) time.Duration {
	return min(max(timeout, 250*time.Millisecond), time.Second)
}

// Cause returns the real cause of a failure err of a request to the node:
// one that timed out while the node's dials fail was down, and says so
// with the dialer's error. The request may still have landed: the error
// does not match errNotSent.
func (h *health) Cause(err error) error {
	if err == nil || !nodecheck.IsTimeout(err) || errors.Is(err, errNotSent) {
		return err
	}
	if down := h.dials.down(); down != nil {
		return &connError{Err: fmt.Errorf("%w (its dials fail; %v)", down, err)}
	}
	return err
}

// What a failed request may have done, as the node's health and the
// registry read it: never sent, answered, or possibly landed later.

// errNotSent marks the error of a request that provably never left the
// client: it cannot land on the node later.
var errNotSent = errors.New("not sent")

// What the node layer alone can tell of a request's failure travels with
// its error, as a method FailureKind() string that a caller finds with
// errors.As: "connection" (the node's dials fail: the error says the
// dialer's) on connError, "busy" (not sent: the node's in-flight cap was
// full) on busyError. Package redlock's NodeError.Kind reads it so. The
// name is the layer's own: an error of a user's Dialer with a method
// Kind() string says nothing of ours.

// errBusy is the error of a request not sent because the node's in-flight
// cap was full. It matches errNotSent.
var errBusy = &busyError{}

type busyError struct{}

func (*busyError) Error() string       { return "too many requests in flight on this node" }
func (*busyError) Unwrap() error       { return errNotSent }
func (*busyError) FailureKind() string { return "busy" }

// errMayHaveLanded marks the error of a request that may have been written
// before it failed (see neverWrote).
var errMayHaveLanded = errors.New("may have landed")

// mayHaveLanded marks err as the error of a request that may have been
// written before it failed (a pipeline that sent part of its commands): it
// reads as err, and neverWrote is false for it.
func mayHaveLanded(err error) error { return &markedError{err, errMayHaveLanded} }

// neverSent marks err as the error of a request that was never written.
func neverSent(err error) error { return &markedError{err, errNotSent} }

// markedError is an error with a marker; it reads as the error itself.
type markedError struct{ err, mark error }

func (e *markedError) Error() string   { return e.err.Error() }
func (e *markedError) Unwrap() []error { return []error{e.err, e.mark} }

// connError is the error of a node that could not be reached: its dial
// failed (refused, unresolvable, unreachable); Err is the dialer's error.
type connError struct {
	Err     error
	notSent bool // the request was not sent: the node was known down
}

func (*connError) FailureKind() string { return "connection" }

func (e *connError) Error() string {
	if e.notSent {
		return "not sent: the node is down (last dial: " + e.Err.Error() + ")"
	}
	return e.Err.Error()
}

func (e *connError) Unwrap() []error {
	if e.notSent {
		return []error{errNotSent, e.Err}
	}
	return []error{e.Err}
}

// stuckError is the error of a request not sent because a request to the
// node is in flight past its deadline, with no reply since. It matches
// context.DeadlineExceeded and errNotSent.
type stuckError struct {
	Late     time.Duration
	InFlight int32
}

func (e *stuckError) Error() string {
	return fmt.Sprintf("not sent: the node is not answering (%d requests in flight, the oldest past its deadline by %v)",
		e.InFlight, e.Late.Round(time.Millisecond))
}

func (e *stuckError) Unwrap() []error { return []error{errNotSent, context.DeadlineExceeded} }
