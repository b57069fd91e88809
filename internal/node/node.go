package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/nodeaddr"
	"github.com/quorumlock/quorumlock/internal/scripts"
	"github.com/quorumlock/quorumlock/internal/testhooks"
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
	// (built with MaxRetries -1): only then does a dial error prove that
	// a request was never written (see NeverWrote).
	noRetries bool
	sem       chan struct{} // requests in flight, capped
	// Of a node of a Set (nil otherwise): its identity check and its
	// clock (Set.identify below, clock.go).
	id    *identity
	clock *nodeClock
}

// New returns the node of client c (no I/O).
func New(c redis.UniversalClient) Node {
	_, cluster := c.(*redis.ClusterClient)
	return Node{C: c, Addr: nodeaddr.Of(c), Cluster: cluster, Health: NewHealth(c),
		noRetries: retriesOff(c), sem: make(chan struct{}, MaxInFlight)}
}

// retriesOff reports whether go-redis never retries a request of c: a
// client built with MaxRetries -1. NewClient stores the options it used,
// with -1 turned into 0 and 0 (the default) into 3, so the 0 that
// Options() returns is "no retries" (go-redis v9 options.go init; a
// negative value there is one below -1, which New refuses, see
// DroppedCommands). A Cluster client is never counted so: it retries on
// redirects too.
func retriesOff(c redis.UniversalClient) bool {
	rc, ok := c.(*redis.Client)
	return ok && rc.Options().MaxRetries == 0
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

// Set is the nodes of one redlock Client, and what the Client knows of
// them beyond each one's health: that no two are one server (identify,
// below), and each server's clock (clock.go), which bounds every request and sizes
// every release's guard. Call is the one way a request reaches a node of
// the Set.
type Set struct {
	Nodes []Node
	cfg   Config
	ids   idKeys // this Client's identity keys, one per node
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
		s.Nodes[i] = New(c)
		s.Nodes[i].id = newIdentity()
		s.Nodes[i].clock = new(nodeClock)
	}
	return s
}

// Gate returns what Do needs for node i of the Set, for a request sent on
// a client of its own (package election's NewWithNodes): the identity
// check before this Client's first request there (nil once done), and the
// probe to start when the node is found down.
func (s *Set) Gate(i int) (gate func(context.Context) error, down func()) {
	if !s.Nodes[i].id.verified.Load() {
		gate = func(ctx context.Context) error {
			if dup := s.Duplicate(); dup != nil {
				return dup
			}
			return s.identify(ctx, i)
		}
	}
	return gate, func() { s.Probe(i) }
}

// Probe starts the background probe of node i, known down, unless one
// runs: a PING every ProbeEvery until the node answers or the Client
// closes.
func (s *Set) Probe(i int) {
	h := s.Nodes[i].Health
	if !h.StartProbe() {
		return
	}
	timeout := s.cfg.Timeout
	err := s.cfg.Go(func() {
		defer h.EndProbe()
		t := time.NewTicker(ProbeEvery(timeout))
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
				h.SetUp()
			}
		}
	})
	if err != nil {
		h.EndProbe()
	}
}

// identity is what a Client knows of one node's identity.
type identity struct {
	verified atomic.Bool   // identify found the node distinct from the others
	idSent   atomic.Bool   // identify sent its script: the node may hold our identity key
	idLost   atomic.Int64  // the latest not-after bound (node ms) of a script whose reply did not come; 0: none
	idTurn   chan struct{} // buffered 1: one identify at a time on the node
	idReady  chan struct{} // closed once verified: wakes every call waiting for the turn
}

func newIdentity() *identity {
	return &identity{idTurn: make(chan struct{}, 1), idReady: make(chan struct{})}
}

// verify records that the node is distinct from the others.
func (st *identity) verify() {
	if st.verified.CompareAndSwap(false, true) {
		close(st.idReady)
	}
}

// waitTurn waits until no identify runs on the node (taking the turn and
// giving it back), the node is verified (identify sends nothing more), or
// ctx ends.
func (st *identity) waitTurn(ctx context.Context) {
	select {
	case st.idTurn <- struct{}{}:
		<-st.idTurn
	case <-st.idReady:
	case <-ctx.Done():
	}
}

// idKeys are a Set's identity keys, and what identify found.
type idKeys struct {
	once sync.Once
	keys []string
	dup  atomic.Pointer[error] // set once two nodes were found to reach one server
}

// errClosing is identify's answer once the Client's Close has begun.
var errClosing = errors.New("the Client is closing: no identity check starts")

// reachable reports whether a TCP connection to addr opens before ctx
// ends: a node that refuses it is down, and ForgetIdentity stops there,
// where a DEL that failed on a node that accepts connections may have met
// go-redis's record of its failed dials, and is sent again.
func reachable(ctx context.Context, addr string) bool {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}

// forgetRetry is the pause between ForgetIdentity's DELs to a node that
// did not answer.
const forgetRetry = 20 * time.Millisecond

// IdentifyTTL is how long a node's identity key lives (see identify).
const IdentifyTTL = time.Hour

// identifyScript sets this Client's identity key of one node (KEYS[ARGV[1]])
// and returns the 1-based index of another node's key found there, or 0:
// both names reach one server. Past its not-after bound (ARGV[3], the
// node's TIME in ms, as the lock scripts: DESIGN step 4) it writes nothing
// and returns -1: a script whose caller stopped waiting lands after
// Close's DEL harmlessly, where it once left the key for IdentifyTTL.
// It is sent with EVAL: it runs once per node and Client, and EVALSHA would
// cost a NOSCRIPT round trip first.
const identifyScript = `
if tonumber(ARGV[3]) > 0 then
  local t = redis.call('TIME')
  if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) > tonumber(ARGV[3]) then
    return -1
  end
end
local own = tonumber(ARGV[1])
redis.call('SET', KEYS[own], '1', 'PX', ARGV[2])
for k = 1, #KEYS do
  if k ~= own and redis.call('EXISTS', KEYS[k]) == 1 then return k end
end
return 0
`

// identify makes sure node i is not one of the other nodes under another
// name (127.0.0.1 and localhost, say: New compares addresses only). It runs
// before the first lock request of this Client to the node: the node
// writes a key of this Client's own and looks for the others' (scripts are
// atomic, so of two names of one server, the second to run finds the
// first's key). It needs only what the lock scripts need (EVAL, SET and
// EXISTS on ~<prefix>*), not INFO. Cluster nodes are not checked (their
// keys live on the shard of their slot). When two nodes reach one server
// every later lock request is refused with the Config's Invalid error
// naming both.
func (s *Set) identify(ctx context.Context, i int) error {
	n := &s.Nodes[i]
	if n.Cluster || len(s.Nodes) == 1 {
		n.id.verify()
		return nil
	}
	// One at a time: the many first calls of a busy Client wait for the
	// first one's answer rather than each sending the script, and are all
	// woken at once by it (handing the turn on one by one was a convoy on
	// a busy machine).
	select {
	case n.id.idTurn <- struct{}{}:
		defer func() { <-n.id.idTurn }()
	case <-n.id.idReady:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-s.cfg.Closing:
		// Close has begun: its ForgetIdentity takes the turn after us and
		// reads idSent then, so nothing is written that it could miss.
		return errClosing
	default:
	}
	if dup := s.Duplicate(); dup != nil {
		return dup
	}
	if n.id.verified.Load() {
		return nil
	}
	keys := s.idKeys()
	if _, ok := ctx.Deadline(); !ok { // bounded always: an unbounded request would lengthen every guard
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.cfg.Timeout)
		defer cancel()
	}
	b, err := s.NotAfter(ctx, i, keys[i])
	if err != nil {
		return err
	}
	n.id.idSent.Store(true) // the key may be there from now on, even if the reply is lost
	j, err := n.C.Eval(ctx, identifyScript, keys, i+1, IdentifyTTL.Milliseconds(), b).Int()
	if err != nil {
		// It may still land, until b: ForgetIdentity deletes after that.
		// (Stored before the turn is given back, which it waits for.)
		n.id.idLost.Store(max(n.id.idLost.Load(), b))
		return err
	}
	if j < 0 {
		return fmt.Errorf("identity check of nodes[%d] (%s): %w", i, n.Addr, scripts.ErrLate)
	}
	if j > 0 {
		dup := s.cfg.Invalid("nodes[%d] (%s) and nodes[%d] (%s) reach one server: one server counted twice is not a majority",
			j-1, s.Nodes[j-1].Addr, i, n.Addr)
		s.ids.dup.CompareAndSwap(nil, &dup)
		return *s.ids.dup.Load()
	}
	n.id.verify()
	return nil
}

// idKeys are the identity keys of this Client's nodes, one per node.
func (s *Set) idKeys() []string {
	s.ids.once.Do(func() {
		s.ids.keys = make([]string, len(s.Nodes))
		for i := range s.Nodes {
			s.ids.keys[i] = s.cfg.KeyPrefix + "node:" + s.cfg.ID + ":" + strconv.Itoa(i)
		}
	})
	return s.ids.keys
}

// Duplicate returns the error of two nodes found to reach one server, or
// nil.
func (s *Set) Duplicate() error {
	if p := s.ids.dup.Load(); p != nil {
		return *p
	}
	return nil
}

// ForgetIdentity deletes this Client's identity keys (identify) from the
// nodes that may have one, for Close, which calls it after Config.Closing
// is closed: per node, on the Client's goroutines (Close waits for them
// with its bound), it waits for an identify in progress there to end (it
// holds the node's turn; one that takes the turn later finds Closing
// closed and writes nothing), then sends one DEL if the script was sent,
// whether or not its reply came (if not, once the script's bound has
// surely passed on the node's clock). Before, a Lock call's straggler that had
// not yet sent its identify when Close looked was skipped, and wrote its
// key after (kept for IdentifyTTL: TestClient_Close beside stress-ng).
// No node is skipped: a node whose last dial failed may be back already
// (its flag lasts until its next probe, up to a second), and skipping it
// left the key for IdentifyTTL, an hour (issue 44 item 6: 4 of 4 with
// Close 10ms after the node came back); nor is a node that merely looks
// stuck, since on a loaded machine a late reply is no proof of a pause
// (an identity key was left for its hour at load 6 under -race). A DEL
// that got no answer is sent again until one bound, timeout, which covers
// the wait and the DELs, as long as the node accepts TCP connections:
// go-redis may answer the first DEL from its pool's record of failed
// dials without dialing. A node whose last dial failed gets one node
// timeout at most, and one that refuses connections gets no second DEL:
// a node that stays down costs Close one failed DEL (and only if this
// Client sent it the script).
func (s *Set) ForgetIdentity(timeout time.Duration, spawn func(func())) {
	if len(s.Nodes) == 1 || testhooks.CloseKeepsIdentity.Load() {
		return
	}
	for i := range s.Nodes {
		n := &s.Nodes[i]
		if n.Cluster {
			continue
		}
		key := s.idKeys()[i]
		bound := timeout
		if n.Health.Down() != nil {
			bound = min(timeout, s.cfg.Timeout) // it may be back: one node timeout to find out
		}
		spawn(func() {
			ctx, cancel := context.WithTimeout(context.Background(), bound)
			defer cancel()
			n.id.waitTurn(ctx) // an identify in progress has ended; none starts after
			if !n.id.idSent.Load() {
				return
			}
			// A script whose reply did not come may still land: it writes
			// nothing once the node's clock passed its bound, so the DEL
			// goes after that (a node timeout at most from its sending).
			if b := n.id.idLost.Load(); b > 0 {
				select {
				case <-time.After(s.untilPassed(i, b)):
				case <-ctx.Done():
					return
				}
			}
			for !Replied(n.C.Del(ctx, key).Err()) {
				if !reachable(ctx, n.Addr) {
					return // down: nothing to delete now (its key expires with IdentifyTTL)
				}
				select {
				case <-time.After(forgetRetry):
				case <-ctx.Done():
					return
				}
			}
		})
	}
}
