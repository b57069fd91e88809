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

	"github.com/quorumlock/quorumlock/internal/scripts"
	"github.com/quorumlock/quorumlock/internal/testhooks"
)

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

// identifyTTL is how long a node's identity key lives (see identify).
const identifyTTL = time.Hour

// identifyScript sets this Client's identity key of one node (KEYS[ARGV[1]])
// and returns the 1-based index of another node's key found there, or 0:
// both names reach one server. Past its not-after bound (ARGV[3], the
// node's TIME in ms, as the lock scripts: DESIGN step 4) it writes nothing
// and returns -1: a script whose caller stopped waiting lands after
// Close's DEL harmlessly, where it once left the key for identifyTTL.
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
	b, err := s.notAfter(ctx, i, keys[i])
	if err != nil {
		return err
	}
	n.id.idSent.Store(true) // the key may be there from now on, even if the reply is lost
	j, err := n.C.Eval(ctx, identifyScript, keys, i+1, identifyTTL.Milliseconds(), b).Int()
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

// ForgetIdentity deletes this Client's identity keys (identify) from the
// nodes that may have one, for Close, which calls it after Config.Closing
// is closed: per node, on the Client's goroutines (Close waits for them
// with its bound), it waits for an identify in progress there to end (it
// holds the node's turn; one that takes the turn later finds Closing
// closed and writes nothing), then sends one DEL if the script was sent,
// whether or not its reply came (if not, once the script's bound has
// surely passed on the node's clock). Before, a Lock call's straggler that had
// not yet sent its identify when Close looked was skipped, and wrote its
// key after (kept for identifyTTL: TestClient_Close beside stress-ng).
// No node is skipped: a node whose last dial failed may be back already
// (its flag lasts until its next probe, up to a second), and skipping it
// left the key for identifyTTL, an hour (issue 44 item 6: 4 of 4 with
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
			for !replied(n.C.Del(ctx, key).Err()) {
				if !reachable(ctx, n.Addr) {
					return // down: nothing to delete now (its key expires with identifyTTL)
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
