package chaos

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/quorum"
	"github.com/quorumlock/quorumlock/redlock"
)

// semPermits is K for the semaphore profiles: the smallest K for which
// counting holders per node on a majority is unsafe.
const semPermits = 2

// semName is the semaphore of the semaphore profiles; its permits are
// resources semName + ":permit:<i>".
const semName = "sem"

// permitInfix joins a semaphore's name and a permit's number in the
// resources of its holds (redlock's naming).
const permitInfix = ":permit:"

// semaphoreProfiles are the profiles of redlock.Semaphore, with the
// invariant that no instant has more than K holders of one semaphore
// (Result.PermitOverflows), and its negative control.
func semaphoreProfiles() []Profile {
	return []Profile{
		{
			Name: "semaphore", Safe: true, Share: 0.1, MinTTLs: 6,
			About: "C clients share one K=2 redlock.Semaphore (Acquire, write while valid, Unlock); the minority nemesis pauses, kills and restarts, slows, cuts and resets at most 2 of 5 nodes and pauses holders past their TTL: never more than K holders at once",
			adjust: func(c *Config) {
				c.Fenced = true
				c.Resources = semPermits
			},
			run: func(ctx context.Context, e *env) error {
				return runSemWorkers(ctx, e, func(ctx context.Context, n *nemesis) { n.minority(ctx) })
			},
		},
		{
			Name: "semaphore-split", Safe: true, Share: 0.05, MinTTLs: 4,
			About:  "K+1 clients each acquire a K=2 redlock.Semaphore with a different minority of nodes cut, so that their majorities are those that fool a per-node count (the negative control's scenario): at most K get a permit",
			adjust: func(c *Config) { c.Fenced = true },
			run:    func(ctx context.Context, e *env) error { return runSplit(ctx, e, false) },
		},
		{
			Name: "semaphore-counted", Safe: false, Share: 0.05, MinTTLs: 4,
			About:  "negative: a semaphore that counts holders per node and asks a majority (each node admits K=2), in semaphore-split's scenario: holders on nodes {0,1,2}, {3,4,0}, {1,2,3} each see a majority and no node counts more than 2: K+1 hold",
			adjust: func(c *Config) { c.Fenced = true },
			run:    func(ctx context.Context, e *env) error { return runSplit(ctx, e, true) },
		},
	}
}

// runSemWorkers is runWorkers with the workers on a semaphore: each takes
// a permit, writes to the register under the permit's resource while it is
// valid, and gives it back.
func runSemWorkers(ctx context.Context, e *env, nem func(context.Context, *nemesis)) error {
	e.hist.semaphore(semName, semPermits)
	workers, err := newWorkers(e, e.cfg.Clients)
	if err != nil {
		return err
	}
	sems := make([]*redlock.Semaphore, len(workers))
	for i, w := range workers {
		if sems[i], err = w.cl.Semaphore(semName, semPermits); err != nil {
			closeWorkers(workers)
			return err
		}
	}
	sem := make(map[*worker]*redlock.Semaphore, len(workers))
	for i, w := range workers {
		sem[w] = sems[i]
	}
	return runLoops(ctx, e, workers, nem, func(ctx context.Context, w *worker) {
		for ctx.Err() == nil {
			actx, cancel := context.WithTimeout(ctx, 4*e.cfg.TTL)
			h, err := w.acquire(actx, sem[w])
			cancel()
			if err != nil {
				if unexpected(outcome(err)) {
					e.logf("chaos: client %d: Acquire: %v", w.id, err)
				}
				continue
			}
			w.critical(ctx, h)
			h.unlock()
		}
	})
}

// acquire is lock for a permit of s (Acquire: it waits).
func (w *worker) acquire(ctx context.Context, s *redlock.Semaphore) (*held, error) {
	w.e.waiting.Add(1)
	start := time.Now()
	l, err := s.Acquire(ctx)
	end := time.Now()
	w.e.waiting.Add(-1)
	if err != nil {
		w.e.hist.failedLock(outcome(err))
		return nil, err
	}
	w.e.hist.wait(Wait{Resource: l.Resource(), Start: start, End: end})
	return w.track(l, end), nil
}

// runSplit is the scenario that fools a per-node count, scripted so that
// it happens every time: K+1 clients acquire one after another, client j
// with every node cut but the q nodes jq, jq+1, …, jq+q−1 (mod N), so
// that each gets exactly a majority and no node grants more than K (for
// K=2 this needs 3q ≤ 2N: N = 3, 5, 7 all do). The holds overlap: each
// holds for a TTL/2 once all have tried. With counted, the clients use
// countedSemaphore; else redlock.Semaphore, which must refuse the last.
// Repeated, on a new semaphore each time, for the duration.
func runSplit(ctx context.Context, e *env, counted bool) error {
	ws, err := newWorkers(e, semPermits+1)
	if err != nil {
		return err
	}
	n := e.cfg.Nodes
	q := quorum.Size(n)
	c := e.cluster
	end := time.Now().Add(e.cfg.Duration)
	for it := 0; it == 0 || (time.Now().Before(end) && ctx.Err() == nil); it++ {
		name := "split" + strconv.Itoa(it)
		e.hist.semaphore(name, semPermits)
		var helds []*held
		var raws []*countedHold
		for j, w := range ws {
			cut := splitCut(n, q, j)
			start := time.Now()
			for _, i := range cut {
				c.Cut(i)
			}
			if counted {
				if h, err := acquireCounted(ctx, e, w.id, name, semPermits); err == nil {
					raws = append(raws, h)
				} else {
					e.logf("chaos: %s: client %d: %v", name, w.id, err)
				}
			} else if s, err := w.cl.Semaphore(name, semPermits); err != nil {
				e.logf("chaos: %s: Semaphore: %v", name, err)
			} else if h, err := w.tryAcquire(ctx, s); err == nil {
				h.write(false)
				helds = append(helds, h)
			}
			for _, i := range cut {
				c.Heal(i)
			}
			e.hist.fault(Fault{Kind: KindCut, Nodes: cut, Client: -1, Start: start, End: time.Now()})
		}
		sleepCtx(ctx, e.cfg.TTL/2)
		for _, h := range helds {
			h.unlock()
		}
		for _, h := range raws {
			h.release(e)
		}
	}
	return closeWorkers(ws)
}

// splitCut is the nodes cut while client j acquires in runSplit: all but
// jq … jq+q−1 (mod n).
func splitCut(n, q, j int) []int {
	keep := make([]bool, n)
	for x := range q {
		keep[(j*q+x)%n] = true
	}
	var cut []int
	for i := range n {
		if !keep[i] {
			cut = append(cut, i)
		}
	}
	return cut
}

// tryAcquire is lock for a permit of s, without waiting.
func (w *worker) tryAcquire(ctx context.Context, s *redlock.Semaphore) (*held, error) {
	l, err := s.TryAcquire(ctx)
	now := time.Now()
	if err != nil {
		w.e.hist.failedLock(outcome(err))
		return nil, err
	}
	return w.track(l, now), nil
}

// countedScript admits a token on one node while fewer than K live tokens
// are recorded there: holders in a ZSET scored by their expiry on the
// node's clock. KEYS[1] the set; ARGV token, K, ttl in ms.
var countedScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[1]) or redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end
return 0
`)

// countedHold is a "permit" of the counting semaphore: its token and the
// hold recorded for it.
type countedHold struct {
	key, token string
	id         int
}

// acquireCounted is the unsafe design, for the negative control only:
// admit on every node that counts fewer than k holders, hold if a majority
// admitted. Its hold is recorded under a resource of its own
// (name:permit:<hold>), so that only the K-holders invariant can see it.
func acquireCounted(ctx context.Context, e *env, client int, name string, k int) (*countedHold, error) {
	key := "badsem:" + name
	token := uuid.NewString()
	ttl := e.cfg.TTL
	nodes := e.cluster.Clients()
	defer func() {
		for _, n := range nodes {
			n.Close()
		}
	}()
	start := time.Now()
	granted := make([]bool, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() {
			rctx, cancel := context.WithTimeout(ctx, nodeTimeout(ttl))
			defer cancel()
			v, err := countedScript.Run(rctx, n, []string{key}, token, k, ttl.Milliseconds()).Int()
			granted[i] = err == nil && v == 1
		})
	}
	wg.Wait()
	yes := 0
	for _, g := range granted {
		if g {
			yes++
		}
	}
	now := time.Now()
	if yes < quorum.Size(len(nodes)) {
		return nil, fmt.Errorf("counted semaphore: %d of %d nodes admitted", yes, len(nodes))
	}
	e.hist.mu.Lock()
	defer e.hist.mu.Unlock()
	id := len(e.hist.holds)
	validUntil := quorum.Deadline(start, ttl, 0.01)
	e.hist.holds = append(e.hist.holds, &Hold{ID: id, Client: client, Resource: name + permitInfix + "counted" + strconv.Itoa(id),
		Start: now, ValidAtReturn: now.Before(validUntil), ValidLeft: validUntil.Sub(now), ValidUntil: validUntil})
	return &countedHold{key: key, token: token, id: id}, nil
}

// release ends a counted hold: its end is recorded first, then its token
// removed from every node.
func (h *countedHold) release(e *env) {
	at := time.Now()
	for i := range e.cfg.Nodes {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		e.cluster.Admin(i).ZRem(ctx, h.key, h.token)
		cancel()
	}
	e.hist.mu.Lock()
	defer e.hist.mu.Unlock()
	hd := e.hist.holds[h.id]
	hd.Unlock, hd.Released = at, time.Now()
}

// semaphore records that holds of resources name + ":permit:…" are permits
// of one semaphore of k permits, for the K-holders check.
func (h *History) semaphore(name string, k int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.permits == nil {
		h.permits = make(map[string]int)
	}
	h.permits[name] = k
}

// checkPermits counts, per semaphore, the moments when more than K holds
// of its permits were alive at once: a hold of a permit lasts [Start,
// End], as for a lock.
func (r *Result) checkPermits(s Snapshot, rel func(time.Time) string, example func(string, ...any)) {
	names := make([]string, 0, len(s.Permits))
	for name := range s.Permits {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		k := s.Permits[name]
		type ev struct {
			at   time.Time
			d    int
			hold int
		}
		var evs []ev
		for _, h := range s.Holds {
			if strings.HasPrefix(h.Resource, name+permitInfix) && !h.End().Before(h.Start) {
				evs = append(evs, ev{h.Start, 1, h.ID}, ev{h.End(), -1, h.ID})
			}
		}
		// At one instant, ends before starts: touching holds do not overlap.
		slices.SortFunc(evs, func(a, b ev) int {
			if c := a.at.Compare(b.at); c != 0 {
				return c
			}
			return a.d - b.d
		})
		cur := 0
		for _, e := range evs {
			cur += e.d
			r.MaxPermitHolders = max(r.MaxPermitHolders, cur)
			if e.d > 0 && cur > k {
				r.PermitOverflows++
				example("more than K: semaphore %s (K=%d) has %d holders at %s (hold %d began)", name, k, cur, rel(e.at), e.hold)
			}
		}
	}
}
