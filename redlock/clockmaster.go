package redlock

import (
	"context"
	"fmt"
	"time"

	"github.com/quorumlock/quorumlock/internal/scripts"
	"github.com/redis/go-redis/v9"
)

// Which clock bounds a request, and how long a release's guard must stay
// for it (clock.go has the estimates): on a plain node its server's, on a
// Redis Cluster node its key's master's.

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
func (c *Client) clockFor(ctx context.Context, i int, key string) (*masterClock, clockProbe, error) {
	nc := &c.clocks[i]
	cc, ok := c.nodes[i].C.(*redis.ClusterClient)
	if !ok {
		return &nc.masterClock, clockProbe{n: c.nodes[i].C}, nil
	}
	m, err := cc.MasterForKey(ctx, key)
	if err != nil {
		return nil, clockProbe{}, fmt.Errorf("finding the key's master for its clock: %w", err)
	}
	return nc.master(m.Options().Addr, time.Now(), c.cfg.drift), clockProbe{cc: cc, m: m, key: key}, nil
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
func (c *Client) guardLifetime(keys []scripts.Keys, ttl, timeout time.Duration) time.Duration {
	const margin = 2 * time.Millisecond
	now := time.Now()
	drift := c.cfg.drift
	unknown := 2*(timeout+c.probeTimeout()) + margin
	g := time.Millisecond
	for i := range c.clocks {
		nc := &c.clocks[i]
		if nc.unbounded.Load() {
			return max(g, 2*ttl)
		}
		for _, mc := range c.guardClocks(i, keys) {
			e := mc.est.Load()
			if e == nil {
				g = max(g, unknown)
				continue
			}
			// A request sent meanwhile uses this estimate or a better one
			// (probeClock keeps the better): its bound is at most the upper
			// bound of the clock at its deadline plus twice that error.
			dl := now.Add(timeout)
			pending := e.upper(dl, drift) + 2*e.errAt(dl, drift).Microseconds()
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
func (c *Client) guardClocks(i int, keys []scripts.Keys) []*masterClock {
	nc := &c.clocks[i]
	cc, ok := c.nodes[i].C.(*redis.ClusterClient)
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
