package node

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quorumlock/quorumlock/quorum"
)

// Ledger is the registry of one lock token's requests that may still land
// on a node (DESIGN step 4). One rule, kept here and nowhere else: a round
// is registered — its start, hence its deadline and every request's
// not-after bound, fixed — before any point where it can be delayed (a
// goroutine switch, a queue, a retry). Register does that; Send sends the
// round from the start fixed there. So a round registered before a release
// has its deadline at most a node timeout after the release, however late
// its goroutine gets to send it, and the release's guard covers it
// (Unanswered); a round that would come after the release must not be
// registered, which the ledger's owner (the Lock) ensures by registering
// under its own mutex in one step with the check that it may send.
//
// Make one with NewLedger: a Ledger must know its nodes, or a round that
// settled without an answer from a node could be dropped without the node
// being remembered as unsure.
type Ledger struct {
	n      int
	mu     sync.Mutex // protects rounds, unsure
	rounds []Inflight // rounds with requests maybe still in flight
	unsure []bool     // per node (nil: none): a request there went unanswered
}

// NewLedger returns the registry of one token's requests to n nodes.
func NewLedger(n int) *Ledger { return &Ledger{n: n} }

// Inflight is a round of requests of one token, seen by its release: where
// a node has not answered it, a request may still land after the release.
type Inflight interface {
	Answered(i int) bool // node i's reply is in, or its request provably never left (see Answered)
	Settled() bool       // every node has answered or given up
}

// Pending is a registered round: unanswered everywhere until Send (or
// Attach) gives it its requests. Start is write-once, before the round is
// visible to anyone.
type Pending struct {
	Start time.Time
	r     Inflight    // written once by Attach, before attached is set
	sent  atomic.Bool // r is set
}

// Register registers a round of the token that starts now, before anything
// of it is sent. Call it in one step with the check that the token may
// still send (see Ledger).
func (g *Ledger) Register() *Pending {
	p := &Pending{Start: time.Now()}
	g.Track(p)
	return p
}

// Attach gives p its requests.
func (p *Pending) Attach(r Inflight) {
	p.r = r
	p.sent.Store(true) // publishes r (sync/atomic orders the write before it)
}

// round returns the attached round, or nil before Attach.
func (p *Pending) round() Inflight {
	if !p.sent.Load() {
		return nil
	}
	return p.r
}

// Answered reports whether node i has answered p's round.
func (p *Pending) Answered(i int) bool {
	r := p.round()
	return r != nil && r.Answered(i)
}

// Settled reports whether every node has answered p's round or given up.
func (p *Pending) Settled() bool {
	r := p.round()
	return r != nil && r.Settled()
}

// Send sends the registered round p to n nodes, from the start fixed at
// registration: its requests' deadline is p.Start plus timeout, or ctx's
// earlier deadline, however late this goroutine runs (quorum.StartAt).
func Send[T any](ctx context.Context, p *Pending, n int, timeout time.Duration, sp quorum.Spawner, fn func(ctx context.Context, i int) (T, error)) *quorum.Round[T] {
	r := quorum.StartAt(ctx, p.Start, n, timeout, sp, fn)
	p.Attach(RoundOf(r))
	return r
}

// RoundOf is a round as the ledger sees it.
func RoundOf[T any](r *quorum.Round[T]) Inflight { return round[T]{r} }

type round[T any] struct{ r *quorum.Round[T] }

func (p round[T]) Answered(i int) bool {
	rep, ok := p.r.Reply(i)
	return ok && Answered(rep.Err)
}

func (p round[T]) Settled() bool { return p.r.Settled() }

func (p round[T]) waitUntil(deadline time.Time) {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	for i := range p.r.N() {
		select {
		case <-p.r.Done(i):
		case <-t.C:
			return
		}
	}
}

// Track records a round until all its requests have answered or given up;
// a node that gave up on one is remembered as unsure for good (its request
// may land at any later time).
func (g *Ledger) Track(r Inflight) {
	g.mu.Lock()
	defer g.mu.Unlock()
	keep := g.rounds[:0]
	for _, old := range g.rounds {
		if !old.Settled() {
			keep = append(keep, old)
			continue
		}
		for i := range g.n {
			if !old.Answered(i) {
				g.markUnsureLocked(i)
			}
		}
	}
	clear(g.rounds[len(keep):])
	g.rounds = append(keep, r)
}

// MarkUnsure remembers for good that a request of the token to node i went
// unanswered.
func (g *Ledger) MarkUnsure(i int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.markUnsureLocked(i)
}

func (g *Ledger) markUnsureLocked(i int) {
	if g.unsure == nil {
		g.unsure = make([]bool, g.n)
	}
	g.unsure[i] = true
}

// Unanswered reports whether a request of the token may still land on node
// i: one went unanswered there, or a registered round has not had node i's
// answer yet (or was not sent yet).
func (g *Ledger) Unanswered(i int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.unsure != nil && g.unsure[i] {
		return true
	}
	for _, r := range g.rounds {
		if !r.Answered(i) {
			return true
		}
	}
	return false
}

// WaitSent waits until every registered round has been sent and has
// settled, or has passed its deadline (its start plus timeout). Rounds
// registered from now on are not waited for.
func (g *Ledger) WaitSent(timeout time.Duration) {
	g.mu.Lock()
	rounds := append([]Inflight(nil), g.rounds...)
	g.mu.Unlock()
	for _, r := range rounds {
		p, ok := r.(*Pending)
		if !ok {
			continue
		}
		deadline := p.Start.Add(timeout)
		// Its sender attaches it without blocking: wait for that, but
		// never past the round's deadline (a sender that never sends
		// sends nothing that can land).
		for p.round() == nil && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if w, ok := p.round().(interface{ waitUntil(time.Time) }); ok {
			w.waitUntil(deadline)
		}
	}
}
