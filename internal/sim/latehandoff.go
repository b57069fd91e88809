package sim

import (
	"context"
	"sync"
	"time"

	"github.com/quorumlock/quorumlock/redlock"
)

// The late-handoff episode (Plan.LateHandoff; issue 42, fifth session:
// inflight-decide-no-validity survived, no plan lined its path up). Two
// Clients of their own, a holder A and a queued waiter B, on a resource
// of their own (lhResource), quorum Q of N nodes:
//
//   - B warms up (a TryLock of another resource: its connections dialled
//     and its clocks probed), then A takes the lock, and A's key is
//     evicted from the nodes 0..Q-2 (not a fault: a minority lost it), so
//     that B's grants there and a handoff on node Q-1 make a majority;
//   - B's links to the nodes Q..N-1 lag 0.4 NT each way (a round trip of
//     0.8 NT over its warm connections; recorded as a link delay, since a
//     new connection through it is cut);
//   - B calls Lock with a retry delay of 10-40 ms, so that its
//     reservation is two node timeouts (200 ms; the plan's 460 ms cannot
//     be reached within a round). Its first attempt is refused by A's
//     keys, and it subscribes and queues with the next one, made at once;
//   - 0.6 NT after the first attempt's report A unlocks: its release on
//     node Q-1 hands the key to B's queued attempt about half a node
//     timeout into its round, while the lagged nodes have not answered.
//
// B's grants and that handoff then make a majority whose validity (the
// reservation from the round's start, less the drift allowance) is
// shorter than handoffMin (1.5 NT): the attempt must not stop there, but
// wait for the lagged nodes (which refuse: A's keys were still there when
// they landed), and fail with nothing pending; its next attempt finds the
// handed keys its own. An attempt that stopped at that majority reports a
// failure with a majority still within reach (decided).
const lhResource = "late-handoff"

// lateHandoff is the episode's state (Env.lh).
type lateHandoff struct {
	a, b  int           // the holder's and the waiter's Client
	first chan struct{} // closed at B's first attempt's report
	once  sync.Once
}

// noteAttempt is called with every attempt report of client c.
func (lh *lateHandoff) noteAttempt(c int, i redlock.AttemptInfo) {
	if c == lh.b && i.Resource == lhResource {
		lh.once.Do(func() { close(lh.first) })
	}
}

// lateHandoff runs the episode.
func (e *Env) lateHandoff() {
	pl, lh, h, n := e.Plan, e.lh, e.History, e.cl.net
	if !e.SleepUntil(e.At(pl.Healed() + pl.LHAt)) {
		return
	}
	ca, cb := e.Clients[lh.a], e.Clients[lh.b]
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Second)
	defer cancel()
	if w, err := cb.TryLock(ctx, lhResource+"-warm"); err == nil {
		_ = w.Unlock(ctx)
	}
	la, err := ca.TryLock(ctx, lhResource)
	if err != nil {
		h.Note("late handoff: A's TryLock: %v", err)
		return
	}
	q := pl.Nodes/2 + 1
	key := redlock.DefaultKeyPrefix + lhResource
	for i := range q - 1 {
		if m := e.cl.node(i); m != nil {
			e.cl.tick(i, m)
			m.Del(key)
		}
	}
	lag := 4 * pl.NodeTimeout / 10
	from := time.Now()
	for i := q; i < pl.Nodes; i++ {
		n.setDelay(lh.b, i, lag)
		e.faults.add(Fault{Kind: LinkDelay, Client: lh.b, Node: i}, from, from.Add(2*time.Second))
	}
	h.Note("late handoff: c%d holds %s, evicted on n0..n%d; c%d's links to n%d.. lag %v", lh.a, lhResource, q-2, lh.b, q, lag)
	done := make(chan struct{})
	e.Go(func() {
		defer close(done)
		// Unfenced: a fenced attempt is not counted by the keys handed to
		// it while in flight (redlock/waiting.go: its fence needs a round).
		l, err := cb.Lock(ctx, lhResource, redlock.WithRetryDelay(10*time.Millisecond, 40*time.Millisecond), redlock.WithFencing(false))
		h.Note("late handoff: c%d's Lock: %v", lh.b, err)
		if err == nil {
			_ = l.Unlock(context.WithoutCancel(ctx))
		}
	})
	select {
	case <-lh.first:
		time.Sleep(6 * pl.NodeTimeout / 10)
	case <-done:
	}
	_ = la.Unlock(context.WithoutCancel(ctx))
	h.Note("late handoff: c%d unlocked", lh.a)
	<-done
	for i := q; i < pl.Nodes; i++ {
		n.setDelay(lh.b, i, 0)
	}
}
