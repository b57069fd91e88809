package sim

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/quorumlock/quorumlock/internal/scripts"
	"github.com/quorumlock/quorumlock/redlock"
)

// Faults aimed at issue 30's late requests (items 2 and 5), drawn from a
// generator of their own (drawAimed) so that the plans drawn before stay
// those of their seeds:
//
//   - an Extend in flight across a Detach (Plan.DetachLag): in half the
//     hand-overs of the Detach/Resume workload, the holder's links to one
//     or two nodes are slowed by DetachLag each way while it sends an
//     Extend, and it Detaches at once; the resumer Unlocks within 20ms.
//     Detach must wait out the Extend (it lands within its round), else
//     it lands after the resumer's release and sets the key again;
//   - yields held in the network (Plan.YieldHold): every Client's yields
//     (a release carrying a ticket, redlock/retry.go settle) are held on
//     their way to every node for longer than any guard lives. The
//     library must refuse them by their not-after bound; without it, a
//     held yield queues a token given up again, and a release hands it
//     the key (key-back, counted from the yield's sending).
//
// Neither gives the key-back check an allowance: both are recorded as
// spikes (faultLog: spurious-loss only).

// Faults aimed at the phases that issue 33's mutation run showed no plan
// reached (drawPhases, a generator of their own again):
//
//   - the fence commit dropped (Plan.FenceDrop, fenceEpisode): in one
//     seed of three, a Client's commits to a majority are lost on the
//     way (never answered) instead of delayed, a second before the quiet
//     phase, while it and then the others lock a resource of their own.
//     A delayed commit still lands while its lock is held and raises the
//     counter; a lost one never does, so a lock that counted a
//     minority's commits leaves a majority of counters below its fence,
//     and the next holder, whose links to the minority are slowed
//     meanwhile, reuses it (fence-commit-minority);
//   - a holder cut off right after a slow renewal (LongHold.SlowReply):
//     in two of three long holds taken with Lock, every node's replies to
//     the holder's Client come 30-45 ms late from its Lock call on (a
//     request lands at once, its reply late: the keys are set at the
//     start of the round), and the cut starts the instant its first
//     renewal succeeds. A renewal whose new ValidUntil is measured from
//     its reply, not from its start, then outlives the keys by the
//     reply's delay (extend-deadline-from-reply);
//   - equal tickets (Plan.TieBursts, tieBursts): in one seed of two,
//     bursts of Lock calls from every Client at one instant, the frozen
//     waiter's.
func (p *Plan) drawPhases(r *rand.Rand) {
	if r.IntN(3) == 0 {
		p.FenceDrop = &FenceDrop{Client: r.IntN(p.Clients), Nodes: r.Perm(p.Nodes)[:p.Nodes/2+1]}
	}
	if lh := p.LongHold; lh != nil && !lh.Do && r.IntN(3) != 0 {
		lh.SlowReply = 30*time.Millisecond + time.Duration(r.Int64N(int64(15*time.Millisecond)))
		// Early, and with a longer settling: the cut, which starts a
		// renewal interval or more after the grant and must outlast the
		// renewal's ValidUntil, ends before the settling's last TTL and
		// 1.5 s (cut).
		lh.At = time.Duration(r.Int64N(int64(200 * time.Millisecond)))
		p.Settle += slowReplySettle
	}
	if r.IntN(2) == 0 {
		p.TieBursts = 1
	}
}

// tieBursts is the equal-ticket episode (Plan.TieBursts): in the quiet
// phase, every regular Client calls Lock on resource 0 at one fake-time
// instant, a burst every 700 ms, the first at the instant the frozen
// waiter calls (frozenWaiter). A ticket is the call's start in
// microseconds, so the calls of a burst take the same ticket and only the
// member orders them (DESIGN step 9: one total order, (ticket, member));
// their attempts split the nodes, and the waiters must agree on who goes
// first (queue-tie-reversed). A frozen waiter in the burst may be the
// first in the order and keep a minority when it yields: it freezes once
// queued, and must hold the others up by one reservation at most
// (yield-keeps-ttl; with 4 nodes, a kept half leaves no majority).
func (p *LockProfile) tieBursts(env *Env, c int) {
	pl := env.Plan
	res := resourceName(0)
	for k := range pl.TieBursts {
		if !env.SleepUntil(env.At(pl.Healed() + frozenWaiterAfter + time.Duration(k)*700*time.Millisecond)) {
			return
		}
		p.lockOnce(env, c, env.Clients[c], env.Rand(fmt.Sprintf("tie %d/%d", c, k)), env.Rand(fmt.Sprintf("tie42 %d/%d", c, k)), res, false)
	}
}

// FenceDrop is the fence episode (fenceEpisode): Client's fence commits
// to Nodes, a majority, are lost on the way.
type FenceDrop struct {
	Client int
	Nodes  []int
}

// fenceEpisode is the plan's FenceDrop, a second before the quiet phase
// (the workers idle, the plan's faults are over: kills and the long hold's
// cut end earlier), on a resource of its own: for fenceFor, the Client's
// commits to a majority are lost on the way (never answered: the round
// waits for them until its node timeout) and the other Clients' links to
// the minority where its commits still land are slower than a node
// timeout. The Client locks the resource, holds it a grid step and
// unlocks it; then every other Client with fencing does the same, one
// after the other. A lock counted on the minority's commits leaves the
// majority's counters below its fence, and the next holder, which decides
// on that majority, reuses it (fence); the library refuses such a lock,
// and the Client holds nothing.
func (p *LockProfile) fenceEpisode(env *Env, fd *FenceDrop) {
	pl := env.Plan
	fenced := func(c int) bool { return c >= len(pl.NoFence) || !pl.NoFence[c] }
	if !fenced(fd.Client) || !env.SleepUntil(env.At(pl.Healed()-time.Second)) {
		return
	}
	h, n := env.History, env.cl.net
	from := time.Now()
	to := from.Add(fenceFor)
	for i := range pl.Nodes {
		if slices.Contains(fd.Nodes, i) {
			n.dropCommit(fd.Client, i, true)
			env.faults.add(Fault{Kind: CommitDrop, Client: fd.Client, Node: i}, from, to)
			continue
		}
		for c := range pl.Clients {
			if c != fd.Client {
				n.setDelay(c, i, 2*pl.NodeTimeout)
				env.faults.add(Fault{Kind: LinkDelay, Client: c, Node: i}, from, to)
			}
		}
	}
	h.Note("fence episode: c%d's commits to %v lost, the others' links to the rest slowed %v", fd.Client, fd.Nodes, 2*pl.NodeTimeout)
	defer func() {
		for i := range pl.Nodes {
			n.dropCommit(fd.Client, i, false)
			for c := range pl.Clients {
				if c != fd.Client && !slices.Contains(fd.Nodes, i) {
					n.setDelay(c, i, 0)
				}
			}
		}
		h.Note("fence episode over")
	}()
	res := fenceResource
	take := func(c int) {
		ctx, cancel := context.WithDeadline(env.ctx, minTime(time.Now().Add(fenceFor/4), to))
		defer cancel()
		l, err := env.Clients[c].Lock(ctx, res)
		if err != nil {
			return
		}
		x := h.hold(c, res, l.Token(), l.Fence(), "Lock (fence)")
		p.write(env, x)
		env.SleepUntil(time.Now().Add(grid))
		h.endHold(x, minTime(time.Now(), l.ValidUntil()), "unlock")
		h.released(x, l.Unlock(context.WithoutCancel(ctx)))
	}
	take(fd.Client)
	for c := range pl.Clients {
		if c != fd.Client && fenced(c) {
			take(c)
		}
	}
	env.SleepUntil(to)
}

// fenceFor is how long the fence episode's faults last.
const fenceFor = 800 * time.Millisecond

// fenceResource is the resource of the fence episode (fenceEpisode): one
// the workers do not use.
const fenceResource = "fence"

// slowReplySettle is how much longer a plan whose long hold has slow
// replies settles (on top of longHoldSettle).
const slowReplySettle = 1500 * time.Millisecond

// drawAimed draws the faults aimed at issue 30's late requests.
func (p *Plan) drawAimed(r *rand.Rand) {
	if r.IntN(2) == 0 {
		p.DetachLag = 7*p.NodeTimeout/10 + time.Duration(r.Int64N(int64(3*p.NodeTimeout/10)))
	}
	// In every seed: yields are rare (a queued waiter's split vote), and
	// the gate costs nothing where none is sent.
	{
		// Past the guard (a few node timeouts) and long enough that the
		// key a release hands the requeued token lasts past half a TTL
		// from the yield's sending: held 12-16 node timeouts, the key
		// lasts a queue entry's life (2 retry delays and 4 node
		// timeouts) and a reservation after it lands.
		p.YieldHold = 12*p.NodeTimeout + time.Duration(r.Int64N(int64(4*p.NodeTimeout)))
	}
}

// yieldGate holds the yields of every Client (Plan.YieldHold).
type yieldGate struct {
	mu   sync.Mutex
	hold time.Duration // 0: off
}

var releaseSHA = []byte(scripts.ReleaseHash())

func (g *yieldGate) set(hold time.Duration) {
	g.mu.Lock()
	g.hold = hold
	g.mu.Unlock()
}

// delay is how long the gate holds chunk b: its hold if b carries a
// yield, else 0.
func (g *yieldGate) delay(b []byte) time.Duration {
	g.mu.Lock()
	d := g.hold
	g.mu.Unlock()
	if d == 0 || !bytes.Contains(b, releaseSHA) || !carriesYield(b) {
		return 0
	}
	return d
}

// carriesYield reports whether chunk b (RESP requests) holds an EVALSHA of
// the release script with a ticket (ARGV[5], scripts.ReleaseArgs): a yield.
func carriesYield(b []byte) bool {
	return anyScriptCall(b, func(args [][]byte, nk int) bool {
		if !bytes.EqualFold(args[0], []byte("evalsha")) || !bytes.Equal(args[1], releaseSHA) {
			return false
		}
		i := 3 + nk + 4
		return i < len(args) && len(args[i]) > 0
	})
}

// anyScriptCall reports whether one of the RESP requests in chunk b is a
// script call (EVAL or EVALSHA: its script, its key count nk, the keys,
// the arguments) for which f says true.
func anyScriptCall(b []byte, f func(args [][]byte, nk int) bool) bool {
	for len(b) > 0 {
		args, rest, ok := respCommand(b)
		if !ok {
			return false
		}
		b = rest
		if len(args) < 3 || !bytes.EqualFold(args[0], []byte("evalsha")) && !bytes.EqualFold(args[0], []byte("eval")) {
			continue
		}
		nk, err := strconv.Atoi(string(args[2]))
		if err == nil && nk >= 0 && f(args, nk) {
			return true
		}
	}
	return false
}

// respCommand reads one RESP array of bulk strings from b.
func respCommand(b []byte) (args [][]byte, rest []byte, ok bool) {
	line := func() ([]byte, bool) {
		i := bytes.Index(b, []byte("\r\n"))
		if i < 0 {
			return nil, false
		}
		l := b[:i]
		b = b[i+2:]
		return l, true
	}
	l, ok := line()
	if !ok || len(l) < 2 || l[0] != '*' {
		return nil, nil, false
	}
	n, err := strconv.Atoi(string(l[1:]))
	if err != nil || n < 0 {
		return nil, nil, false
	}
	for range n {
		l, ok := line()
		if !ok || len(l) < 2 || l[0] != '$' {
			return nil, nil, false
		}
		m, err := strconv.Atoi(string(l[1:]))
		if err != nil || m < 0 || len(b) < m+2 {
			return nil, nil, false
		}
		args = append(args, b[:m])
		b = b[m+2:]
	}
	return args, b, true
}

// holdYields is the yield gate's episode: over the fault phase, every
// yield is held YieldHold on its way.
func (p *LockProfile) holdYields(env *Env) {
	pl := env.Plan
	from, to := time.Now(), env.At(pl.FaultPhase)
	env.faults.add(Fault{Kind: LinkSpike, Client: -1, Node: -1}, from, to.Add(pl.YieldHold))
	env.cl.net.yields.set(pl.YieldHold)
	env.History.Note("yields held %v until %v", pl.YieldHold, env.History.since(to))
	env.SleepUntil(to)
	env.cl.net.yields.set(0)
}

// extendInFlight starts an Extend of l while the links of client c to
// one or two nodes are slowed by the plan's DetachLag each way, and
// returns once it was sent (the slowed links hold it) with its end to
// wait for. The slowing is undone at once: the chunks read meanwhile keep
// their delay.
func extendInFlight(env *Env, r *rand.Rand, c int, l *redlock.Lock, ctx context.Context, one bool) (wait func()) {
	pl := env.Plan
	n := env.cl.net
	slowed := r.Perm(pl.Nodes)[:1+r.IntN(2)]
	if one {
		// A single node other than the last (issue 42: the draw above
		// never singled one out).
		slowed = []int{slowed[0] % (pl.Nodes - 1)}
	}
	from := time.Now()
	before := make([]time.Duration, len(slowed))
	for k, i := range slowed {
		n.mu.Lock()
		before[k] = n.delay[c][i] // a delay fault of the plan's, restored below
		n.mu.Unlock()
		n.setDelay(c, i, before[k]+pl.DetachLag)
		env.faults.add(Fault{Kind: LinkSpike, Client: c, Node: i}, from, from.Add(2*pl.DetachLag))
	}
	env.History.Note("c%d extends hold of %s before its Detach, links to %v slowed %v", c, l.Token()[:8], slowed, pl.DetachLag)
	done := make(chan struct{})
	env.Go(func() {
		defer close(done)
		_ = l.Extend(context.WithoutCancel(ctx))
	})
	// In the bubble, a sleep returns once every goroutine is blocked:
	// the Extend's requests were written and read by the forwarders.
	runtime.Gosched()
	time.Sleep(time.Microsecond)
	for k, i := range slowed {
		n.setDelay(c, i, before[k])
	}
	return func() { <-done }
}

// HandoffSpread is the handoff episode (handoffEpisode): Waiter, a Client
// with the queue, waits for a resource of its own that Holder holds; its
// links to Slow, a majority of the nodes, are slowed, and so are
// Holder's links to the others.
type HandoffSpread struct {
	Holder, Waiter int
	Slow           []int
}

// drawHandoff draws the handoff episode (issue 33: handoff-validity-latest
// survived every plan), from a generator of its own, in one seed of two
// that has a Client with the queue and another Client.
func (p *Plan) drawHandoff(r *rand.Rand) {
	var queued []int
	for c := range p.Clients {
		if p.Queue[c] {
			queued = append(queued, c)
		}
	}
	if p.Clients < 2 || len(queued) == 0 || r.IntN(2) != 0 {
		return
	}
	w := queued[r.IntN(len(queued))]
	h := (w + 1 + r.IntN(p.Clients-1)) % p.Clients
	p.Handoff = &HandoffSpread{Holder: h, Waiter: w, Slow: r.Perm(p.Nodes)[:p.Nodes/2+1]}
}

// Timing of the handoff episode, from the waiter's call (see
// handoffEpisode).
const (
	handoffSlowAt   = 20 * time.Millisecond  // the links are slowed
	handoffRelease  = 25 * time.Millisecond  // the holder unlocks
	handoffHolderD  = 200 * time.Millisecond // the holder's links to the minority, each way
	handoffWaiterD  = 250 * time.Millisecond // the waiter's links to the majority, each way
	handoffTryAfter = 470 * time.Millisecond // from the release: the holder's TryLock
	handoffEnd      = time.Second            // from the release: the episode's faults end
)

// handoffResource is the resource of the handoff episode: one the workers
// do not use.
const handoffResource = "handoff"

// handoffEpisode is the plan's Handoff, 2.3 s before the quiet phase (the
// workers idle, the plan's faults over but a kill's, which may outlast
// them; it ends before the fence episode). It makes the handoffs that
// give a waiter a lock name attempts far apart, as a lock handed over by
// a majority of releases (DESIGN step 9, handedUntil) can be trusted only
// until the q-th latest of its nodes' deadlines:
//
//   - Holder locks the resource, and Waiter (fencing off for this call,
//     so the handoff's fast path runs) calls Lock: refused on every node,
//     it queues there with its first attempt a1;
//   - 20 ms later, Waiter's links to Slow (a majority) are slowed by
//     250 ms each way, and Holder's to the others by 200 ms: its Unlock,
//     5 ms later, hands the key to Waiter on Slow at once, naming a1, and
//     on the others 200 ms later;
//   - Waiter's next attempt (a retry delay, 60-180 ms, after a1) lands on
//     the others while Holder's key is still there, and refreshes its
//     entry with itself; on Slow it lands after its not-after bound and
//     changes nothing. The others' handoffs name that later attempt. The
//     messages of Slow's handoffs reach Waiter 250 ms after they were
//     sent, after the others': Waiter then knows of a majority of
//     handoffs, whose q-th latest deadline is a1's and whose latest is a
//     later attempt's, 60 ms or more after the release;
//   - Slow's keys expire a reservation after the release. Waiter's
//     renewals cannot reach Slow (late for their bound), so its lock is
//     lost at its ValidUntil; 470 ms after the release, past Slow's
//     expiry, Holder's Client calls TryLock and gets Slow. A Waiter that
//     trusts the latest deadline (handoff-validity-latest) holds until
//     then, and overlap reports the two holds.
//
// Whatever the path the library takes (a confirming attempt when the
// q-th deadline leaves too little time, or an ordinary grant), it must
// not hold beside the TryLock. The waiter's hold ends at Lost() (or at
// the episode's end, with Unlock); its Lock call ends at the episode's
// end.
func (p *LockProfile) handoffEpisode(env *Env, hs *HandoffSpread) {
	pl := env.Plan
	if !env.SleepUntil(env.At(pl.Healed() - 2300*time.Millisecond)) {
		return
	}
	h, n := env.History, env.cl.net
	res := handoffResource
	hc, wc := env.Clients[hs.Holder], env.Clients[hs.Waiter]
	ctx, cancel := context.WithTimeout(env.ctx, 2*time.Second)
	defer cancel()
	lh, err := hc.Lock(ctx, res)
	if err != nil {
		return
	}
	xh := h.hold(hs.Holder, res, lh.Token(), lh.Fence(), "Lock (handoff)")
	p.write(env, xh)
	if !env.SleepUntil(time.Now().Add(grid)) {
		h.endHold(xh, time.Now(), "run over")
		h.released(xh, lh.Unlock(context.WithoutCancel(ctx)))
		return
	}
	called := time.Now()
	end := called.Add(handoffRelease + handoffEnd)
	wctx, wcancel := context.WithDeadline(env.ctx, end)
	defer wcancel()
	done := make(chan struct{})
	env.Go(func() {
		defer close(done)
		l, err := wc.Lock(wctx, res, redlock.WithFencing(false))
		if err != nil {
			return
		}
		x := h.hold(hs.Waiter, res, l.Token(), l.Fence(), "Lock (handed)")
		select {
		case <-l.Lost():
			h.endHold(x, minTime(time.Now(), l.ValidUntil()), "lost")
		case <-wctx.Done():
			h.endHold(x, minTime(time.Now(), l.ValidUntil()), "unlock")
		}
		// The waiter's links are healed before its Unlock (chunks already
		// on their way keep their delay).
		env.SleepUntil(end)
		h.released(x, l.Unlock(context.WithoutCancel(env.ctx)))
	})
	slowed := func(c, i int) bool { return (c == hs.Waiter) == slices.Contains(hs.Slow, i) }
	if !env.SleepUntil(called.Add(handoffSlowAt)) {
		return
	}
	from := time.Now()
	for i := range pl.Nodes {
		for _, c := range []int{hs.Holder, hs.Waiter} {
			if !slowed(c, i) {
				continue
			}
			d := handoffHolderD
			if c == hs.Waiter {
				d = handoffWaiterD
			}
			n.setDelay(c, i, d)
			env.faults.add(Fault{Kind: LinkDelay, Client: c, Node: i}, from, end)
		}
	}
	h.Note("handoff episode: c%d's links to %v slowed %v, c%d's to the others %v", hs.Waiter, hs.Slow, handoffWaiterD, hs.Holder, handoffHolderD)
	env.SleepUntil(called.Add(handoffRelease))
	released := time.Now()
	h.endHold(xh, minTime(time.Now(), lh.ValidUntil()), "unlock")
	h.released(xh, lh.Unlock(context.WithoutCancel(ctx)))
	// The release's requests are on their way: the holder's links need
	// their delay no longer (its TryLock below takes Slow).
	for i := range pl.Nodes {
		if slowed(hs.Holder, i) {
			n.setDelay(hs.Holder, i, 0)
		}
	}
	if env.SleepUntil(released.Add(handoffTryAfter)) {
		if lt, err := hc.TryLock(ctx, res); err == nil {
			xt := h.hold(hs.Holder, res, lt.Token(), lt.Fence(), "TryLock (handoff)")
			p.write(env, xt)
			env.SleepUntil(time.Now().Add(grid))
			h.endHold(xt, minTime(time.Now(), lt.ValidUntil()), "unlock")
			h.released(xt, lt.Unlock(context.WithoutCancel(ctx)))
		}
	}
	env.SleepUntil(end)
	for i := range pl.Nodes {
		if slowed(hs.Waiter, i) {
			n.setDelay(hs.Waiter, i, 0)
		}
	}
	h.Note("handoff episode over")
	<-done
}

// The yield episode (Plan.YieldKeep; issue 33: yield-keeps-ttl survived
// every plan): in the quiet phase of a 4-node seed, one more Client (the
// yielder, which does nothing else) waits in Lock on a resource of its
// own whose key another Redlock client holds on every node (set on the
// nodes directly: a "foreign" token, as redsync's would be) — on half of
// the nodes (A) for yieldForeignA, on the others (B) for yieldForeignB.
// Once A's keys expire, its next attempt is granted on A (it is the only
// waiter, so first in the order) and refused on B: a split, after which
// it yields and, first in the order, keeps A for one reservation (DESIGN
// step 9). The instant its yield has reached the nodes its pipes freeze
// until the run's end, as a process that stopped right after yielding.
// Then (yield-kept) the key it kept on each node of A may outlive that
// instant by one reservation at most, on the node's clock: a frozen or
// partitioned waiter holds the next up by one reservation at most.
const (
	yieldForeignA = 300 * time.Millisecond
	yieldForeignB = 1500 * time.Millisecond
	yieldStart    = 200 * time.Millisecond // after the settling
)

// yieldResource is the resource of the yield episode.
const yieldResource = "yield"

// yieldEpisode is the yield episode, run by client c (see above).
func (p *LockProfile) yieldEpisode(env *Env, c int) {
	pl := env.Plan
	h, n := env.History, env.cl.net
	if !env.SleepUntil(env.At(pl.Healed() + yieldStart)) {
		return
	}
	key := redlock.DefaultKeyPrefix + yieldResource
	perm := env.Rand("yield episode").Perm(pl.Nodes)
	a := perm[:pl.Nodes/2]
	for _, i := range perm {
		m := env.cl.node(i)
		if m == nil {
			return // a node still down: no episode
		}
		env.cl.tick(i, m)
		d := yieldForeignB
		if slices.Contains(a, i) {
			d = yieldForeignA
		}
		m.Set(key, "foreign")
		m.SetTTL(key, d)
	}
	start := time.Now()
	h.Note("yield episode: a foreign token holds %s on %v for %v, on the others for %v; c%d waits", key, a, yieldForeignA, yieldForeignB, c)
	ctx, cancel := context.WithDeadline(env.ctx, env.At(pl.Duration()-time.Millisecond))
	defer cancel()
	done := make(chan struct{})
	env.Go(func() {
		defer close(done)
		l, err := env.Clients[c].Lock(ctx, yieldResource)
		if err != nil {
			return
		}
		x := h.hold(c, yieldResource, l.Token(), l.Fence(), "Lock (yielder)")
		h.endHold(x, minTime(time.Now(), l.ValidUntil()), "unlock")
		h.released(x, l.Unlock(context.WithoutCancel(env.ctx)))
	})
	defer func() { <-done }()
	// Its first yield once A's keys expired, delivered to every node of
	// A, and then none of its requests in flight (a straggler of the
	// round that landed after the yield, say: its late grant is released
	// or yielded again), then the freeze: its next attempt comes a retry
	// delay later. (Frozen with an attempt in flight, the keys that
	// attempt sets last their TTL: a process that stops mid-attempt.)
	yielded := func() bool {
		if !env.cl.net.idle(c, 10*time.Millisecond) {
			return false
		}
		for _, i := range a {
			if env.cl.net.lastYield(c, i).Before(start.Add(yieldForeignA)) {
				return false
			}
		}
		return true
	}
	for !yielded() {
		if !env.SleepUntil(time.Now().Add(100 * time.Microsecond)) {
			return
		}
	}
	from := time.Now()
	if !from.Before(start.Add(yieldForeignB)) {
		return // B's foreign keys are gone: it may hold the lock by now
	}
	n.freezeClient(c, true)
	env.faults.add(Fault{Kind: ClientFreeze, Client: c}, from, env.At(pl.Duration()))
	h.Note("yield episode: c%d yielded, frozen", c)
	defer n.freezeClient(c, false)
	// What it kept, on the nodes' clocks.
	most := pl.Reservation() + 2*time.Millisecond
	for _, i := range a {
		m := env.cl.node(i)
		if m == nil {
			continue
		}
		env.cl.tick(i, m)
		v, err := m.Get(key)
		if err != nil || v == "" || v == "foreign" {
			continue
		}
		// Only a key whose last request there was the yield: a grant of
		// an attempt that answered after its round was decided (early,
		// once a majority was impossible) is not yielded, and stays for
		// the TTL until the next attempt (redlock settle: harmless while
		// the waiter lives; a process frozen mid-attempt keeps such keys).
		if td, _, ok := n.lastDelivered(v, i); !ok || n.lastYield(c, i).Before(td) {
			continue
		}
		if ttl := m.TTL(key); ttl > most {
			h.Violate("yield-kept", "%s on node %d: the key of a waiter frozen right after it yielded (token %.8s) has %v left, more than a reservation (%v)", key, i, v, ttl, pl.Reservation())
		}
	}
	env.SleepUntil(env.At(pl.Duration()))
}
