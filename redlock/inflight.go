package redlock

import (
	"slices"
	"time"

	"github.com/quorumlock/quorumlock/quorum"
)

// inFlight lets a queued attempt in flight count a key handed to it (step
// 9) by a node that refused its request: without it, an attempt granted on
// one node of three, refused on a second and waiting for a paused third
// waited the whole node timeout, although the release of the holder had
// made the second ours meanwhile (issue 44: a 1.9s handover).
//
// Only a handoff whose message names this attempt counts: the release
// served the entry this attempt's request (refused there) queued or
// refreshed, so it set the key after the round's start, for the
// reservation; a message naming an earlier attempt may be older than the
// refusal. Not with fencing (its counters come with a round) nor a fixed
// lease (no renewal extends the reservation), like handedTo.
type inFlight struct {
	q       *waiting
	l       *Lock
	attempt int64
	before  []int64   // the handoffs recorded before the round (rewake)
	woken   bool      // a wake-up was pending when the round began
	start   time.Time // the round's start, set before it is collected
	until   time.Time // set by decide when grants and handoffs settled it
}

// wake is the channel that tells of handoffs.
func (h *inFlight) wake() <-chan struct{} { return h.q.w.c }

// handed returns, per node, whether t refused it and a release handed the
// key to this attempt there since.
func (h *inFlight) handed(t quorum.Tally) []bool {
	att := h.q.w.handedAttempts(h.l.token)
	if att == nil {
		return nil
	}
	var on []bool
	for i, a := range att {
		if a == h.attempt && i < len(t.Votes) && t.Votes[i] == quorum.No {
			if on == nil {
				on = make([]bool, len(att))
			}
			on[i] = true
		}
	}
	return on
}

// decide is quorum.Majority, settled also by grants and handoffs that
// make a majority together with validity enough to use (the test the
// outcome applies, so the round never stops early on a majority it then
// refuses: a slow node that would have granted is still waited for).
func (h *inFlight) decide(t quorum.Tally) bool {
	if quorum.Majority(t) {
		return true
	}
	until, ok := h.validity(t, h.start)
	if ok {
		h.until = until
	}
	return ok
}

// granted returns t with the nodes handed to this attempt counted as
// granted, which is what they are: hooks and metrics see a majority
// (and a margin >= 0) for an attempt that succeeded that way.
func (h *inFlight) granted(t quorum.Tally) quorum.Tally {
	on := h.handed(t)
	t.Votes, t.Errs = slices.Clone(t.Votes), slices.Clone(t.Errs)
	for i, yes := range on {
		if yes {
			t.Record(i, quorum.Yes, nil)
		}
	}
	return t
}

// validity says whether the grants of t and the handoffs to this attempt
// make a majority, and until when it holds: the q-th latest of the nodes'
// deadlines, measured from the round's start (before its first request) —
// the TTL where a node granted, the reservation where one handed the key
// over after refusing — less the drift allowance (steps 3 and 9). A
// majority with less validity left than handoffMin does not count (no
// time for the first renewal): the attempt fails as it would have.
func (h *inFlight) validity(t quorum.Tally, start time.Time) (time.Time, bool) {
	if t.Quorum() {
		return time.Time{}, false // the usual path decides
	}
	cfg := h.l.cfg
	var ds []time.Time
	for i, on := range h.handed(t) {
		if on {
			ds = append(ds, quorum.Deadline(start, cfg.reservation(), cfg.drift))
		} else if t.Votes[i] == quorum.Yes {
			ds = append(ds, quorum.Deadline(start, cfg.ttl, cfg.drift))
		}
	}
	if len(ds) < h.q.c.quorum {
		return time.Time{}, false
	}
	slices.SortFunc(ds, func(a, b time.Time) int { return b.Compare(a) })
	until := ds[h.q.c.quorum-1]
	if time.Until(until) < cfg.handoffMin() {
		return time.Time{}, false
	}
	return until, true
}

// rewake gives back a wake-up the round may have taken, so that the wait
// after a failed attempt still sees it (handedTo tells what it means):
// only when one was pending before it or a handoff was recorded during
// it, or every attempt after a first handoff would be made at once.
func (h *inFlight) rewake() {
	if !h.woken && slices.Equal(h.before, h.q.w.handedAttempts(h.l.token)) {
		return
	}
	select {
	case h.q.w.c <- struct{}{}:
	default:
	}
}
