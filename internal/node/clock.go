package node

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/nodecheck"
	"github.com/quorumlock/quorumlock/internal/scripts"
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

// read is what the estimate says of the node's clock at local instant t:
// mid, the reading it predicts (the error aside), in µs, and err, its
// error then: its own, plus the drift factor times the time since it was
// made (the two clocks' rates differ by at most drift).
func (e *clockEstimate) read(t time.Time, drift float64) (mid int64, err time.Duration) {
	d := t.Sub(e.at)
	return e.nodeUS + d.Microseconds(), e.err + time.Duration(drift*float64(d.Abs()))
}

// upper is the latest the node's clock can read at local instant t, in µs.
func (e *clockEstimate) upper(t time.Time, drift float64) int64 {
	mid, err := e.read(t, drift)
	return mid + err.Microseconds() + 1
}

// lower is the earliest the node's clock can read at local instant t.
func (e *clockEstimate) lower(t time.Time, drift float64) int64 {
	mid, err := e.read(t, drift)
	return mid - err.Microseconds() - 1
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
func (s *Set) notAfter(ctx context.Context, i int, key string) (int64, error) {
	for {
		mc, probe, err := s.clockFor(ctx, i, key)
		if err != nil {
			return 0, err
		}
		e := mc.est.Load()
		if e == nil || time.Since(e.at) > clockRefresh {
			if e, err = s.freshen(ctx, mc, probe, e); err != nil {
				return 0, err
			}
		}
		dl, ok := ctx.Deadline()
		if !ok {
			s.Nodes[i].clock.unbounded.Store(true)
			return 0, nil
		}
		b := max((e.upper(dl, s.cfg.Drift)+999)/1000, 0) // in whole ms, rounded up
		for {
			old := mc.maxBound.Load()
			if b <= old || mc.maxBound.CompareAndSwap(old, b) {
				break
			}
		}
		// A Cluster master's clock dropped meanwhile (nodeClock.master)
		// may have lost b before a guard saw it: take the master's clock
		// afresh. One not dropped keeps b until its clock has passed it.
		if mc.dropped.Load() {
			continue
		}
		if testhooks.SkipNotAfter.Load() {
			return 0, nil
		}
		return b, nil
	}
}

// freshen returns the estimate of mc's clock to use now, given e, the one
// known (nil: none yet): with none, it learns the first one (learnClock);
// with one older than clockRefresh, it starts a probe in the background
// unless one runs, and returns e meanwhile.
func (s *Set) freshen(ctx context.Context, mc *masterClock, probe clockProbe, e *clockEstimate) (*clockEstimate, error) {
	if e == nil {
		return s.learnClock(ctx, mc, probe)
	}
	if mc.probing.CompareAndSwap(false, true) {
		if s.cfg.Go(func() {
			defer mc.probing.Store(false)
			_ = s.probeClock(mc, probe)
		}) != nil {
			mc.probing.Store(false)
		}
	}
	return e, nil
}

// learnClock waits for the first estimate of mc's clock, starting the
// probe that learns it unless one runs, at most until ctx ends.
func (s *Set) learnClock(ctx context.Context, mc *masterClock, probe clockProbe) (*clockEstimate, error) {
	mc.mu.Lock()
	if e := mc.est.Load(); e != nil {
		mc.mu.Unlock()
		return e, nil
	}
	ch := mc.first
	if ch == nil {
		ch = make(chan struct{})
		mc.first = ch
		err := s.cfg.Go(func() {
			err := s.probeClock(mc, probe)
			mc.mu.Lock()
			mc.first, mc.lastErr = nil, err
			mc.mu.Unlock()
			close(ch)
			if err == nil {
				// The first round trip likely included the dial: one
				// more on the pooled connection tightens the error.
				_ = s.probeClock(mc, probe)
			}
		})
		if err != nil {
			mc.first = nil
			mc.mu.Unlock()
			return nil, err
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
	if nodecheck.AuthRefused(err) {
		// TIME is the first request on a new connection, and the
		// connection's handshake (HELLO/AUTH) is what failed.
		return nil, fmt.Errorf("authentication refused by the node (check the client's username and password): %w", err)
	}
	return nil, fmt.Errorf("learning the node's clock (TIME): %w", err)
}

// probeClock reads mc's clock with probe, at most for probeTimeout, and
// keeps the estimate when it is better than the one known at that moment
// (or disagrees with it: the clock was set).
//
// The server read its clock at some local instant in [send, recv], at most
// half the round trip from their middle; over that half its clock ran at
// most drift faster or slower than ours. So at the middle it read within
// half·(1+drift) of what it answered, plus a µs for TIME's resolution.
func (s *Set) probeClock(mc *masterClock, probe clockProbe) error {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Timeout)
	defer cancel()
	send := time.Now()
	t, err := probe.read(ctx)
	recv := time.Now()
	if err != nil {
		return err
	}
	half := recv.Sub(send) / 2
	errUS := half + time.Duration(s.cfg.Drift*float64(half)) + time.Microsecond
	e := &clockEstimate{at: send.Add(half), nodeUS: t.UnixMicro(), err: errUS}
	for {
		old := mc.est.Load()
		if old != nil {
			oldMid, oldErr := old.read(e.at, s.cfg.Drift)
			agree := abs64(oldMid-e.nodeUS) <= (oldErr+e.err).Microseconds()+2
			if e.err > oldErr && agree {
				return nil // the known estimate is as good: keep it
			}
		}
		if mc.est.CompareAndSwap(old, e) {
			return nil
		}
	}
}

// clockFor returns the clock estimate that a request for key on node i is
// bounded with, and the probe that reads that clock.
//
// On a Cluster node it is the clock of key's master, as go-redis's slot
// map names it (MasterForKey: the map the request itself is routed by; it
// reads the map once when none is loaded yet, within ctx). Estimates are
// kept per master address, not per slot or per key: a master's clock is
// one clock whichever slot is asked, so the memory is one small entry per
// master whatever the number of resources (100,000 resources on a
// 3-master cluster: 3 entries), and one probe a second per master in use,
// not per slot. An entry is dropped once the map holds maxMasterClocks and
// the master is idle (every bound sent there has passed on its clock), so
// masters that left the cluster are not kept forever.
//
// The probe goes to that master's own client (not through the Cluster
// client, which follows MOVED to another master): it answers only if that
// master serves key's slot, so an estimate is always of the server its
// address names. A request that go-redis redirects (a slot moved, a
// failover) can still run on another master than the one its bound was
// computed for; that window lasts until go-redis has read the new map,
// which a MOVED probe reply asks it to do.
func (s *Set) clockFor(ctx context.Context, i int, key string) (*masterClock, clockProbe, error) {
	nc := s.Nodes[i].clock
	cc, ok := s.Nodes[i].C.(*redis.ClusterClient)
	if !ok {
		return &nc.masterClock, clockProbe{n: s.Nodes[i].C}, nil
	}
	m, err := cc.MasterForKey(ctx, key)
	if err != nil {
		return nil, clockProbe{}, fmt.Errorf("finding the key's master for its clock: %w", err)
	}
	return nc.master(m.Options().Addr, time.Now(), s.cfg.Drift), clockProbe{cc: cc, m: m, key: key}, nil
}

// master returns the clock of the Cluster master at addr, adding it if
// new. When the map is full (maxMasterClocks), adding drops every idle
// master first: the map holds the masters in use, and those whose bounds
// have not all passed yet, whatever the number of keys.
func (nc *nodeClock) master(addr string, now time.Time, drift float64) *masterClock {
	nc.mastersMu.RLock()
	mc := nc.masters[addr]
	nc.mastersMu.RUnlock()
	if mc != nil {
		return mc
	}
	nc.mastersMu.Lock()
	defer nc.mastersMu.Unlock()
	if mc := nc.masters[addr]; mc != nil {
		return mc
	}
	if len(nc.masters) >= maxMasterClocks {
		for a, o := range nc.masters {
			if o.idle(now, drift) {
				o.dropped.Store(true)
				delete(nc.masters, a)
			}
		}
	}
	if nc.masters == nil {
		nc.masters = make(map[string]*masterClock)
	}
	mc = new(masterClock)
	nc.masters[addr] = mc
	return mc
}

// read reads the clock. On a Cluster master it runs the keyed script
// (scripts.Time), which the minimal ACL allows (EVAL, TIME inside it, the
// key under the prefix). A MOVED or ASK reply means the slot is no longer
// (or not only) m's: the probe fails, and go-redis is asked to reload its
// slot map.
func (p clockProbe) read(ctx context.Context) (time.Time, error) {
	switch {
	case p.fake != nil:
		return p.fake(ctx)
	case p.n != nil:
		return p.n.Time(ctx).Result()
	}
	t, err := scripts.Time(ctx, p.m, p.key)
	if err != nil {
		if redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK") {
			p.cc.ReloadState(ctx)
		}
		return time.Time{}, fmt.Errorf("master %s: %w", p.m.Options().Addr, err)
	}
	return t, nil
}

// untilPassed returns how long until plain node i's clock has surely
// passed b (its ms): 0 if it has, the node timeout if its clock is not
// known (the bound of a request is at most a node timeout ahead).
func (s *Set) untilPassed(i int, b int64) time.Duration {
	e := s.Nodes[i].clock.est.Load()
	if e == nil {
		return s.cfg.Timeout
	}
	d := time.Duration(b*1000-e.lower(time.Now(), s.cfg.Drift)+1000) * time.Microsecond
	return max(d, 0)
}

func abs64(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}
