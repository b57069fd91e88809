package redlock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/scripts"
	"github.com/quorumlock/quorumlock/quorum"
)

// This file holds what a Client knows of each node's health, so that a
// call is answered by what the node is doing, not by the go-redis options
// its client was built with (issue 21):
//
//   - a node whose last dial failed (refused, unresolvable) is down: its
//     requests fail at once with the dialer's error, Kind "connection",
//     while one probe per node and Client checks it in the background;
//   - a node with requests in flight and no reply for longer than a
//     request's timeout is stuck (paused, or a link that drops packets): its
//     requests fail at once instead of queuing in its sockets behind the
//     earlier ones, which a client built without ContextTimeoutEnabled keeps
//     waiting until its read timeout (3s by default) — DESIGN step 2;
//   - a node is used for a lock only once this Client knows it is not one
//     of the other nodes under another name (see identify).
//
// Failing a request early is always safe for the algorithm: a node that
// fails grants nothing, and a request that was never sent cannot land.

// epoch is the origin of the monotonic times kept in atomics.
var epoch = time.Now()

func monoNow() int64 { return int64(time.Since(epoch)) }

// nodeState is one node's health as seen by one Client.
type nodeState struct {
	inflight atomic.Int32 // requests sent and not returned
	// due is when the node is late (monoNow time): the deadline of the
	// request that found none in flight, pushed to a node timeout after
	// each return while others are in flight.
	due      atomic.Int64
	probing  atomic.Bool   // a probe of a down node is running
	verified atomic.Bool   // identify found the node distinct from the others
	idSent   atomic.Bool   // identify sent its script: the node may hold our identity key
	idTurn   chan struct{} // buffered 1: one identify at a time on the node
	idReady  chan struct{} // closed once verified: wakes every call waiting for the turn
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
		case ctx.Err() == nil && !isTimeout(err):
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

// up clears the last dial's error: a dial or a request succeeded. It is
// apart from set, whose err escapes, so that the hot path allocates nothing.
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

// connError is the error of a node that could not be reached: its dial
// failed (refused, unresolvable, unreachable); err is the dialer's error.
// Its Kind is "connection".
type connError struct {
	err     error
	notSent bool // the request was not sent: the node was known down
}

func (e *connError) Error() string {
	if e.notSent {
		return "not sent: the node is down (last dial: " + e.err.Error() + ")"
	}
	return e.err.Error()
}

func (e *connError) Unwrap() []error {
	if e.notSent {
		return []error{errNotSent, e.err}
	}
	return []error{e.err}
}

// errNotSent marks the error of a request that never left the client: it
// cannot land on the node later.
var errNotSent = errors.New("not sent")

// stuckError is the error of a request not sent because a request to the
// node is in flight past its deadline, with no reply since. It matches
// context.DeadlineExceeded (Kind "timeout").
type stuckError struct {
	late     time.Duration
	inflight int32
}

func (e *stuckError) Error() string {
	return fmt.Sprintf("not sent: the node is not answering (%d requests in flight, the oldest past its deadline by %v)",
		e.inflight, e.late.Round(time.Millisecond))
}

func (e *stuckError) Unwrap() []error { return []error{errNotSent, context.DeadlineExceeded} }

// notSent reports whether err is that of a request that never left the
// client, so that nothing of it can land on the node.
func notSent(err error) bool { return errors.Is(err, errNotSent) }

// refuse returns why a request to node i must not be sent now, or nil.
func (c *Client) refuse(i int) error {
	st := c.nodes[i].state
	if err := st.dials.down(); err != nil {
		c.probe(i)
		return &connError{err: err, notSent: true}
	}
	if in := st.inflight.Load(); in > 0 {
		due := st.due.Load()
		late := time.Duration(monoNow() - due)
		// Once a second one request goes through all the same: a request
		// whose client never times out (ReadTimeout -1) on a link that
		// dropped it would otherwise keep the node stuck for good.
		if late >= st.grace && (late < stuckProbe || !st.due.CompareAndSwap(due, monoNow())) {
			return &stuckError{late: late, inflight: in}
		}
	}
	return nil
}

// stuckProbe is how often a stuck node is sent a request all the same.
const stuckProbe = time.Second

// lateGrace is the grace of a node client that honours ctx deadlines.
const lateGrace = 250 * time.Millisecond

// newNodeState returns the state of node n.
func newNodeState(n redis.UniversalClient) *nodeState {
	st := &nodeState{dials: dialsOf(n), idTurn: make(chan struct{}, 1), idReady: make(chan struct{})}
	switch c := n.(type) {
	case *redis.Client:
		if c.Options().ContextTimeoutEnabled {
			st.grace = lateGrace
		}
	case *redis.ClusterClient:
		if c.Options().ContextTimeoutEnabled {
			st.grace = lateGrace
		}
	}
	return st
}

// sent and returned bracket a request in flight on a node; due is the
// request's deadline, timeout its whole budget (due − its start): while
// other requests are in flight, the node is late that long after a return.
func (st *nodeState) sent(due time.Time) {
	if st.inflight.Add(1) == 1 {
		st.due.Store(int64(due.Sub(epoch)))
	}
}

func (st *nodeState) returned(err error, timeout time.Duration) {
	st.due.Store(monoNow() + int64(timeout))
	st.inflight.Add(-1)
	if st.dials != nil && replied(err) {
		st.dials.up() // the node answered: it is up
	}
}

// replied reports whether a request that ended with err got the node's
// reply: a result, an error reply, or scripts.ErrLate.
func replied(err error) bool {
	if err == nil {
		return true
	}
	var re redis.Error
	return errors.As(err, &re) || errors.Is(err, scripts.ErrLate)
}

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

// probe starts the background probe of node i, known down, unless one runs:
// a PING every probeEvery until the node answers or the Client closes.
func (c *Client) probe(i int) {
	st := c.nodes[i].state
	if !st.probing.CompareAndSwap(false, true) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	timeout := c.cfg.timeout()
	c.wg.Go(func() {
		defer st.probing.Store(false)
		t := time.NewTicker(probeEvery(timeout))
		defer t.Stop()
		for st.dials.down() != nil {
			select {
			case <-c.closing:
				return
			case <-t.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			err := c.nodes[i].c.Ping(ctx).Err()
			cancel()
			if err == nil {
				st.dials.set(nil)
			}
		}
	})
}

// cause returns the real cause of node i's failure err in a round started
// at start: a node that timed out while its dials failed was down, and
// says so with the dialer's error.
func (c *Client) cause(i int, err error) error {
	if err == nil || !isTimeout(err) || errors.Is(err, errNotSent) {
		return err
	}
	if down := c.nodes[i].state.dials.down(); down != nil {
		return &connError{err: fmt.Errorf("%w (its dials fail; %v)", down, err)}
	}
	return err
}

// permanentPrefixes are the error replies that another attempt cannot
// change: a key of another type, a replica, a missing ACL right, a script
// the node refuses to load, a missing command.
var permanentPrefixes = []string{"WRONGTYPE", "READONLY", "NOPERM", "NOSCRIPT", "NOAUTH", "WRONGPASS", "ERR unknown command"}

// permanentReply reports whether err is a node's error reply that retrying will
// not change.
func permanentReply(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return errors.Is(err, ErrInvalidArgument)
	}
	for _, p := range permanentPrefixes {
		if redis.HasErrorPrefix(re, p) {
			return true
		}
	}
	return false
}

// errPermanent marks an attempt's error that no retry can change: Lock
// returns it at once.
var errPermanent = errors.New("permanent")

// isPermanent reports whether an attempt's error ends Lock's retries.
func isPermanent(err error) bool { return errors.Is(err, errPermanent) }

// permanentError is an attempt's error marked with errPermanent; it reads
// as the error itself.
type permanentError struct{ err error }

func (e *permanentError) Error() string   { return e.err.Error() }
func (e *permanentError) Unwrap() []error { return []error{e.err, errPermanent} }

// permanentFailures counts the nodes of t whose error reply another attempt
// cannot change (permanentReply).
func permanentFailures(t quorum.Tally) int {
	n := 0
	for i, v := range t.Votes {
		if v == quorum.Failed && permanentReply(t.Errs[i]) {
			n++
		}
	}
	return n
}

// identifyTTL is how long a node's identity key lives (see identify).
const identifyTTL = time.Hour

// identifyScript sets this Client's identity key of one node (KEYS[ARGV[1]])
// and returns the 1-based index of another node's key found there, or 0:
// both names reach one server.
// It is sent with EVAL: it runs once per node and Client, and EVALSHA would
// cost a NOSCRIPT round trip first.
const identifyScript = `
local own = tonumber(ARGV[1])
redis.call('SET', KEYS[own], '1', 'PX', ARGV[2])
for k = 1, #KEYS do
  if k ~= own and redis.call('EXISTS', KEYS[k]) == 1 then return k end
end
return 0
`

// identify makes sure node i is not one of the other nodes under another
// name (127.0.0.1 and localhost, say: New compares addresses only). It runs
// before the first request of this Client to the node: the node writes a
// key of this Client's own and looks for the others' (scripts are atomic,
// so of two names of one server, the second to run finds the first's key).
// It needs only what the lock scripts need (EVAL, SET and EXISTS on
// ~<prefix>*), not INFO. Cluster nodes are not checked (their keys live on
// the shard of their slot). When two nodes reach one server every later
// call is refused with ErrInvalidArgument naming both.
func (c *Client) identify(ctx context.Context, i int) error {
	n := &c.nodes[i]
	if n.cluster || len(c.nodes) == 1 {
		n.state.verify()
		return nil
	}
	// One at a time: the many first calls of a busy Client wait for the
	// first one's answer rather than each sending the script, and are all
	// woken at once by it (handing the turn on one by one was a convoy on
	// a busy machine).
	select {
	case n.state.idTurn <- struct{}{}:
		defer func() { <-n.state.idTurn }()
	case <-n.state.idReady:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
	if dup := c.duplicate(); dup != nil {
		return dup
	}
	if n.state.verified.Load() {
		return nil
	}
	keys := c.idKeys()
	n.state.idSent.Store(true) // the key may be there from now on, even if the reply is lost
	j, err := n.c.Eval(ctx, identifyScript, keys, i+1, identifyTTL.Milliseconds()).Int()
	if err != nil {
		return err
	}
	if j > 0 {
		dup := invalid("nodes[%d] (%s) and nodes[%d] (%s) reach one server: one server counted twice is not a majority",
			j-1, c.nodes[j-1].addr, i, n.addr)
		c.dup.CompareAndSwap(nil, &dup)
		return *c.dup.Load()
	}
	n.state.verify()
	return nil
}

// verify records that the node is distinct from the others.
func (st *nodeState) verify() {
	if st.verified.CompareAndSwap(false, true) {
		close(st.idReady)
	}
}

// idKeys are the identity keys of this Client's nodes, one per node.
func (c *Client) idKeys() []string {
	c.idOnce.Do(func() {
		c.idKeyList = make([]string, len(c.nodes))
		for i := range c.nodes {
			c.idKeyList[i] = c.cfg.keyPrefix + "node:" + c.id + ":" + strconv.Itoa(i)
		}
	})
	return c.idKeyList
}

// duplicate returns the error of two nodes found to reach one server, or
// nil.
func (c *Client) duplicate() error {
	if p := c.dup.Load(); p != nil {
		return *p
	}
	return nil
}

// cancelled reports whether t's round was cut short because the caller
// cancelled its ctx (not a deadline) before any node answered or failed by
// itself: then the round says nothing about the nodes.
func cancelled(t quorum.Tally) bool {
	if t.Yes+t.No > 0 || t.Failed == 0 || t.Failed != t.CutShort() {
		return false
	}
	for i, e := range t.Errs {
		if t.Cut[i] && errors.Is(e, context.Canceled) {
			return true
		}
	}
	return false
}

// ctxCancelled is the error of a round the caller cancelled (see
// cancelled): it matches context.Canceled, never ErrNoQuorum, so that a
// caller's own cancellation is not reported as an outage. (A deadline that
// ends a round of silent nodes stays ErrNoQuorum, as the contract says: the
// nodes had that long to answer.)
func ctxCancelled(detail string) error {
	return &classed{msg: "redlock: ctx cancelled before the nodes answered: " + detail, class: []error{context.Canceled}}
}

// forgetIdentity deletes this Client's identity keys (identify) from the
// nodes that may have one (the script was sent, whether or not its reply
// came), for Close: one DEL per node, in parallel, on the Client's
// goroutines (Close waits for them with its bound). Only nodes known down
// (their dials fail) are skipped, and their keys expire with identifyTTL: a
// node that merely looks stuck gets the DEL too, since on a loaded machine
// a late reply is no proof of a pause (an identity key was left for its
// hour at load 6 under -race).
func (c *Client) forgetIdentity(timeout time.Duration) {
	if len(c.nodes) == 1 {
		return
	}
	for i := range c.nodes {
		n := &c.nodes[i]
		if n.cluster || !n.state.idSent.Load() || n.state.dials.down() != nil {
			continue
		}
		key := c.idKeys()[i]
		c.wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			_ = n.c.Del(ctx, key).Err()
		})
	}
}
