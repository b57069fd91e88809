package node

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/scripts"
	"github.com/quorumlock/quorumlock/internal/testhooks"
)

// What a Client knows of its servers' clocks (clock.go says how requests
// use it), and how long a release's guard must stay for the bounds it sent
// (guardLifetime).

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

// guardLifetime is how long a release's guard must stay on the nodes
// (DESIGN step 4), for a lock with these keys (one per node), TTL and node
// timeout: until the clock of the server holding the key on each node (the
// key's master on a Cluster node) has surely passed the bound of every
// request of ours that can still land there. For each node that is the
// latest bound sent to that server (or that a request of the lock, sent
// before now but not yet recorded, can carry: its deadline is at most a
// node timeout from now) less the earliest its clock can read now, plus a
// margin. A server whose clock is not known yet gets twice the node
// timeout and the probe's (a request waiting for the first probe gets an
// estimate whose error is at most half the probe's timeout). A node that
// was ever sent a request without a bound keeps the guard of before, twice
// the TTL.
func (s *Set) guardLifetime(keys []scripts.Keys, ttl, timeout time.Duration) time.Duration {
	const margin = 2 * time.Millisecond
	now := time.Now()
	drift := s.cfg.Drift
	unknown := 2*(timeout+s.cfg.Timeout) + margin
	g := time.Millisecond
	for i := range s.Nodes {
		nc := s.Nodes[i].clock
		if nc.unbounded.Load() {
			return max(g, 2*ttl)
		}
		for _, mc := range s.guardClocks(i, keys) {
			e := mc.est.Load()
			if e == nil {
				g = max(g, unknown)
				continue
			}
			// A request sent meanwhile uses this estimate or a better one
			// (probeClock keeps the better): its bound is at most the upper
			// bound of the clock at its deadline plus twice that error.
			dl := now.Add(timeout)
			_, errDL := e.read(dl, drift)
			pending := e.upper(dl, drift) + 2*errDL.Microseconds()
			latest := max(mc.maxBound.Load()*1000, pending)
			need := time.Duration(latest-e.lower(now, drift))*time.Microsecond + margin
			g = max(g, need)
		}
	}
	return (g + time.Millisecond - 1).Truncate(time.Millisecond)
}

// guardClocks returns the clocks that bound a guard on node i for keys:
// the node's own on a plain node; on a Cluster node, the key's master's.
// It never waits on the network for long (guardLookup): where the master
// is not known at once it returns every master's clock the node has, and
// an unknown one (none learned: the guard of an unknown clock), so the
// guard is at least what the key's master needs.
func (s *Set) guardClocks(i int, keys []scripts.Keys) []*masterClock {
	nc := s.Nodes[i].clock
	cc, ok := s.Nodes[i].C.(*redis.ClusterClient)
	if !ok {
		return []*masterClock{&nc.masterClock}
	}
	if i < len(keys) {
		ctx, cancel := context.WithTimeout(context.Background(), guardLookup)
		m, err := cc.MasterForKey(ctx, keys[i].Lock)
		cancel()
		if err == nil {
			nc.mastersMu.Lock()
			mc := nc.masters[m.Options().Addr]
			nc.mastersMu.Unlock()
			if mc == nil {
				// No request of ours was bounded on that master (or all
				// its bounds passed and it was dropped): one that is
				// waiting for its first probe is covered as unknown.
				mc = new(masterClock)
			}
			return []*masterClock{mc}
		}
	}
	nc.mastersMu.Lock()
	defer nc.mastersMu.Unlock()
	out := []*masterClock{new(masterClock)}
	for _, mc := range nc.masters {
		out = append(out, mc)
	}
	return out
}

// guardLookup bounds guardClocks' look-up of a key's master: go-redis's
// slot map is in memory once any request went to the node, so this only
// matters when it cannot be read at all.
const guardLookup = 50 * time.Millisecond

// waitSent waits until the request of every round registered so far has
// ended on every node, or the latest of those rounds has passed its
// deadline (its start plus timeout): a request still running then can
// land only by the guard's time, which WaitOut waits for.
func (g *Token) waitSent(timeout time.Duration) {
	g.mu.Lock()
	if !g.anyOpenLocked() {
		g.mu.Unlock()
		return
	}
	if g.idle == nil {
		g.idle = make(chan struct{})
	}
	idle, deadline := g.idle, g.last.Add(timeout)
	g.mu.Unlock()
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-idle:
	case <-t.C:
	}
}

// WaitOut waits until no request of the token can land on any node any
// more: every registered round's requests have ended, or the latest round
// has passed its deadline, and, where a request went unanswered, for as
// long as the release's guard would stay (guard), by which time the
// node's clock has passed its not-after bound. A handover (Detach) calls it: the lock's
// next owner knows nothing of our requests, so they must be over before it
// is handed on. It takes at most about twice the node timeout plus the
// clock estimates' error; nothing when every request was answered.
func (g *Token) WaitOut() {
	if testhooks.DetachSkipsWait.Load() {
		return // a negative control: Detach before issue 30
	}
	g.waitSent(g.timeout)
	var d time.Duration
	for i := range g.n {
		d = max(d, g.guard(i))
	}
	if d > 0 {
		time.Sleep(d)
	}
}
