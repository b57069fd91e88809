package sim

import (
	"context"
	"slices"
	"sync/atomic"
	"time"

	"github.com/quorumlock/quorumlock/internal/scripts"
	"github.com/quorumlock/quorumlock/redlock"
)

// The margin check (issue 42, fifth session: extend-margin-no-pending
// survived because no invariant read the hooks' reports). Every Client of
// a run carries observer hooks; for each successful extension round (a
// renewal or an Extend) of a lock profile resource, reported in the quiet
// phase with no fault of any kind under way in the two node timeouts
// before, the hook reads every node directly and counts the nodes that
// cannot have failed or refused that round: the node did not fail it
// (not in NodeErrors), and the resource's key there holds the token of a
// hold of that Client on that resource whose Unlock has not returned,
// with no release guard of that token. The round's reported margin
// (ExtendInfo.Margin) must be at least that count less the quorum: such a
// node confirmed the round or was not waited for.
//
// Why those nodes only (the first try of issue 42's fourth session read
// the keys alone and had false alarms in 150 seeds): a node refuses a
// renewal while its key is ours when our release landed first (its guard
// is then there, and lasts longer than the round) or when the request
// lands past its not-after bound (late: only over a link slower than the
// node timeout, which is a fault). A failed round (validity ran out
// after a majority confirmed) may report any margin, and is not checked.
// Keys read after the decision can only have fewer of ours (a release
// landed since), so the count never exceeds what the round saw.

// The decided check (issue 42, fifth session: inflight-decide-no-validity
// survived because nothing checked a round's outcome against the votes it
// could still have had). An acquisition round stops early only once a
// majority granted, or once a majority became impossible (quorum.Majority),
// or, queued, once its grants and the handoffs to it make a majority with
// validity enough to use (then it is acquired). So an attempt that failed
// (not_obtained, no_quorum) while its ctx was live and before its round's
// deadline (Latency under the node timeout) had a majority out of reach
// when it was decided: fewer than a quorum granted, and its grants and the
// nodes still pending fall short of one too (the nodes it did not wait for
// could not have made a majority). Lock profile resources only, the
// report's tally being the round's plain votes there (a fenced round
// whose commit failed reports a majority granted: not checked).

// checkDecided is the decided check of one attempt's report.
func (o observer) checkDecided(ctx context.Context, i redlock.AttemptInfo) {
	env := o.env
	if env.res == nil || ctx.Err() != nil || i.Handoff {
		return
	}
	if i.Outcome != redlock.OutcomeNotObtained && i.Outcome != redlock.OutcomeNoQuorum {
		return
	}
	if decidedLies.Load() {
		i.Pending = i.Nodes - i.Granted
	}
	if i.Latency >= env.Plan.NodeTimeout || i.Granted >= i.Quorum || i.Granted+i.Pending < i.Quorum {
		return
	}
	env.res.mu.Lock()
	sampled := env.res.sampled[redlock.DefaultKeyPrefix+i.Resource]
	env.res.mu.Unlock()
	if !sampled && i.Resource != lhResource {
		return
	}
	env.History.Violate("decided", "c%d's attempt of %s (call %d) ended %s after %v with %d granted and %d pending of %d nodes (quorum %d): a majority was still possible",
		o.c, i.Resource, i.Call, i.Outcome, i.Latency, i.Granted, i.Pending, i.Nodes, i.Quorum)
}

// marginLies is the margin check's negative control (controls_test.go):
// the observer takes the margin of a report as Confirmed − Quorum (the
// nodes not waited for left out), as a dishonest report would give it.
var marginLies atomic.Bool

// decidedLies is the decided check's negative control: the observer takes
// every node that did not grant an attempt as still pending when it was
// decided, as a report of a round that stopped at its first refusals
// would give it.
var decidedLies atomic.Bool

// observer is the hooks every Client of a run carries: the margin and
// decided checks, over the tracer with Plan.Trace (else NoHooks), which
// gets every report first.
type observer struct {
	redlock.Hooks
	env *Env
	c   int
}

func (o observer) Attempt(ctx context.Context, i redlock.AttemptInfo) {
	o.Hooks.Attempt(ctx, i)
	o.checkDecided(ctx, i)
	if lh := o.env.lh; lh != nil {
		lh.noteAttempt(o.c, i)
	}
}

func (o observer) Extend(ctx context.Context, i redlock.ExtendInfo) {
	o.Hooks.Extend(ctx, i)
	o.checkMargin(i)
}

// checkMargin is the margin check of one extension round's report.
func (o observer) checkMargin(i redlock.ExtendInfo) {
	env := o.env
	pl := env.Plan
	key := redlock.DefaultKeyPrefix + i.Resource
	now := time.Now()
	if i.Err != nil || now.Before(env.At(pl.Healed())) || env.res == nil {
		return
	}
	env.res.mu.Lock()
	sampled := env.res.sampled[key]
	env.res.mu.Unlock()
	if !sampled || env.faults.any(now.Add(-2*pl.NodeTimeout), now) {
		return
	}
	h := env.History
	h.mu.Lock()
	var live []string
	for _, x := range h.holds {
		if x.Client == o.c && x.Resource == i.Resource && x.Released.IsZero() && x.Token != "" {
			live = append(live, x.Token)
		}
	}
	h.mu.Unlock()
	if len(live) == 0 {
		return
	}
	ours := 0
	for n := range pl.Nodes {
		if slices.ContainsFunc(i.NodeErrors, func(e *redlock.NodeError) bool { return e.Node == n }) {
			continue
		}
		m := env.cl.node(n)
		if m == nil {
			continue
		}
		env.cl.tick(n, m)
		v, err := m.Get(key)
		if err != nil || !slices.Contains(live, v) || m.Exists(key+scripts.GuardSuffix+v) {
			continue
		}
		ours++
	}
	margin := i.Margin()
	if marginLies.Load() {
		margin = i.Confirmed - i.Quorum
	}
	if margin < ours-i.Quorum {
		h.Violate("margin", "c%d's extension of %s (lock %d, renewal %v): margin %d reported (%d confirmed, %d pending, quorum %d, %d node errors), but %d nodes hold its key with no guard and did not fail it: at least %d",
			o.c, i.Resource, i.Lock, i.Renewal, margin, i.Confirmed, i.Pending, i.Quorum, len(i.NodeErrors), ours, ours-i.Quorum)
	}
}
