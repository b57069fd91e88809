package redlock

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/node"
	"github.com/quorumlock/quorumlock/quorum"
)

// This file holds what a Client checks of its nodes beyond their health
// (the node layer, internal/node): that each is not one of the others under
// another name (identify), the probe of a node that is down, and the
// errors no retry can change.

// identity is what a Client knows of one node's identity.
type identity struct {
	verified atomic.Bool   // identify found the node distinct from the others
	idSent   atomic.Bool   // identify sent its script: the node may hold our identity key
	idTurn   chan struct{} // buffered 1: one identify at a time on the node
	idReady  chan struct{} // closed once verified: wakes every call waiting for the turn
}

func newIdentity() *identity {
	return &identity{idTurn: make(chan struct{}, 1), idReady: make(chan struct{})}
}

// probe starts the background probe of node i, known down, unless one runs:
// a PING every probeEvery until the node answers or the Client closes.
func (c *Client) probe(i int) {
	h := c.nodes[i].Health
	if !h.StartProbe() {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	timeout := c.cfg.timeout()
	c.wg.Go(func() {
		defer h.EndProbe()
		t := time.NewTicker(node.ProbeEvery(timeout))
		defer t.Stop()
		for h.Down() != nil {
			select {
			case <-c.closing:
				return
			case <-t.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			err := c.nodes[i].C.Ping(ctx).Err()
			cancel()
			if err == nil {
				h.SetUp()
			}
		}
	})
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
	if n.Cluster || len(c.nodes) == 1 {
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
	if dup := c.duplicate(); dup != nil {
		return dup
	}
	if n.id.verified.Load() {
		return nil
	}
	keys := c.idKeys()
	n.id.idSent.Store(true) // the key may be there from now on, even if the reply is lost
	j, err := n.C.Eval(ctx, identifyScript, keys, i+1, identifyTTL.Milliseconds()).Int()
	if err != nil {
		return err
	}
	if j > 0 {
		dup := invalid("nodes[%d] (%s) and nodes[%d] (%s) reach one server: one server counted twice is not a majority",
			j-1, c.nodes[j-1].Addr, i, n.Addr)
		c.dup.CompareAndSwap(nil, &dup)
		return *c.dup.Load()
	}
	n.id.verify()
	return nil
}

// verify records that the node is distinct from the others.
func (st *identity) verify() {
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
		if n.Cluster || !n.id.idSent.Load() || n.Health.Down() != nil {
			continue
		}
		key := c.idKeys()[i]
		c.wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			_ = n.C.Del(ctx, key).Err()
		})
	}
}
