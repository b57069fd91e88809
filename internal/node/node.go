package node

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/nodeaddr"
	"github.com/quorumlock/quorumlock/internal/nodecheck"
	"github.com/quorumlock/quorumlock/internal/scripts"
	"github.com/quorumlock/quorumlock/quorum"
)

// maxInFlight caps the requests one Client has in flight on one node, so
// that a node that hangs cannot pile up goroutines without bound.
const maxInFlight = 1024

// Node is one Redis master as one Client uses it: its client, its health,
// its in-flight cap, and (in a Set) its identity check and clock.
type Node struct {
	C       redis.UniversalClient
	Addr    string
	Cluster bool // a Redis Cluster client: keys of a lock share a hash tag
	Health  *health
	// noRetries is set for a node client whose go-redis retries are off
	// (built with MaxRetries -1): only then does a dial error prove that
	// a request was never written (see neverWrote).
	noRetries bool
	sem       chan struct{} // requests in flight, capped
	// Of a node of a Set (nil otherwise): its identity check and its
	// clock (Set.identify below, clock.go).
	id    *identity
	clock *nodeClock
}

// newNode returns the node of client c (no I/O).
func newNode(c redis.UniversalClient) Node {
	_, cluster := c.(*redis.ClusterClient)
	return Node{C: c, Addr: nodeaddr.Of(c), Cluster: cluster, Health: newHealth(c),
		noRetries: retriesOff(c), sem: make(chan struct{}, maxInFlight)}
}

// retriesOff reports whether go-redis never retries a request of c: a
// client built with MaxRetries -1. NewClient stores the options it used,
// with -1 turned into 0 and 0 (the default) into 3, so the 0 that
// Options() returns is "no retries" (go-redis v9 options.go init; a
// negative value there is one below -1, which New refuses, see
// nodecheck.DroppedCommands). A Cluster client is never counted so: it retries on
// redirects too.
func retriesOff(c redis.UniversalClient) bool {
	rc, ok := c.(*redis.Client)
	return ok && rc.Options().MaxRetries == 0
}

// do runs fn on node n, node i of s (n is s.Nodes[i], or a client of its
// own for that node: Linked.Token): the one path of every request of the
// library. A request is not sent, and fails at once with an error matching
// errNotSent, to a node known down (its background probe is started:
// probeDown) or stuck, or when the in-flight cap is full (errBusy). With
// gated, the Set's identity check of node i runs first, on the same ctx,
// before this Client's first request there; its error is the request's.
// fn's error is classified here, before anything wraps it: only one that
// proves the request was never written matches errNotSent (see
// neverWrote); a timeout says "no reply within" the round's node timeout,
// and one while the node's dials fail carries the dialer's error (see
// health.Cause). timeout is the request's budget when ctx has no deadline.
func do[T any](ctx context.Context, s *Set, i int, n *Node, gated bool, timeout time.Duration, fn func(ctx context.Context, s redis.Scripter) (T, error)) (T, error) {
	var zero T
	start := time.Now()
	due, ok := ctx.Deadline()
	if !ok {
		due = start.Add(timeout)
	}
	h := n.Health
	err, isDown := h.refuse()
	if err != nil {
		if isDown {
			s.probeDown(i)
		}
		return zero, err
	}
	select {
	case n.sem <- struct{}{}:
	default:
		return zero, errBusy
	}
	// In flight from here until returned: while other requests are in
	// flight, the node is late once the first one's due has passed.
	if h.inflight.Add(1) == 1 {
		h.due.Store(int64(due.Sub(epoch)))
	}
	if gated && !s.Nodes[i].id.verified.Load() {
		if err = s.Duplicate(); err == nil {
			err = s.identify(ctx, i)
		}
	}
	var v T
	if err == nil {
		v, err = fn(ctx, n.C)
		if n.noRetries && neverWrote(err) {
			err = neverSent(err)
		}
	}
	h.returned(err, due.Sub(start))
	<-n.sem
	if err == nil {
		return v, nil
	}
	return zero, h.Cause(timedOut(ctx, start, err))
}

// timedOut is err in one wording for a node that did not answer in time,
// whether the client reports the deadline or an i/o timeout: "no reply
// within" the round's node timeout when it was that deadline (the request
// started a moment after the round), else within the request's budget.
func timedOut(ctx context.Context, start time.Time, err error) error {
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) && nodecheck.IsTimeout(err) {
		after := dl.Sub(start)
		if d, ok := quorum.NodeTimeout(ctx); ok {
			after = d
		}
		return &quorum.TimeoutError{After: after}
	}
	return err
}

// Call runs fn on node i through do, with the Set's gates: a lock request
// (lockOp) is refused once two nodes were found to reach one server, and
// waits for the identity check before this Client's first request to the
// node; a node found down gets the probe that brings it back (probeDown).
// Releases and publishes (not lockOp) go out whatever the identity check
// said: a lock granted before it found two names of one server must still
// be released. timeout is the request's budget when ctx has no deadline.
func Call[T any](ctx context.Context, s *Set, i int, lockOp bool, timeout time.Duration, fn func(ctx context.Context, sc redis.Scripter) (T, error)) (T, error) {
	if lockOp {
		if dup := s.Duplicate(); dup != nil {
			var zero T
			return zero, dup
		}
	}
	return do(ctx, s, i, &s.Nodes[i], lockOp, timeout, fn)
}

// call runs fn on node i for a request of t: as Call does, or on t's own
// client of the node (Linked.Token), which waits for the identity check
// whatever the request; for a linked token, not at all once its Client is
// closed.
func call[T any](ctx context.Context, t *Token, i int, lockOp bool, fn func(ctx context.Context, s redis.Scripter) (T, error)) (T, error) {
	var zero T
	if t.closed != nil {
		if err := t.closed(ctx, i); err != nil {
			return zero, err
		}
	}
	if t.via != nil {
		return do(ctx, t.set, i, t.via[i], true, t.timeout, fn)
	}
	if lockOp {
		if dup := t.set.Duplicate(); dup != nil {
			return zero, dup
		}
	}
	return do(ctx, t.set, i, &t.set.Nodes[i], lockOp, t.timeout, fn)
}

// Duplicate returns the error of two nodes found to reach one server, or
// nil.
func (s *Set) Duplicate() error {
	if p := s.ids.dup.Load(); p != nil {
		return *p
	}
	return nil
}

// Set is the nodes of one redlock Client, and what the Client knows of
// them beyond each one's health: that no two are one server (identify,
// below), and each server's clock (clock.go), which bounds every request and sizes
// every release's guard. Call is the one way a request reaches a node of
// the Set.
type Set struct {
	Nodes []Node
	cfg   Config
	ids   idKeys // this Client's identity keys, one per node

	relMu     sync.Mutex                 // protects releasing
	releasing map[relKey][]chan struct{} // this Client's releases in flight, per lock key and node (Set.beginRelease, release.go)
}

// Config is what a Set needs of its Client.
type Config struct {
	// Timeout is the Client's node timeout: the bound of its identity
	// checks, probes of a node that is down, and clock probes.
	Timeout time.Duration
	// Drift is the clock drift factor: how much faster or slower one
	// clock may run than another.
	Drift float64
	// KeyPrefix and ID name this Client's identity keys.
	KeyPrefix, ID string
	// Go runs f on a goroutine the Client owns (its Close waits for it);
	// once Close has begun it does not run f and returns the Client's
	// ErrClosed.
	Go func(f func()) error
	// Closing is closed when the Client's Close begins: background loops
	// (the probe of a node that is down) end then.
	Closing <-chan struct{}
	// Invalid returns the Client's error for bad input (its
	// ErrInvalidArgument, with the message): two nodes that reach one
	// server.
	Invalid func(format string, args ...any) error
}

// NewSet returns the Set of clients (no I/O).
func NewSet(clients []redis.UniversalClient, cfg Config) *Set {
	s := &Set{Nodes: make([]Node, len(clients)), cfg: cfg}
	for i, c := range clients {
		s.Nodes[i] = newNode(c)
		s.Nodes[i].id = newIdentity()
		s.Nodes[i].clock = new(nodeClock)
	}
	return s
}

// probeDown starts the background probe of node i, known down, unless one
// runs: a PING every probeEvery until the node answers or the Client
// closes.
func (s *Set) probeDown(i int) {
	h := s.Nodes[i].Health
	if !h.startProbe() {
		return
	}
	timeout := s.cfg.Timeout
	err := s.cfg.Go(func() {
		defer h.endProbe()
		t := time.NewTicker(probeEvery(timeout))
		defer t.Stop()
		for h.Down() != nil {
			select {
			case <-s.cfg.Closing:
				return
			case <-t.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			err := s.Nodes[i].C.Ping(ctx).Err()
			cancel()
			if err == nil {
				h.setUp()
			}
		}
	})
	if err != nil {
		h.endProbe()
	}
}

// A request's life on a node, as do brackets it: refused while the node
// is down or stuck, counted in flight until it returns, and what its error
// proves about whether it was written.

// refuse returns why a request to the node must not be sent now, or nil;
// down is set when the node is down (its last dial failed): the caller
// probes it (see probeEvery).
func (h *health) refuse() (err error, down bool) {
	if d := h.dials; d != nil {
		if p := d.err.Load(); p != nil { // the node's last dial failed
			return &connError{Err: *p, notSent: true}, true
		}
	}
	if in := h.inflight.Load(); in > 0 {
		due := h.due.Load()
		late := time.Duration(monoNow() - due)
		// Once a second one request goes through all the same: a request
		// whose client never times out (ReadTimeout -1) on a link that
		// dropped it would otherwise keep the node stuck for good.
		if late >= h.grace && (late < stuckProbe || !h.due.CompareAndSwap(due, monoNow())) {
			return &stuckError{Late: late, InFlight: in}, false
		}
	}
	return nil, false
}

// stuckProbe is how often a stuck node is sent a request all the same.
const stuckProbe = time.Second

// returned ends a request that do counted in flight; err is its outcome,
// timeout its whole budget (its due − its start): while other requests are
// in flight, the node is late that long after a return.
func (h *health) returned(err error, timeout time.Duration) {
	h.due.Store(monoNow() + int64(timeout))
	h.inflight.Add(-1)
	// The node answered: it is up (a load, no store, as a rule).
	if d := h.dials; d != nil && replied(err) && d.err.Load() != nil {
		d.err.Store(nil)
	}
}

// neverWrote reports whether err, returned by a node client whose retries
// are off (MaxRetries -1), says that the request got no connection, so that
// no byte of it was written: a dial refused or timed out, a name that did
// not resolve, the pool timed out, exhausted or closed. With retries on
// (go-redis's default), a dial error may follow a first try that wrote the
// request and lost its connection, so it proves nothing (issue 30 item 6).
// An error marked by mayHaveLanded (pipeline) proves nothing either.
func neverWrote(err error) bool {
	if err == nil || errors.Is(err, errMayHaveLanded) {
		return false
	}
	var oe *net.OpError
	var de *net.DNSError
	switch {
	case errors.Is(err, redis.ErrPoolTimeout), errors.Is(err, redis.ErrPoolExhausted), errors.Is(err, redis.ErrClosed):
		return true
	case errors.As(err, &de):
		return true
	case errors.As(err, &oe):
		return oe.Op == "dial"
	}
	return false
}

// up clears the last dial's error: a dial succeeded (returned does the
// same for a request that got a reply). It is apart from set, whose err
// escapes, so that clearing allocates nothing.
func (d *dialState) up() {
	if d.err.Load() != nil { // most calls: a load, no store
		d.err.Store(nil)
	}
}

// down returns the error of the node's last dial, or nil.
func (d *dialState) down() error {
	if d == nil {
		return nil
	}
	if p := d.err.Load(); p != nil {
		return *p
	}
	return nil
}

// epoch is the origin of the monotonic times kept in atomics.
var epoch = time.Now()

func monoNow() int64 { return int64(time.Since(epoch)) }

// unsent reports whether a request provably never left the client, so
// that nothing of it can land on the node later: the node layer kept it
// back (the in-flight cap was full; the node is down or stuck), or go-redis
// got it no connection on its only try (see neverWrote, and do). Every
// other failure — a timeout, a broken connection, a dial error after
// go-redis retried a request it may have written — "may have landed".
func unsent(err error) bool { return err != nil && errors.Is(err, errNotSent) }

// Answered reports whether a request that ended with err can no longer
// change anything on the node: the node replied (a result, an error reply,
// or scripts.ErrLate: it ran past its not-after bound and changed nothing),
// or the request provably never left the client (unsent). A timeout or a
// broken connection leaves it unknown whether (and when) the request
// reaches the node.
func Answered(err error) bool { return replied(err) || unsent(err) }

// replied reports whether a request that ended with err got the node's
// reply: a result, an error reply, or scripts.ErrLate.
func replied(err error) bool {
	if err == nil {
		return true // before the errors.As target, which escapes
	}
	var re redis.Error
	return errors.As(err, &re) || errors.Is(err, scripts.ErrLate)
}
