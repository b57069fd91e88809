package node

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

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

// verify records that the node is distinct from the others.
func (st *identity) verify() {
	if st.verified.CompareAndSwap(false, true) {
		close(st.idReady)
	}
}

// idKeys are a Set's identity keys, and what identify found.
type idKeys struct {
	once sync.Once
	keys []string
	dup  atomic.Pointer[error] // set once two nodes were found to reach one server
}

// IdentifyTTL is how long a node's identity key lives (see identify).
const IdentifyTTL = time.Hour

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
	if dup := s.Duplicate(); dup != nil {
		return dup
	}
	if n.id.verified.Load() {
		return nil
	}
	keys := s.idKeys()
	n.id.idSent.Store(true) // the key may be there from now on, even if the reply is lost
	j, err := n.C.Eval(ctx, identifyScript, keys, i+1, IdentifyTTL.Milliseconds()).Int()
	if err != nil {
		return err
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
// nodes that may have one (the script was sent, whether or not its reply
// came), for Close: one DEL per node, in parallel, on the Client's
// goroutines (Close waits for them with its bound). Only nodes known down
// (their dials fail) are skipped, and their keys expire with IdentifyTTL:
// a node that merely looks stuck gets the DEL too, since on a loaded
// machine a late reply is no proof of a pause (an identity key was left
// for its hour at load 6 under -race).
func (s *Set) ForgetIdentity(timeout time.Duration, spawn func(func())) {
	if len(s.Nodes) == 1 {
		return
	}
	for i := range s.Nodes {
		n := &s.Nodes[i]
		if n.Cluster || !n.id.idSent.Load() || n.Health.Down() != nil {
			continue
		}
		key := s.idKeys()[i]
		spawn(func() {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			_ = n.C.Del(ctx, key).Err()
		})
	}
}
