package sim

import (
	"context"
	"fmt"
	"time"
)

// The subscribe-close episode (Plan.SubClose; issue 42, fifth session):
// a Client of its own, whose every link lags SubLag each way, starts an
// RLock — a read-write call joins the wake-ups at its first attempt, so
// the Client subscribes its channel on every node at once (redlock
// wake.go join) — and is closed a quarter of a round trip later, while
// each node's subscription is still in its first SUBSCRIBE (the dial's
// HELLO is on its way). go-redis holds the PubSub's mutex across that
// dial and handshake: a Close that queues a PubSub.Close on it leaves a
// goroutine waiting on a mutex, which stops the bubble's fake clock, so
// the lagged HELLO reply (a timer) never comes and the seed never ends
// (hang, reported after -sim.hang). 293e34a's fix leaves such a
// subscription to its reader, which closes it once the SUBSCRIBE
// returned; the mutant sub-close-while-subscribing restores the old
// path. Seed 316 reached it by chance beside the race suite (a Close
// within the 0.4 ms a SUBSCRIBE's handshake takes at the base latency);
// the lag widens that window to most of a node timeout.
//
// The lag (0.1 node timeout each way) is no cut: the dial's HELLO and the
// SUBSCRIBE take two round trips, 0.4 node timeouts. Close must return
// within the node timeout and a second (close), as the mid-run Close's.

// subLag is the episode's lag each way, in node timeouts.
const subLag = 0.1

// subClose runs the episode on client c (the extra Client of the run).
func (e *Env) subClose(c int) {
	pl := e.Plan
	if !e.SleepUntil(e.At(pl.Healed() + pl.SubCloseAt)) {
		return
	}
	h := e.History
	n := e.cl.net
	lag := time.Duration(subLag * float64(pl.NodeTimeout))
	for i := range pl.Nodes {
		n.setDelay(c, i, lag)
	}
	rc := e.Clients[c]
	ctx, cancel := context.WithTimeout(e.ctx, pl.NodeTimeout)
	defer cancel()
	done := make(chan error, 1)
	e.Go(func() {
		l, err := rc.RLock(ctx, "subclose")
		if err == nil {
			err = fmt.Errorf("granted %s", l.Token())
		}
		done <- err
	})
	time.Sleep(lag / 2)
	h.Note("c%d closes while subscribing (subscribe-close episode)", c)
	start := time.Now()
	_ = rc.Close()
	if d := time.Since(start); d > pl.NodeTimeout+time.Second {
		h.Violate("close", "client %d: Close (while subscribing) took %v", c, d)
	}
	e.res.closedAt(c)
	err := <-done
	for i := range pl.Nodes {
		n.setDelay(c, i, 0)
	}
	h.Note("c%d closed (subscribe-close episode); its RLock: %v", c, err)
}
