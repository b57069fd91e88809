package sim

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/quorumlock/quorumlock/redlock"
)

// Plan is everything a seed decides before a run: the cluster's shape, the
// lock options, the phases, the faults and the workload's knobs. The same
// seed always gives the same Plan ([NewPlan]); the run's interleaving may
// still differ (goroutine scheduling inside the bubble is not fully
// deterministic), see docs/simulation.md.
type Plan struct {
	Seed      uint64
	Nodes     int // 3 or 5
	Clients   int // regular Clients, each with Workers goroutines
	Workers   int
	Resources int
	// Queue is per Client: WithWakeUp (the waiter queue) on or off.
	Queue []bool

	TTL, NodeTimeout, RetryMin, RetryMax time.Duration

	// Faults happen in [0, FaultPhase); all are undone at its end. Then
	// Settle (keys and entries left by the faults expire), then Quiet, in
	// which the liveness bound is checked.
	FaultPhase, Settle, Quiet time.Duration
	Faults                    []Fault

	// FrozenWaiter adds a Client that, early in the quiet phase, waits in
	// Lock on resource 0 and has its pipes frozen for FrozenFor while it
	// waits (and holds nothing): a handoff to it may delay the next
	// holder by one reservation at most.
	FrozenWaiter bool
	FrozenFor    time.Duration

	// Trace records what every Client's hooks report (attempts, renewals,
	// node errors) in the history: for replaying a failing seed.
	Trace bool

	// Drift is per node: its clock runs at 1 + Drift[i] times the
	// bubble's, within the drift factor the Clients allow (DriftFactor);
	// Offset is where it starts from. Keys expire by it and TIME reads it.
	Drift  []float64
	Offset []time.Duration

	// NoFence is per Client: fencing off (WithFencing(false)), so that
	// the handoff's fast path (a lock held from a majority of handoffs,
	// which fencing turns off) runs too. Lock profile only (Run clears
	// it for the others, whose checks expect fences).
	NoFence []bool

	// LongHold is the long-hold episode (nil: none), see LongHold.
	LongHold *LongHold
	// Cohort is the local-handoff workload (cohort.go; nil: none).
	Cohort *Cohort

	// ExtendRace is the share of holds that end with an Extend racing the
	// Unlock (the Extend started just before it, on another goroutine).
	ExtendRace float64

	// DetachLag and YieldHold are the faults aimed at issue 30's late
	// requests (aimed.go; 0: none): an Extend in flight across a Detach,
	// slowed by DetachLag; the yields held YieldHold.
	DetachLag, YieldHold time.Duration

	// FenceDrop is the fence episode (aimed.go; nil: none). Lock profile
	// only.
	FenceDrop *FenceDrop

	// TieBursts is how many bursts of Lock calls at one instant, one per
	// Client, the quiet phase has (aimed.go tieBursts; 0: none).
	TieBursts int

	// Handoff is the handoff episode (aimed.go; nil: none). Lock profile
	// only.
	Handoff *HandoffSpread
	// YieldKeep is the yield episode (aimed.go yieldEpisode): one more
	// Client, after the frozen waiter's, in every 4-node seed. Lock
	// profile only.
	YieldKeep bool

	// Issue 42's plans (aimed42.go drawIssue42): latency in the quiet
	// phase; every clock probe slowed (up, or its reply); one Client's
	// messages slowed; a mid-run Close of client CloseClient CloseAt
	// after the settling (0: none; lock profile only); the Detach race;
	// long holds in the quiet phase; the semaphore's K; a majority
	// paused during a Resume's re-arm; the holder locking again.
	QuietLag       *QuietLag
	SlowTime       time.Duration
	SlowTimeUp     bool
	MsgDelay       time.Duration
	MsgClient      int
	CloseAt        time.Duration
	CloseClient    int
	DetachRace     bool
	LongQuietHolds bool
	SemK           int
	ResumePause    bool
	Reentry        bool
	SlowTimeVaries bool
	ResumeEvict    bool
	// GrantExpired is the expired-grant episode (expired.go): client
	// GXClient's Lock (GXLock) or TryLock of its own resource, GXAt after
	// a TTL before the settling ends, whose grant starves past its
	// validity before the call's last check. Lock profile only.
	GrantExpired bool
	GXAt         time.Duration
	GXClient     int
	GXLock       bool
	// SubClose is the subscribe-close episode (subclose.go): one more
	// Client, the last, whose RLock starts its subscriptions over lagged
	// links and which closes while they are in their first SUBSCRIBE,
	// SubCloseAt after the settling. Every profile.
	SubClose   bool
	SubCloseAt time.Duration
	// LateHandoff is the late-handoff episode (latehandoff.go): two more
	// Clients, after the subscribe-close one, LHAt after the settling.
	// Lock profile only.
	LateHandoff bool
	LHAt        time.Duration
	// GuardEpisode is the guard episode (guard.go): two more Clients,
	// after the late-handoff ones, in the seeds whose clock probes are
	// slowed up. Lock profile only.
	GuardEpisode *GuardEp
}

// FaultKind names a fault.
type FaultKind int

// The faults of a plan.
const (
	LinkDelay    FaultKind = iota // one Client's pipes to one node add Delay each way for up to a TTL (a slow link: half a node timeout or more makes it a cut)
	LinkSpike                     // a short delay spike (1.5–4 node timeouts, as long): the requests it holds land after their caller gave up
	LinkReset                     // one Client's connections to one node are closed (a reset; bytes in flight are lost)
	NodePause                     // the node stops reading (SIGSTOP): requests wait in its socket
	NodeSlow                      // every pipe to the node adds Delay each way
	NodeKill                      // the node dies, and comes back after For (> TTL) with its data (appendfsync always)
	NodeWipe                      // the node dies, and comes back empty after For (> TTL): fence counters are lost, so the fence check is off (DESIGN step 8 needs them kept)
	ClientFreeze                  // every pipe of one Client is frozen both ways (a frozen process, or a partitioned one)
	CommitDelay                   // one Client's fence commits (phase 2 of a fenced acquire) to one node add Delay: a fault aimed at one phase
	CommitDrop                    // one Client's fence commits to one node are lost on the way, unanswered (aimed.go)
)

var kindNames = [...]string{"delay", "spike", "reset", "pause", "slow", "kill", "wipe", "freeze", "commit", "commit-drop"}

// String is the fault's name in a plan's line.
func (k FaultKind) String() string { return kindNames[k] }

// Fault is one fault of a plan: it starts At after the run's start and
// lasts For (0 for a reset).
type Fault struct {
	Kind         FaultKind
	At, For      time.Duration
	Client, Node int
	Delay        time.Duration
}

// String is the fault in a plan's line: kind@start+duration, target, delay.
func (f Fault) String() string {
	s := fmt.Sprintf("%v@%v", f.Kind, f.At)
	if f.For > 0 {
		s += "+" + f.For.String()
	}
	switch f.Kind {
	case LinkDelay, LinkSpike, LinkReset, CommitDelay, CommitDrop:
		s += fmt.Sprintf(" c%d-n%d", f.Client, f.Node)
	case ClientFreeze:
		s += fmt.Sprintf(" c%d", f.Client)
	default:
		s += fmt.Sprintf(" n%d", f.Node)
	}
	if f.Delay > 0 {
		s += " " + f.Delay.String()
	}
	return s
}

// NewPlan draws the plan of seed.
func NewPlan(seed uint64) Plan {
	r := rand.New(rand.NewPCG(seed, 0x91a4))
	p := Plan{
		Seed:        seed,
		Nodes:       3,
		Clients:     2 + r.IntN(3)/2,
		Workers:     1 + r.IntN(4)/3,
		Resources:   1 + r.IntN(2),
		TTL:         3 * time.Second,
		NodeTimeout: 100 * time.Millisecond,
		RetryMin:    60 * time.Millisecond,
		RetryMax:    180 * time.Millisecond,
		FaultPhase:  1500 * time.Millisecond,
		Quiet:       2 * time.Second,
		ExtendRace:  0.2,
	}
	if r.IntN(6) == 0 {
		p.Nodes = 5
	}
	p.Settle = p.TTL + 1500*time.Millisecond
	for range p.Clients {
		p.Queue = append(p.Queue, r.IntN(4) != 0)
	}
	if r.IntN(3) != 0 {
		p.FrozenWaiter = true
		p.FrozenFor = p.TTL
	}
	nf := r.IntN(6)
	for range nf {
		p.Faults = append(p.Faults, p.drawFault(r))
	}
	p.drawMore(rand.New(rand.NewPCG(seed, 0x33)))
	p.drawAimed(rand.New(rand.NewPCG(seed, 0x30)))
	p.drawPhases(rand.New(rand.NewPCG(seed, 0x34)))
	p.drawHandoff(rand.New(rand.NewPCG(seed, 0x35)))
	p.drawIssue42(rand.New(rand.NewPCG(seed, 0x42)))
	p.drawCohort(rand.New(rand.NewPCG(seed, 0x41)))
	p.YieldKeep = p.Nodes == 4
	return p
}

// DriftFactor is the drift factor of the plan's Clients (redlock's
// default): node clocks run at most this much fast or slow.
const DriftFactor = 0.01

// drawMore draws what issue 33 added to a plan, from a generator of its
// own, so that the plans drawn before (the cluster, the faults) stay those
// of their seeds: the node clocks and the long-hold episode.
func (p *Plan) drawMore(r *rand.Rand) {
	// N = 4 in some seeds (quorum 3: a 2-2 split is no majority).
	if p.Nodes == 3 && r.IntN(6) == 0 {
		p.Nodes = 4
	}
	for range p.Clients {
		p.NoFence = append(p.NoFence, r.IntN(3) == 0)
	}
	for range p.Nodes {
		// One node in three runs fast by nearly the whole factor (the
		// case the drift allowance is for); the others anywhere within
		// it. Fast by the whole factor is still safe: a key set for the
		// TTL outlives TTL/(1+d) ≥ TTL − TTL·d, the allowance's first term.
		d := DriftFactor * 0.99
		if r.IntN(3) != 0 {
			d = DriftFactor * (2*r.Float64() - 1) * 0.99
		}
		p.Drift = append(p.Drift, d)
		p.Offset = append(p.Offset, time.Duration(r.Int64N(int64(4*time.Second)))-2*time.Second)
	}
	if r.IntN(3) == 0 {
		// Phase-aimed: one Client's fence commits to a majority of the
		// nodes land late (the node timeout is past), so that a grant
		// commits on a minority at most.
		c := r.IntN(p.Clients)
		at := time.Duration(r.Int64N(int64(p.FaultPhase / 2)))
		d := 3*p.NodeTimeout/2 + time.Duration(r.Int64N(int64(3*p.NodeTimeout/2)))
		for _, i := range r.Perm(p.Nodes)[:p.Nodes/2+1] {
			p.Faults = append(p.Faults, Fault{Kind: CommitDelay, At: at, For: p.FaultPhase / 2, Client: c, Node: i, Delay: d})
		}
	}
	if r.IntN(2) == 0 {
		lh := &LongHold{
			Client:   r.IntN(p.Clients),
			Resource: r.IntN(p.Resources),
			At:       time.Duration(r.Int64N(int64(p.FaultPhase / 2))),
			For:      p.TTL + time.Duration(r.Int64N(int64(p.TTL))),
			Do:       r.IntN(3) == 0,
			CutAfter: time.Duration(r.Int64N(int64(p.TTL / 4))),
			CutFor:   p.TTL + 200*time.Millisecond + time.Duration(r.Int64N(int64(time.Second))),
		}
		if r.IntN(3) == 0 {
			lh.Freeze = true
		} else {
			// Links to a majority cut, the others open: its renewals
			// reach a minority only.
			perm := r.Perm(p.Nodes)
			lh.Cut = perm[:p.Nodes/2+1]
		}
		p.LongHold = lh
		// Its cut ends up to 4.5 s into the run: the settling then lasts
		// as long after it as after the other faults (a TTL and 1.5 s),
		// so the quiet phase starts from a settled cluster.
		p.Settle += longHoldSettle
	}
}

// longHoldSettle is how much longer a plan with a long hold settles.
const longHoldSettle = 3 * time.Second

// LongHold is an episode of the lock profile: a holder that holds for one
// to two TTLs and, while it holds, is frozen or cut off from a majority of
// the nodes for longer than the TTL. It ends its hold only when Lost()
// closes (or Do's ctx ends), the signal a user acts on, never at
// ValidUntil (which takes the library's word): a lock that keeps
// believing it is held on a minority, or learns of its loss late,
// overlaps the next holder.
type LongHold struct {
	Client, Resource int
	At, For          time.Duration // when it calls Lock; how long it means to hold
	Do               bool          // through Do (its fn's ctx) instead of Lock
	CutAfter, CutFor time.Duration // the cut: after the grant, and how long
	Freeze           bool          // the whole Client frozen, else Cut
	Cut              []int         // the nodes it is cut off from
	// SlowReply (0: none; Lock only) slows the replies of every node to
	// the Client by this much from its Lock call on, and the cut then
	// comes right after the first renewal that succeeds, not at CutAfter
	// (aimed.go drawPhases).
	SlowReply time.Duration
}

// String is the episode in a plan's line.
func (lh *LongHold) String() string {
	what := fmt.Sprintf("cut from %v", lh.Cut)
	if lh.Freeze {
		what = "frozen"
	}
	if lh.SlowReply > 0 {
		return fmt.Sprintf("long hold c%d r%d @%v for %v, replies slowed %v, %s right after its first renewal for %v", lh.Client, lh.Resource, lh.At, lh.For, lh.SlowReply, what, lh.CutFor)
	}
	return fmt.Sprintf("long hold c%d r%d @%v for %v, %s %v after the grant for %v", lh.Client, lh.Resource, lh.At, lh.For, what, lh.CutAfter, lh.CutFor)
}

func (p *Plan) drawFault(r *rand.Rand) Fault {
	to := p.NodeTimeout
	f := Fault{Client: r.IntN(p.Clients), Node: r.IntN(p.Nodes)}
	f.At = time.Duration(r.Int64N(int64(p.FaultPhase * 3 / 4)))
	f.For = to + time.Duration(r.Int64N(int64(p.TTL)))
	switch k := r.IntN(10); {
	case k < 2:
		f.Kind = LinkSpike
		f.Delay = 3*to/2 + time.Duration(r.Int64N(int64(5*to/2)))
		f.For = 3*to/2 + time.Duration(r.Int64N(int64(5*to/2)))
	case k < 3:
		f.Kind = LinkDelay
		// From half the node timeout to four and a half: most land late.
		f.Delay = to/2 + time.Duration(r.Int64N(int64(4*to)))
	case k < 4:
		f.Kind, f.For = LinkReset, 0
	case k < 6:
		f.Kind = NodePause
	case k < 7:
		f.Kind = NodeSlow
		f.Delay = to/4 + time.Duration(r.Int64N(int64(to)))
	case k < 8:
		// Down for longer than the TTL (DESIGN's rule for a node that
		// does not persist, kept for both): past the fault phase if need
		// be, within the settling.
		f.Kind = NodeKill
		if r.IntN(3) == 0 {
			f.Kind = NodeWipe
		}
		f.For = p.TTL + 200*time.Millisecond + time.Duration(r.Int64N(int64(500*time.Millisecond)))
		return f
	default:
		f.Kind = ClientFreeze
		f.For = to + time.Duration(r.Int64N(int64(p.TTL+p.TTL/2)))
	}
	if end := p.FaultPhase; f.At+f.For > end {
		f.For = end - f.At
	}
	return f
}

// Options are the lock options of a Client of the plan.
func (p Plan) Options(client int) []redlock.Option {
	q := true
	if client < len(p.Queue) {
		q = p.Queue[client]
	}
	opts := []redlock.Option{
		redlock.WithTTL(p.TTL),
		redlock.WithNodeTimeout(p.NodeTimeout),
		redlock.WithRetryDelay(p.RetryMin, p.RetryMax),
		redlock.WithFencing(client >= len(p.NoFence) || !p.NoFence[client]),
		redlock.WithWakeUp(q),
	}
	if co := p.Cohort; co != nil {
		opts = append(opts, co.option())
	}
	return opts
}

// Duration is how long a run lasts in fake time.
func (p Plan) Duration() time.Duration { return p.FaultPhase + p.Settle + p.Quiet }

// Healed is when every fault has been undone and the settling is over:
// the liveness bound holds from then on.
func (p Plan) Healed() time.Duration { return p.FaultPhase + p.Settle }

// Reservation is the reservation of a handoff at the plan's options (see
// redlock's WithWakeUp): two node timeouts, or two retry delays and a node
// timeout when that is more, at most TTL/2.
func (p Plan) Reservation() time.Duration {
	return min(max(2*p.NodeTimeout, 2*p.RetryMax+p.NodeTimeout), p.TTL/2)
}

// WaitBound is the liveness bound: once faults stopped, a resource with a
// waiter whose ctx is live is never without a holder for longer than this:
// one reservation (a handoff to a waiter frozen or gone), a retry delay
// (a waiter that polls), and two node timeouts (a round that times out,
// the settling of a split), and a quarter of that again. Fake time is
// exact, so the slack covers no machine load.
func (p Plan) WaitBound() time.Duration {
	return 5 * (p.Reservation() + p.RetryMax + 2*p.NodeTimeout) / 4
}

// String is the plan in one line, for a failure's report.
func (p Plan) String() string {
	var fs []string
	for _, f := range p.Faults {
		fs = append(fs, f.String())
	}
	s := fmt.Sprintf("seed %d: %d nodes, %d clients x %d workers, %d resources, queue %v, frozen waiter %v, faults [%s], drift %.4f",
		p.Seed, p.Nodes, p.Clients, p.Workers, p.Resources, p.Queue, p.FrozenWaiter, strings.Join(fs, ", "), p.Drift)
	if p.LongHold != nil {
		s += ", " + p.LongHold.String()
	}
	if p.Cohort != nil {
		s += ", " + p.Cohort.String()
	}
	if p.DetachLag > 0 {
		s += fmt.Sprintf(", extend across detach %v", p.DetachLag)
	}
	if p.YieldHold > 0 {
		s += fmt.Sprintf(", yields held %v", p.YieldHold)
	}
	if p.TieBursts > 0 {
		s += fmt.Sprintf(", %d bursts of equal tickets", p.TieBursts)
	}
	if fd := p.FenceDrop; fd != nil {
		s += fmt.Sprintf(", c%d's fence commits to %v lost", fd.Client, fd.Nodes)
	}
	if p.YieldKeep {
		s += ", yield episode"
	}
	if hs := p.Handoff; hs != nil {
		s += fmt.Sprintf(", handoff episode: c%d holds, c%d waits slowed to %v", hs.Holder, hs.Waiter, hs.Slow)
	}
	if q := p.QuietLag; q != nil {
		s += ", " + q.String()
	}
	if p.SlowTime > 0 {
		way := "replies"
		if p.SlowTimeUp {
			way = "requests"
		}
		s += fmt.Sprintf(", TIME %s slowed %v", way, p.SlowTime)
		if p.SlowTimeVaries {
			s += " at most"
		}
	}
	if p.MsgDelay > 0 {
		s += fmt.Sprintf(", c%d's messages slowed %v", p.MsgClient, p.MsgDelay)
	}
	if p.CloseAt > 0 {
		s += fmt.Sprintf(", c%d closes %v after the settling", p.CloseClient, p.CloseAt)
	}
	if p.DetachRace {
		s += ", detach race"
	}
	if p.ResumePause {
		s += ", majority paused in Resume's re-arm"
	}
	if p.GrantExpired {
		call := "TryLock"
		if p.GXLock {
			call = "Lock"
		}
		s += fmt.Sprintf(", c%d's %s starved past its grant's validity %v after a TTL before the settling's end", p.GXClient, call, p.GXAt)
	}
	if p.SemK > 0 {
		s += fmt.Sprintf(", K=%d", p.SemK)
	}
	if p.SubClose {
		s += fmt.Sprintf(", a Client closes in its first SUBSCRIBE %v after the settling", p.SubCloseAt)
	}
	if p.LateHandoff {
		s += fmt.Sprintf(", a handoff late in a round %v after the settling", p.LHAt)
	}
	if p.GuardEpisode != nil {
		s += ", " + p.GuardEpisode.String()
	}
	return s
}

// Wipes reports whether a node of the plan restarts empty.
func (p Plan) Wipes() bool {
	for _, f := range p.Faults {
		if f.Kind == NodeWipe {
			return true
		}
	}
	return false
}
