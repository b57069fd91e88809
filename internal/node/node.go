package node

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/nodeaddr"
	"github.com/quorumlock/quorumlock/quorum"
)

// MaxInFlight caps the requests one Client has in flight on one node, so
// that a node that hangs cannot pile up goroutines without bound.
const MaxInFlight = 1024

// Node is one Redis master as one Client uses it: its client, its health,
// its in-flight cap, and (in a Set) its identity check and clock.
type Node struct {
	C       redis.UniversalClient
	Addr    string
	Cluster bool // a Redis Cluster client: keys of a lock share a hash tag
	Health  *Health
	// noRetries is set for a node client whose go-redis retries are off
	// (MaxRetries -1): only then does a dial error prove that a request
	// was never written (see NeverWrote).
	noRetries bool
	sem       chan struct{} // requests in flight, capped
	// Of a node of a Set (nil otherwise): its identity check and its
	// clock (identity.go, clock.go).
	id    *identity
	clock *nodeClock
}

// New returns the node of client c (no I/O).
func New(c redis.UniversalClient) Node {
	_, cluster := c.(*redis.ClusterClient)
	return Node{C: c, Addr: nodeaddr.Of(c), Cluster: cluster, Health: NewHealth(c),
		noRetries: retriesOff(c), sem: make(chan struct{}, MaxInFlight)}
}

// retriesOff reports whether go-redis never retries a request of c
// (MaxRetries -1; 0 means its default, 3). A Cluster client is never
// counted so: it retries on redirects too.
func retriesOff(c redis.UniversalClient) bool {
	rc, ok := c.(*redis.Client)
	return ok && rc.Options().MaxRetries < 0
}

// Do runs fn on node n: the one path of every request of the library. A
// request is not sent, and fails at once with an error matching
// ErrNotSent, to a node known down (down is called: the caller probes it)
// or stuck, or when the in-flight cap is full (ErrBusy). gate, when set,
// runs first on the same ctx (the Client's identity check); its error is
// the request's. fn's error is classified here, before anything wraps it:
// only one that proves the request was never written matches ErrNotSent
// (see NeverWrote); a timeout says "no reply within" the round's node
// timeout, and one while the node's dials fail carries the dialer's error
// (see Health.Cause). timeout is the request's budget when ctx has no
// deadline.
func Do[T any](ctx context.Context, n *Node, timeout time.Duration, gate func(context.Context) error, down func(), fn func(ctx context.Context, s redis.Scripter) (T, error)) (T, error) {
	var zero T
	start := time.Now()
	due, ok := ctx.Deadline()
	if !ok {
		due = start.Add(timeout)
	}
	err, isDown := n.Health.Refuse()
	if err != nil {
		if isDown && down != nil {
			down()
		}
		return zero, err
	}
	select {
	case n.sem <- struct{}{}:
	default:
		return zero, ErrBusy
	}
	n.Health.Sent(due)
	if gate != nil {
		err = gate(ctx)
	}
	var v T
	if err == nil {
		v, err = fn(ctx, n.C)
		if n.noRetries && NeverWrote(err) {
			err = neverSent(err)
		}
	}
	n.Health.Returned(err, due.Sub(start))
	<-n.sem
	if err == nil {
		return v, nil
	}
	// One wording for a node that did not answer in time, whether the
	// client reports the deadline or an i/o timeout.
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) && IsTimeout(err) {
		after := dl.Sub(start)
		// The round's node timeout, when it was that deadline (the
		// request started a moment after the round).
		if d, ok := quorum.NodeTimeout(ctx); ok {
			after = d
		}
		err = &quorum.TimeoutError{After: after}
	}
	return zero, n.Health.Cause(err)
}

// Call runs fn on node i through Do, with the Set's gates: a lock request
// (lockOp) is refused once two nodes were found to reach one server, and
// waits for the identity check before this Client's first request to the
// node; a node found down gets the probe that brings it back (Probe).
// Releases and publishes (not lockOp) go out whatever the identity check
// said: a lock granted before it found two names of one server must still
// be released. timeout is the request's budget when ctx has no deadline.
func Call[T any](ctx context.Context, s *Set, i int, lockOp bool, timeout time.Duration, fn func(ctx context.Context, sc redis.Scripter) (T, error)) (T, error) {
	if dup := s.Duplicate(); dup != nil && lockOp {
		var zero T
		return zero, dup
	}
	var gate func(context.Context) error
	if lockOp {
		gate, _ = s.Gate(i)
	}
	return Do(ctx, &s.Nodes[i], timeout, gate, func() { s.Probe(i) }, fn)
}

// InFlight returns how many requests of this Client are in flight on the
// node.
func (n *Node) InFlight() int { return len(n.sem) }
