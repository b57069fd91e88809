package sim

import (
	"fmt"
	"math/rand/v2"
	"time"
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
