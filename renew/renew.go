// Package renew is the renewal scheduler: one per redlock Client, not one
// goroutine per lock. It keeps a heap of locks ordered by their next event —
// a renewal that is due, or the deadline at which the lease runs out — and
// drives both from a single timer.
//
// For each lock it extends the lease every interval through the lock's own
// quorum extend ([Target.Renew]). After a failed round it retries quickly,
// with jittered exponential backoff, while validity remains. It declares the
// lock lost ([Target.Lose]) when a renewal reports that the lock is gone for
// good (a *backoff.PermanentError: a majority said the key is not ours), or
// when [Target.ValidUntil] passes without a successful renewal — whichever
// comes first. The deadline does not depend on a renewal returning: a
// renewal that hangs cannot delay the loss report. A lease without renewal is
// lost at its deadline the same way.
package renew

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/quorumlock/quorumlock/internal/testhooks"
)

// ErrExpired is the cause given to [Target.Lose] when the deadline passed
// without a successful renewal. It is joined with the last renewal error, if
// any.
var ErrExpired = errors.New("renew: validity ran out before a renewal succeeded")

// Target is one lock, seen by the scheduler.
type Target interface {
	// Renew runs one extension round on the nodes and, on success, moves the
	// lock's ValidUntil. It returns a *backoff.PermanentError when the lock
	// is gone for good; any other error is retried while validity remains.
	// ctx is cancelled when the renewal is stopped. due is when this
	// renewal was due: the first retry after a failure keeps the due time
	// of the renewal that failed, so time.Since(due) is the renewal lag.
	Renew(ctx context.Context, due time.Time) error
	// ValidUntil returns the lock's current local deadline. It never moves
	// back.
	ValidUntil() time.Time
	// Lose declares the lock lost with cause err. It is called at most once,
	// on the scheduler's goroutine, and must not block: every later lock's
	// deadline waits for it. Anything slow (hooks, user callbacks) belongs
	// on a goroutine of its own, after the signal.
	Lose(err error)
}

// Options are how one lock is renewed.
type Options struct {
	// AutoRenew turns renewal on. Without it, only the deadline is watched.
	AutoRenew bool
	// Interval is the time from the start of one successful renewal to the
	// next one.
	Interval time.Duration
	// First, when positive and shorter than Interval, is the time from Add
	// to the first renewal: a lock held for less than its TTL so far (a
	// short reservation handed over by a release) renews that soon.
	First time.Duration
}

// Handle is one lock's registration. Its methods are safe for concurrent use.
type Handle struct {
	s    *Scheduler
	t    Target
	opts Options

	mu      sync.Mutex         // protects the fields below
	stopped bool               // Stop was called, or the lock was lost
	running chan struct{}      // closed when the renewal in flight returns; nil when none is
	cancel  context.CancelFunc // cancels the last renewal, and its requests still in flight after it returned

	// Owned by the scheduler's goroutine.
	index    int       // position in the heap; -1 when not in it
	at       time.Time // next event
	renewAt  time.Time // when the next renewal (or retry) is due
	dueSince time.Time // when the renewal being retried was first due; zero when none failed
	inflight bool
	lastErr  error
	bo       *backoff.ExponentialBackOff // made at the first failed renewal

	added int // position in Scheduler.added; -1 when not there. Protected by Scheduler.mu
}

// Stop stops renewing the lock and watching its deadline, and waits for a
// renewal of it in flight (which it cancels) to return. The scheduler lets
// go of the lock: it keeps no reference to it once Stop has returned and
// the loop has run (at once: Stop wakes it when the lock is in its heap),
// so its memory follows the locks held, not the locks taken. It is
// idempotent.
func (h *Handle) Stop() {
	h.mu.Lock()
	first := !h.stopped
	h.stopped = true
	cancel, running := h.cancel, h.running
	h.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	if first {
		h.s.remove(h)
	}
	if running != nil {
		<-running
	}
}

// Cancel stops renewing the lock and watching its deadline, and cancels a
// renewal in flight, without waiting for it: it may be called from within
// Target.Renew or Target.Lose. Like Stop, it lets go of the lock. It is
// idempotent.
func (h *Handle) Cancel() {
	h.mu.Lock()
	first := !h.stopped
	h.stopped = true
	cancel := h.cancel
	h.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	if first {
		h.s.remove(h)
	}
}

// Scheduler renews many locks from one goroutine. The zero value is not
// usable; call [New].
type Scheduler struct {
	wake      chan struct{}  // buffered 1: the heap changed
	results   chan []result  // renewals report here, a batch at a time
	quit      chan struct{}  // closed by Close
	loopDone  chan struct{}  // closed when the loop has returned
	wg        sync.WaitGroup // renewals in flight
	closeOnce sync.Once

	mu      sync.Mutex // protects added, removed, armed, closed and Handle.added
	added   []*Handle  // handed to the loop on the next wake
	removed []*Handle  // stopped handles the loop is to take out of its heap
	armed   time.Time  // when the loop's timer fires next; zero when it is not armed
	closed  bool

	h entries // owned by the loop

	base     context.Context // cancelled by Close: batches in flight stop
	stopBase context.CancelFunc
	batcher  Batcher       // nil: one renewal call per lock
	maxBatch int           // most locks per batch
	window   time.Duration // renewals due within window of now go out together
}

// Batcher renews many locks in one round: per node, one pipeline for all of
// them. It returns one error per target, with the same meaning as
// Target.Renew's. It is given targets only of the scheduler it was passed
// to.
type Batcher interface {
	RenewBatch(ctx context.Context, ts []Target, dues []time.Time) []error
}

// Batching are the settings of NewBatched.
type Batching struct {
	Max    int           // most locks in one batch (one pipeline per node); ≤ 1 turns batching off
	Window time.Duration // a renewal due within Window from now joins the current batch (it is renewed that much early)
}

// New starts a scheduler that renews each lock with its own call. Close
// stops it.
func New() *Scheduler { return NewBatched(nil, Batching{}) }

// NewBatched starts a scheduler that renews the locks due in one tick
// together, through b, in batches of at most bs.Max. Quorum decisions and
// loss semantics are those of New: b decides per lock. Close stops it.
func NewBatched(b Batcher, bs Batching) *Scheduler {
	s := &Scheduler{
		wake:     make(chan struct{}, 1),
		results:  make(chan []result),
		quit:     make(chan struct{}),
		loopDone: make(chan struct{}),
	}
	s.base, s.stopBase = context.WithCancel(context.Background())
	if b != nil && bs.Max > 1 {
		s.batcher, s.maxBatch, s.window = b, bs.Max, max(bs.Window, 0)
	}
	go s.loop()
	return s
}

// ErrClosed is returned by Add after Close.
var ErrClosed = errors.New("renew: scheduler closed")

// Add registers t. Its first renewal is due one interval from now (or
// opts.First, when shorter); its
// deadline is t.ValidUntil().
func (s *Scheduler) Add(t Target, opts Options) (*Handle, error) {
	if opts.AutoRenew && opts.Interval <= 0 {
		return nil, fmt.Errorf("renew: interval must be positive, got %v", opts.Interval)
	}
	delay := opts.Interval
	if opts.First > 0 && opts.First < delay {
		delay = opts.First
	}
	h := &Handle{s: s, t: t, opts: opts, index: -1, added: -1, renewAt: time.Now().Add(delay)}
	first := s.next(h)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	h.added = len(s.added)
	s.added = append(s.added, h)
	// The loop takes added handles whenever it wakes: it needs waking now
	// only if h's first event comes before the one its timer waits for.
	wake := s.armed.IsZero() || first.Before(s.armed)
	s.mu.Unlock()
	if wake {
		s.poke()
	}
	return h, nil
}

// remove lets go of a stopped handle. One the loop has not taken yet
// leaves the list of added handles at once, without waking the loop (the
// common case of a lock released soon after it was taken: Add wakes the
// loop only for an event earlier than the one it waits for). One in the
// heap is handed to the loop, which is woken to take it out: a stopped
// handle waiting there for its next event (an hour away, say) would keep
// its lock's memory until then.
func (s *Scheduler) remove(h *Handle) {
	s.mu.Lock()
	if i := h.added; i >= 0 {
		last := len(s.added) - 1
		s.added[i] = s.added[last]
		s.added[i].added = i
		s.added[last] = nil
		s.added = s.added[:last]
		h.added = -1
		s.mu.Unlock()
		return
	}
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.removed = append(s.removed, h)
	s.mu.Unlock()
	s.poke()
}

func (s *Scheduler) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Close stops the scheduler: no lock is renewed or declared lost after it
// returns. It cancels renewals in flight and waits for them. Idempotent.
func (s *Scheduler) Close() {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		close(s.quit)
		defer func() {
			s.mu.Lock()
			s.added, s.removed = nil, nil // no loop takes them any more
			s.mu.Unlock()
		}()
		<-s.loopDone
		s.stopBase()
		s.wg.Wait()
	})
}

func (s *Scheduler) loop() {
	defer close(s.loopDone)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		s.takeAdded()
		s.fireDue(time.Now())
		// Add wakes the loop only for an event before armed, so added
		// must be empty when armed is set.
		s.mu.Lock()
		if len(s.added) > 0 {
			s.mu.Unlock()
			continue
		}
		s.armed = time.Time{}
		if len(s.h) > 0 {
			s.armed = s.h[0].at
		}
		s.mu.Unlock()
		if len(s.h) > 0 {
			timer.Reset(time.Until(s.h[0].at))
		} else {
			timer.Stop()
		}
		select {
		case <-s.quit:
			s.stopAll()
			return
		case <-s.wake:
		case <-timer.C:
		case rs := <-s.results:
			for _, r := range rs {
				s.finish(r)
			}
		}
	}
}

func (s *Scheduler) takeAdded() {
	s.mu.Lock()
	added, removed := s.added, s.removed
	s.added, s.removed = nil, nil
	for _, h := range added {
		h.added = -1
	}
	s.mu.Unlock()
	for _, h := range added {
		h.at = s.next(h)
		heap.Push(&s.h, h)
	}
	// A stopped handle whose renewal is in flight leaves too: finish
	// ignores the result of a stopped handle.
	for _, h := range removed {
		if h.index >= 0 {
			heap.Remove(&s.h, h.index)
		}
	}
	s.shrink()
}

// shrink gives back the heap's array once most of it is unused, so that a
// burst of locks does not keep its memory after their release.
func (s *Scheduler) shrink() {
	if c := cap(s.h); c > 64 && len(s.h) < c/4 {
		s.h = append(make(entries, 0, 2*len(s.h)), s.h...)
	}
}

// stopAll cancels every renewal in flight; Close then waits for them.
func (s *Scheduler) stopAll() {
	for _, h := range s.h {
		h.mu.Lock()
		h.stopped = true
		if h.cancel != nil {
			h.cancel()
		}
		h.mu.Unlock()
	}
	s.h = nil
}

// next is the time of h's next event: the deadline, or an earlier renewal.
func (s *Scheduler) next(h *Handle) time.Time {
	at := h.t.ValidUntil()
	if testhooks.DeadlineUnwatched.Load() { // a negative control: the deadline is no event
		at = time.Now().Add(time.Hour)
	}
	if h.opts.AutoRenew && !h.inflight && h.renewAt.Before(at) {
		at = h.renewAt
	}
	return at
}
