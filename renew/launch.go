package renew

import (
	"container/heap"
	"context"
	"errors"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/quorumlock/quorumlock/internal/testhooks"
)

type result struct {
	h     *Handle
	start time.Time
	err   error
}

// retryBackOff is the schedule of retries after a failed renewal: it starts
// at a tenth of the interval (10ms to 100ms), grows 1.5× with ±50% jitter,
// and never waits longer than half an interval. It never gives up by itself:
// the deadline ends the retries.
func retryBackOff(interval time.Duration) *backoff.ExponentialBackOff {
	first := min(max(interval/10, 10*time.Millisecond), 100*time.Millisecond, interval/2)
	return backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(first),
		backoff.WithMaxInterval(max(interval/2, first)),
		backoff.WithRandomizationFactor(0.5),
		backoff.WithMultiplier(1.5),
		backoff.WithMaxElapsedTime(0),
	)
}

func (s *Scheduler) fireDue(now time.Time) {
	// Renewals due up to the window ahead go out now, together; deadlines
	// are never anticipated nor postponed.
	horizon := now.Add(s.window)
	var due, keep []*Handle
	for len(s.h) > 0 && !s.h[0].at.After(horizon) {
		h := heap.Pop(&s.h).(*Handle)
		h.mu.Lock()
		stopped := h.stopped
		h.mu.Unlock()
		if stopped {
			continue
		}
		// Step 7: the deadline. ValidUntil is read afresh, since a manual
		// Extend may have moved it since this event was armed.
		if !now.Before(h.t.ValidUntil()) && !testhooks.DeadlineUnwatched.Load() {
			s.lose(h, errors.Join(ErrExpired, h.lastErr))
			continue
		}
		if h.opts.AutoRenew && !h.inflight && !horizon.Before(h.renewAt) {
			due = append(due, h)
			h.inflight = true
		}
		keep = append(keep, h)
	}
	for _, h := range keep {
		h.at = s.next(h)
		heap.Push(&s.h, h)
	}
	if s.batcher == nil || len(due) == 1 {
		for _, h := range due {
			s.launch(h)
		}
		return
	}
	for len(due) > 0 {
		n := min(len(due), s.maxBatch)
		s.launchBatch(due[:n])
		due = due[n:]
	}
}

// due returns when h's renewal was due: the first retry after a failure
// keeps the due time of the renewal that failed.
func (h *Handle) due() time.Time {
	if !h.dueSince.IsZero() {
		return h.dueSince
	}
	return h.renewAt
}

// launchBatch renews hs in one call to the batcher. Stop on one of them
// waits for the whole batch (bounded by the node timeout) but does not
// cancel it: the others' renewals must go on.
func (s *Scheduler) launchBatch(hs []*Handle) {
	running := make(chan struct{})
	var ts []Target
	var dues []time.Time
	var live []*Handle
	for _, h := range hs {
		h.mu.Lock()
		if h.stopped {
			h.mu.Unlock()
			h.inflight = false
			continue
		}
		h.running = running
		h.mu.Unlock()
		live = append(live, h)
		ts = append(ts, h.t)
		dues = append(dues, h.due())
	}
	if len(live) == 0 {
		return
	}
	start := time.Now()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		errs := s.batcher.RenewBatch(s.base, ts, dues)
		rs := make([]result, len(live))
		for i, h := range live {
			h.mu.Lock()
			h.running = nil
			h.mu.Unlock()
			rs[i] = result{h: h, start: start, err: errs[i]}
		}
		close(running)
		select {
		case s.results <- rs:
		case <-s.quit:
		}
	}()
}

// lose marks h stopped and tells its target, unless Stop came first. A
// renewal still in flight is cancelled; its result will be ignored.
func (s *Scheduler) lose(h *Handle, err error) {
	h.mu.Lock()
	if h.stopped {
		h.mu.Unlock()
		return
	}
	h.stopped = true
	if h.cancel != nil {
		h.cancel()
	}
	h.mu.Unlock()
	h.t.Lose(err)
}

func (s *Scheduler) launch(h *Handle) {
	h.mu.Lock()
	if h.stopped {
		h.mu.Unlock()
		return
	}
	// ctx outlives Renew's return on purpose. Renew returns as soon as a
	// majority has decided, while the requests to the other nodes are still
	// under way on ctx, each bounded by the node timeout: the one to a node
	// that restarted empty (it reconnects and loads the script again) is
	// the heal of that node. Cancelling ctx on return cut exactly those, so
	// a restarted node was healed only when it happened to answer among the
	// first majority. ctx ends with the next renewal of this lock (by then
	// the node timeout is normally long past), or with Stop, Cancel, loss or
	// Close. Batches keep their stragglers the same way (s.base).
	prev := h.cancel
	ctx, cancel := context.WithCancel(context.Background())
	running := make(chan struct{})
	h.cancel, h.running = cancel, running
	h.mu.Unlock()
	if prev != nil {
		prev()
	}
	start := time.Now() // fireDue marked h in flight
	due := h.due()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		err := h.t.Renew(ctx, due)
		h.mu.Lock()
		h.running = nil
		h.mu.Unlock()
		close(running)
		select {
		case s.results <- []result{{h: h, start: start, err: err}}:
		case <-s.quit:
		}
	}()
}

func (s *Scheduler) finish(r result) {
	h := r.h
	h.inflight = false
	h.mu.Lock()
	stopped := h.stopped
	h.mu.Unlock()
	if stopped {
		if h.index >= 0 {
			heap.Remove(&s.h, h.index)
		}
		return
	}
	var perm *backoff.PermanentError
	switch {
	case r.err == nil:
		h.lastErr = nil
		h.dueSince = time.Time{}
		if h.bo != nil {
			h.bo.Reset()
		}
		h.renewAt = r.start.Add(h.opts.Interval)
	case errors.As(r.err, &perm):
		if h.index >= 0 {
			heap.Remove(&s.h, h.index)
		}
		s.lose(h, perm.Err)
		return
	default:
		h.lastErr = r.err
		if h.dueSince.IsZero() {
			h.dueSince = h.renewAt
		}
		if h.bo == nil {
			h.bo = retryBackOff(h.opts.Interval) // at the first failure: most locks never need it
		}
		h.renewAt = time.Now().Add(h.bo.NextBackOff())
	}
	h.at = s.next(h)
	if h.index >= 0 {
		heap.Fix(&s.h, h.index)
	} else {
		heap.Push(&s.h, h)
	}
}
