package sim

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"time"

	"github.com/quorumlock/quorumlock/redlock"
)

// Cohort is the local-handoff workload (redlock's cohort.go, issue 41):
// every Client runs several goroutines on one resource, so that Unlock
// passes the lease between a Client's goroutines without a round trip,
// and half the Clients without fencing (fencing turns local handoff off),
// under the plan's faults and invariants (exclusion, fencing, no key
// back, liveness). Its budget is drawn small enough to run out within a
// run: the lease then goes back through the nodes.
type Cohort struct {
	Handoffs int           // WithLocalHandoff's count
	Within   time.Duration // and time budget
}

// String is the workload in a plan's line.
func (co *Cohort) String() string {
	return fmt.Sprintf("cohort: local handoff %d times within %v", co.Handoffs, co.Within)
}

// drawCohort draws the workload in one seed of three: three or four
// workers per Client, one resource, fencing off on every Client but the
// first.
func (p *Plan) drawCohort(r *rand.Rand) {
	if r.IntN(3) != 0 {
		return
	}
	p.Workers = 3 + r.IntN(2)
	p.Resources = 1
	for i := range p.NoFence {
		p.NoFence[i] = i > 0
	}
	p.Cohort = &Cohort{Handoffs: 1 + r.IntN(8), Within: time.Duration(1+r.IntN(50)) * time.Millisecond}
}

// cohortBudgetHidden is the cohort-budget-hidden control's seam: the
// Clients pass leases on with a budget far above the one the plan states
// (and checkCohort checks), as a library that ignored its budget would.
var cohortBudgetHidden atomic.Bool

// option is the Clients' WithLocalHandoff.
func (co *Cohort) option() redlock.Option {
	if cohortBudgetHidden.Load() {
		return redlock.WithLocalHandoff(1<<20, time.Hour)
	}
	return redlock.WithLocalHandoff(co.Handoffs, co.Within)
}

// oldHandle checks a handle whose Unlock returned nil, by a local handoff
// or not (old-handle): it is no longer held, so Valid reports false, the
// Client's Held does not list it, and Extend returns ErrNotHeld without
// I/O (ErrClosed once the Client closed; ErrLockLost for a lock lost
// before its Unlock, as Extend after loss does — seed 479 under load), as
// redlock's Unlock and Extend say.
func oldHandle(env *Env, c int, rc *redlock.Client, x *Hold, l *redlock.Lock) {
	h := env.History
	if l.Valid() {
		h.Violate("old-handle", "c%d hold %d (%s %s): Valid() true after its Unlock returned nil", c, x.ID, x.Op, x.Resource)
	}
	if slices.Contains(rc.Held(), l) {
		h.Violate("old-handle", "c%d hold %d (%s %s): Held lists it after its Unlock returned nil", c, x.ID, x.Op, x.Resource)
	}
	lost := false // lost before its Unlock: Extend after loss says so (ErrLockLost, redlock's Extend)
	select {
	case <-l.Lost():
		lost = true
	default:
	}
	if err := l.Extend(env.ctx); !errors.Is(err, redlock.ErrNotHeld) && !errors.Is(err, redlock.ErrClosed) && !(lost && errors.Is(err, redlock.ErrLockLost)) {
		h.Violate("old-handle", "c%d hold %d (%s %s): Extend after its Unlock returned nil returned %v, want ErrNotHeld", c, x.ID, x.Op, x.Resource, err)
	}
}

// checkCohort checks the budget's bound on every lease of the run
// (cohort-budget): a lease is passed between a Client's goroutines at
// most Handoffs times, and only within Within of its grant on the nodes,
// so the holds of one lease (one Client, one token: a local handoff keeps
// the token) number at most Handoffs+1, and each one after the first
// starts within Within of the first's start (the grant is before it; a
// handoff returns the waiter's Lock at the Unlock's fake-time instant,
// cohortSlack covers the scheduling). It is the per-Client part of the
// stated fairness bound: a Client's lease holds another Client's waiter
// queued on the nodes up by at most Within, one hold and one release.
// A Do's holds carry no token and are not counted (a lease passed to or
// from a Do is checked in part). h.mu must be held.
func (h *History) checkCohort(co *Cohort) {
	type key struct {
		client int
		token  string
	}
	leases := make(map[key][]*Hold)
	for _, x := range h.holds {
		if x.Token != "" {
			k := key{x.Client, x.Token}
			leases[k] = append(leases[k], x)
		}
	}
	for k, xs := range leases {
		if len(xs) < 2 {
			continue
		}
		slices.SortFunc(xs, func(a, b *Hold) int { return a.Start.Compare(b.Start) })
		first := xs[0]
		if len(xs) > co.Handoffs+1 {
			h.viol = append(h.viol, Violation{"cohort-budget", h.since(xs[co.Handoffs+1].Start), fmt.Sprintf("%s: c%d's lease of hold %d (from %v) held %d times, more than %d local handoffs allow",
				first.Resource, k.client, first.ID, h.since(first.Start), len(xs), co.Handoffs)})
			continue
		}
		for _, x := range xs[1:] {
			if x.Start.Sub(first.Start) > co.Within+cohortSlack {
				h.viol = append(h.viol, Violation{"cohort-budget", h.since(x.Start), fmt.Sprintf("%s: c%d's lease of hold %d (from %v) passed to hold %d at %v, past the budget of %v",
					first.Resource, k.client, first.ID, h.since(first.Start), x.ID, h.since(x.Start), co.Within)})
				break
			}
		}
	}
}

// cohortSlack is checkCohort's allowance over the time budget.
const cohortSlack = 5 * time.Millisecond
