package redlock

import (
	"context"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/node"
	"github.com/quorumlock/quorumlock/internal/scripts"
	"github.com/quorumlock/quorumlock/internal/testhooks"
	"github.com/quorumlock/quorumlock/quorum"
)

// splitPause is a random pause of up to 3ms: long enough to order the
// attempts of waiters on one host (a local round trip is ~0.1ms), short
// against any retry delay.
func splitPause() time.Duration { return rand.N(3 * time.Millisecond) }

// final returns t, the tally of l's last attempt at its decision, with the
// votes of the nodes that had not answered then: it waits for them, each
// until the attempt's node timeout at most (its round's deadline), or
// Close. An attempt decided early by refusals (a majority impossible)
// leaves grants that answer after the decision; giveBack gives those back
// too. Without it they stayed until the next attempt of the call (a retry
// delay later) or, if it never came, the TTL: with 8 instances polling one
// resource, the keys of such late grants on two nodes kept every other
// caller from a majority for up to 0.5s at a time, about a third of the
// run (redsync waits for every node before it decides, and has no such
// gap).
func (c *Client) final(l *Lock, r *quorum.Round[reply], t quorum.Tally) quorum.Tally {
	if r == nil || t.Votes == nil || t.Pending == 0 || len(t.Votes) != r.N() {
		return t
	}
	tm := time.NewTimer(time.Until(r.Started().Add(l.cfg.nodeTimeout)))
	defer tm.Stop()
	t.Votes, t.Errs = slices.Clone(t.Votes), slices.Clone(t.Errs) // the round's arrays are its own
wait:
	for i, v := range t.Votes {
		if v != quorum.Pending {
			continue
		}
		select {
		case <-r.Done(i):
		case <-tm.C:
			break wait // the rest are late: the next attempt carries the same token
		case <-c.closing:
			break wait
		}
		rep, ok := r.Reply(i)
		if !ok {
			continue
		}
		vote, err := classify(i, rep)
		t.Record(i, vote, err)
	}
	return t
}

// giveBack is what a failed attempt leaves between two attempts of a Lock
// call. The nodes that granted keep our key or pass it on: a queued call
// yields each to a waiter queued there before it (who is told), so that split
// votes settle toward the first in the order (ticket, member); a call not
// queued gives them back.
// Requests of ours still unanswered may grant later; that is harmless, as
// the next attempt carries the same token. giveBack waits for its requests,
// each bounded by the node timeout, and reports whether every one
// answered: if not, a late one could still hand over a key that our next
// attempt counts, so the caller must go on with a fresh token.
func (q *waiting) giveBack(ctx context.Context, l *Lock, t quorum.Tally) bool {
	c := q.c
	if t.Yes == 0 {
		return true // granted nowhere: nothing to give back
	}
	yield := l.waiter.Member != ""
	if yield {
		q.yielded = true
	}
	// One registered round (rounds.go), like every request of the lock: a
	// later release leaves the guard where a yield is unanswered, and a
	// yield carries its not-after bound, so one that lands after that guard
	// is gone changes nothing (it would queue a finished token again).
	granted := func(_ context.Context, i int) (bool, error) { return t.Votes[i] == quorum.Yes, nil } // else nothing of ours there to give back
	r, _ := node.Run(ctx, l.tok, node.Op{Name: "release", Release: true, Bound: yield, Only: granted}, func(ctx context.Context, i int, s redis.Scripter, notAfter *int64) (scripts.Released, error) {
		if !yield {
			return l.releaseScript(ctx, i, s, 0, false)
		}
		b := *notAfter
		if testhooks.YieldUnbounded.Load() {
			b = 0 // a negative control: a yield without its bound
		}
		return scripts.Yield(ctx, s, l.keys[i], l.token, l.waiter, c.wakeArgs, b)
	})
	// Waited for in full, whatever the caller's ctx: each is bounded by the
	// node timeout.
	r.Collect(context.WithoutCancel(ctx), func(_ int, rep quorum.Reply[scripts.Released]) (quorum.Vote, error) {
		return quorum.Yes, rep.Err
	}, quorum.All)
	for i := range c.nodes {
		if rep, ok := r.Reply(i); !ok || !node.Answered(rep.Err) {
			return false
		}
	}
	return true
}

// jitter is the fallback delay between two attempts of Lock: uniform in
// [min, max). It is a backoff.BackOff that never stops; ctx and the retry
// count end the loop.
type jitter struct{ min, max time.Duration }

func (j jitter) NextBackOff() time.Duration {
	if j.max <= j.min {
		return j.min
	}
	return j.min + rand.N(j.max-j.min)
}

func (j jitter) Reset() {}
