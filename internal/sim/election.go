package sim

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quorumlock/quorumlock/election"
)

// electionName is the one election the election profile's candidates run
// for.
const electionName = "leader"

// ElectionProfile is the workload of package election: one candidate per
// regular Client (2 or 3), each with an Election of its own on one name,
// loops over Campaign (its ctx ends with the run or after half a TTL to
// two and a half), holds the Term for up to 300 ms — or, one term in
// eight, for half a TTL to a TTL, across a renewal and an identity
// refresh — or until its Context ends, and Resigns. An observer on Client 0 calls
// Leader every 0–100 ms, and a watcher on Client 0 follows Observe (its
// poll every observePoll) for the whole run. The candidates campaign through the settling
// too: with the plan's FrozenWaiter, the first term that begins in the
// second after the fault phase is a frozen leader instead — its Client's
// pipes freeze for a TTL right after Campaign returned, it holds until
// its Context ends (two TTLs at most), and the others must take over only
// once its lease has run out.
//
// Its invariants:
//   - leader-overlap: a term is [Campaign returned, min(Resign called,
//     Context done, ValidUntil)]; two terms never intersect;
//   - term-fence: with no node restarted empty (DESIGN step 8 needs the
//     counters kept), fences strictly increase in the order terms began;
//   - leader-liveness: from the end of the settling to the end of the
//     run, while some Campaign waits with a live ctx, some term is held
//     within ElectionBound;
//   - stale-leader: Leader never names a term once a later term had begun
//     (its identity expires with its lease, and the successor's lock
//     stands on a majority where that lease ran out);
//   - observe-order: Observe never delivers a term after a later term it
//     delivered (its reads are serial, and once a majority held the later
//     term's identity the older one cannot hold a majority again: its
//     identity is written only where its lock token stands, which the
//     later lock rules out on a majority, and withdrawals, expiry and
//     wipes only remove it);
//   - observe-liveness: a term that begins once the faults are undone (and
//     go-redis dials again: redisDialProbe) and lasts ObserveBound is
//     delivered by Observe within ObserveBound of its beginning, unless
//     the watcher's Client was frozen meanwhile. The bound is the poll's:
//     an Observe that ignored announcements would still meet it (the
//     announcements make it one read, and no invariant bounds that
//     path).
type ElectionProfile struct {
	mu      sync.Mutex // protects the fields below
	terms   []*Hold    // Resource electionName, Token the term's ID
	waits   []*Wait    // Campaign calls
	answers []answer   // Leader's answers
	seen    []answer   // Observe's deliveries, at when they came

	frozen atomic.Bool // the frozen leader's episode is taken
}

// answer is one answer of Leader: the term it named, and when the call
// began.
type answer struct {
	at   time.Time
	term string
	end  time.Time // Leader returned (zero for Observe's deliveries)
}

// Name is "election".
func (p *ElectionProfile) Name() string { return "election" }

// Terms is how many terms Campaign returned.
func (p *ElectionProfile) Terms() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.terms)
}

// ElectionBound is the liveness bound of the election profile: the lock's
// (Plan.WaitBound: a reservation, a retry delay, two node timeouts) and
// four more node timeouts for the election's own steps, each decided at a
// majority and bounded by the node timeout (the election's default is the
// lock's): Resign waits for an identity refresh in flight and withdraws
// the identity before it releases the lock, and Campaign, once it holds
// the lock, writes the identity and announces it before it returns; all
// that and a quarter again. At the plan's options: 1.25 × (460 ms + 180 ms
// + 6 × 100 ms) = 1.55 s.
func (p Plan) ElectionBound() time.Duration {
	return 5 * (p.Reservation() + p.RetryMax + 6*p.NodeTimeout) / 4
}

// observePoll is the watcher's poll interval (WithPollInterval), for a
// term whose announcement it missed.
const observePoll = 500 * time.Millisecond

// ObserveBound is how soon Observe delivers a term once the faults are
// undone: the poll interval, then a Leader read that was in flight when
// the poll came (it may have read before the term) and the read the poll
// asks for, each bounded by the node timeout; all that and a quarter
// again. At the plan's options: 1.25 × (500 ms + 2 × 100 ms) = 875 ms.
// An announcement, which every Campaign publishes before it returns,
// makes it one read in the usual case.
func (p Plan) ObserveBound() time.Duration {
	return 5 * (observePoll + 2*p.NodeTimeout) / 4
}

// redisDialProbe is how long after a killed node is back a go-redis
// client may still fail every request to it: once its pool has counted
// PoolSize failed dials (reset only after that, by its own probe), it stops
// dialing, returns the last dial's error and probes the node once a
// second (go-redis v9 internal/pool, tryDial).
// A term that begins sooner may be delivered late: the watcher's reads
// fail on that node.
const redisDialProbe = time.Second

// Start launches the candidates, the observer and the watcher.
func (p *ElectionProfile) Start(env *Env) {
	newElection := func(c int, id string) *election.Election {
		e, err := election.New(env.Clients[c], electionName, election.WithIdentity(id), election.WithPollInterval(observePoll))
		if err != nil {
			panic(fmt.Sprintf("sim: election.New: %v", err)) // a valid name and options
		}
		return e
	}
	for c := range env.Plan.Clients {
		e := newElection(c, fmt.Sprintf("c%d", c))
		r := env.Rand(fmt.Sprintf("candidate %d", c))
		env.Go(func() { p.candidate(env, c, e, r) })
	}
	e := newElection(0, "observer")
	r := env.Rand("observer")
	env.Go(func() { p.observer(env, e, r) })
	w := newElection(0, "watcher")
	env.Go(func() { p.watch(env, w) })
}

func (p *ElectionProfile) candidate(env *Env, c int, e *election.Election, r *rand.Rand) {
	h := env.History
	pl := env.Plan
	for nextGrid(env, r, 50) {
		ctx, cancel := context.WithTimeout(env.ctx, pl.TTL/2+time.Duration(r.Int64N(int64(2*pl.TTL))))
		w := &Wait{Client: c, Resource: electionName, Start: time.Now(), Deadline: deadline(ctx)}
		p.mu.Lock()
		p.waits = append(p.waits, w)
		p.mu.Unlock()
		t, err := e.Campaign(ctx)
		p.mu.Lock()
		w.End, w.Got = time.Now(), err == nil
		p.mu.Unlock()
		if err != nil {
			cancel()
			continue
		}
		l := t.Leader()
		x := &Hold{Client: c, Resource: electionName, Token: l.Term, Fence: l.Fence, Start: time.Now(), Op: "Campaign"}
		p.mu.Lock()
		x.ID = len(p.terms)
		p.terms = append(p.terms, x)
		p.mu.Unlock()
		h.own(l.Term, c, "term")
		h.Note("c%d Campaign: term %d fence %d (%.8s)", c, x.ID, x.Fence, x.Token)
		d := time.Duration(r.IntN(30)) * grid
		if r.IntN(8) == 0 {
			// Half a TTL to one and a half (issue 42: past the lease the
			// identity was first written for, so that its refresh
			// matters).
			d = pl.TTL/2 + time.Duration(r.Int64N(int64(pl.TTL)))
		}
		if p.freezeLeader(env, c) {
			d = 2 * pl.TTL
		}
		tm := time.NewTimer(d)
		why := "resign"
		select {
		case <-tm.C:
		case <-t.Context().Done():
			why = fmt.Sprintf("context done: %v", firstLine(context.Cause(t.Context())))
		case <-env.ctx.Done():
			why = "run over"
		}
		tm.Stop()
		end := minTime(time.Now(), t.ValidUntil())
		p.mu.Lock()
		x.End = end
		p.mu.Unlock()
		h.Note("c%d term %d ends at %v (%s)", c, x.ID, h.since(end), why)
		err = t.Resign(context.WithoutCancel(ctx))
		p.mu.Lock()
		x.Released = time.Now()
		p.mu.Unlock()
		h.giveUp(l.Term, x.Released)
		if err != nil {
			h.Note("c%d term %d resign: %v", c, x.ID, firstLine(err))
		}
		cancel()
	}
}

// freezeLeader starts the frozen leader's episode (see ElectionProfile)
// on client c, which has just begun a term, if the plan has one and it is
// due: it freezes c's pipes now and thaws them a TTL later (the lease,
// last renewed before the freeze, runs out meanwhile).
func (p *ElectionProfile) freezeLeader(env *Env, c int) bool {
	pl := env.Plan
	since := time.Since(env.start)
	if !pl.FrozenWaiter || since < pl.FaultPhase || since >= pl.FaultPhase+time.Second || !p.frozen.CompareAndSwap(false, true) {
		return false
	}
	from := time.Now()
	env.cl.net.freezeClient(c, true)
	env.faults.add(Fault{Kind: ClientFreeze, Client: c}, from, from.Add(pl.TTL))
	env.History.Note("c%d (frozen leader) frozen for %v", c, pl.TTL)
	env.Go(func() {
		tm := time.NewTimer(pl.TTL)
		select {
		case <-tm.C:
		case <-env.ctx.Done():
			tm.Stop()
		}
		env.cl.net.freezeClient(c, false)
		env.History.Note("c%d (frozen leader) thawed", c)
	})
	return true
}

// observer asks who leads every 0–100 ms, for the whole run.
func (p *ElectionProfile) observer(env *Env, e *election.Election, r *rand.Rand) {
	for nextGrid(env, r, 10) {
		at := time.Now()
		l, err := e.Leader(env.ctx)
		if err != nil && !errors.Is(err, election.ErrNoLeader) {
			continue // too few nodes answered: no answer
		}
		p.mu.Lock()
		p.answers = append(p.answers, answer{at: at, term: l.Term, end: time.Now()})
		p.mu.Unlock()
	}
}

// watch records what Observe delivers, for the whole run; the channel
// closes once the run's ctx ended and the subscriptions are closed.
func (p *ElectionProfile) watch(env *Env, e *election.Election) {
	for l := range e.Observe(env.ctx) {
		p.mu.Lock()
		p.seen = append(p.seen, answer{at: time.Now(), term: l.Term})
		p.mu.Unlock()
		env.History.Note("watcher: Observe delivered term %.8s", l.Term)
	}
}

// Check checks the profile's invariants (see ElectionProfile).
func (p *ElectionProfile) Check(env *Env) {
	h := env.History
	pl := env.Plan
	p.mu.Lock()
	defer p.mu.Unlock()
	xs := slices.Clone(p.terms)
	slices.SortStableFunc(xs, func(a, b *Hold) int { return a.Start.Compare(b.Start) })
	// leader-overlap: the first pair that intersects.
overlap:
	for i, a := range xs {
		for _, b := range xs[i+1:] {
			if !b.Start.Before(a.End) {
				break
			}
			h.violateAt(b.Start, "leader-overlap", "term %d (c%d, %v..%v) and term %d (c%d, %v..%v) led together",
				a.ID, a.Client, h.since(a.Start), h.since(a.End), b.ID, b.Client, h.since(b.Start), h.since(b.End))
			break overlap
		}
	}
	// term-fence, unless a node restarted empty.
	if !pl.Wipes() {
		for i := 1; i < len(xs); i++ {
			if a, b := xs[i-1], xs[i]; b.Fence <= a.Fence {
				h.violateAt(b.Start, "term-fence", "term %d (c%d) fence %d after term %d (c%d) fence %d",
					b.ID, b.Client, b.Fence, a.ID, a.Client, a.Fence)
				break
			}
		}
	}
	// stale-leader: an answer naming a term after a later term began.
	started := make(map[string]time.Time)
	for _, x := range xs {
		started[x.Token] = x.Start
	}
	for _, a := range p.answers {
		s, ok := started[a.term]
		if !ok {
			continue // a Campaign that did not return it (its identity took too few nodes)
		}
		if i := slices.IndexFunc(xs, func(x *Hold) bool { return x.Start.After(s) && x.Start.Before(a.at) }); i >= 0 {
			h.violateAt(a.at, "stale-leader", "Leader called at %v named the term of %v (%.8s), after term %d (c%d) began at %v",
				h.since(a.at), h.since(s), a.term, xs[i].ID, xs[i].Client, h.since(xs[i].Start))
			break
		}
	}
	p.checkCurrent(env, xs)
	p.checkObserve(env, xs, started)
	h.mu.Lock()
	h.livenessLocked("leader-liveness", p.waits, p.terms, env.At(pl.Healed()), env.At(pl.Duration()), pl.ElectionBound(), nil)
	h.mu.Unlock()
}

// checkCurrent is leader-current (issue 42): a Leader call made while a
// term held from before the call to after its answer, with no fault of any
// kind (spikes, freezes, extension pauses) from a TTL before that term
// began to the answer, names that term: its identity stood on a majority
// from before Campaign returned (Campaign proclaims it there first), its
// refreshes land while its lock is renewed, and only its Resign withdraws
// it. A Leader that reads a minority, names the zero Leader while a term
// holds, or a term that refreshes its identity too late, fails it.
// p.mu is held.
func (p *ElectionProfile) checkCurrent(env *Env, xs []*Hold) {
	h := env.History
	pl := env.Plan
	for _, a := range p.answers {
		i := slices.IndexFunc(xs, func(x *Hold) bool { return !x.Start.After(a.at) && x.End.After(a.end) })
		if i < 0 {
			continue
		}
		x := xs[i]
		if a.term == x.Token || env.faults.any(x.Start.Add(-pl.TTL), a.end) {
			continue
		}
		h.violateAt(a.at, "leader-current", "Leader called at %v (answered at %v) named %q while term %d (c%d, %v..%v, %.8s) held, with no fault since %v",
			h.since(a.at), h.since(a.end), a.term, x.ID, x.Client, h.since(x.Start), h.since(x.End), x.Token, h.since(x.Start.Add(-pl.TTL)))
		return
	}
}

// checkObserve checks observe-order and observe-liveness (see
// ElectionProfile) over the terms xs, in the order they began, whose
// beginnings started gives by ID. p.mu is held.
func (p *ElectionProfile) checkObserve(env *Env, xs []*Hold, started map[string]time.Time) {
	h := env.History
	pl := env.Plan
	var last answer
	var lastStart time.Time
	for _, a := range p.seen {
		s, ok := started[a.term]
		if !ok {
			continue // no leader (the zero Leader), or a Campaign that did not return its term
		}
		if s.Before(lastStart) {
			h.violateAt(a.at, "observe-order", "Observe delivered at %v the term of %v (%.8s), after it delivered at %v the later term of %v (%.8s)",
				h.since(a.at), h.since(s), a.term, h.since(last.at), h.since(lastStart), last.term)
			break
		}
		last, lastStart = a, s
	}
	bound := pl.ObserveBound()
	from := maxTime(env.At(pl.FaultPhase), env.faults.lastEnd().Add(redisDialProbe))
	for _, x := range xs {
		due := x.Start.Add(bound)
		if x.Start.Before(from) || x.End.Before(due) || env.faults.frozen(0, x.Start, due) {
			continue
		}
		if !slices.ContainsFunc(p.seen, func(a answer) bool { return a.term == x.Token && !a.at.After(due) }) {
			h.violateAt(due, "observe-liveness", "term %d (c%d, %v..%v) was not delivered by Observe within %v of its beginning",
				x.ID, x.Client, h.since(x.Start), h.since(x.End), bound)
			break
		}
	}
}

// electionFlag puts the election's profile in the seed loop (on by
// default; -sim.election=false leaves it out), and electionSeeds is the
// same for the controls test: its election control sets it.
var electionFlag = flag.Bool("sim.election", true, "run the election profile in one seed of ten (s%10 == 8) of TestSim")

var electionSeeds atomic.Bool
