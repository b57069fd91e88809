package redlock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/quorumlock/quorumlock/internal/testhooks"
)

// MaxPermits is the largest number of permits a Semaphore may have: every
// permit is a lock key per node, and an acquire that finds its first slot
// taken tries all the others in one fan-out.
const MaxPermits = 1024

// Suffixes of a semaphore's resources: permit i of semaphore "jobs" is the
// lock on resource "jobs:permit:<i>", and its waiters queue on the lock on
// resource "jobs:permits".
const (
	permitInfix     = ":permit:"
	turnstileSuffix = ":permits"
)

// Semaphore is a counting semaphore of K permits held across the Client's N
// nodes: at most K holders at any time. Permit i is an ordinary lock on the
// resource "<name>:permit:<i>" (key "<prefix><name>:permit:<i>"), so a
// permit is acquired, renewed, fenced, reported lost and released exactly
// as a lock is — its fencing tokens are per permit slot: they increase
// across the successive holders of one permit, and two permits held at
// once may carry the same token; a crashed holder's permit returns when
// its key expires, within its TTL. The safety argument is in the package documentation
// (Semaphores).
//
// Waiters ([Semaphore.Acquire]) are served in order without a herd: they
// queue, in the order of the nodes' waiter queue (DESIGN step 9), on the
// lock "<name>:permits", and only its holder waits on the permits, queued
// on each; a release hands its permit to that one waiter.
//
// A Semaphore is safe for concurrent use and costs nothing while unused;
// its permits are held by the Client's renewal scheduler, and Close
// releases them as it releases locks. Every Client that names the same
// semaphore must give the same number of permits: a Client that says K+1
// lets K+1 hold.
type Semaphore struct {
	c         *Client
	name      string
	slots     []string // the permits' resources
	turnstile string   // the waiters' resource
	opts      []Option // per-call options of every permit, before the call's own
}

// Semaphore returns the semaphore name with permits permits on the Client's
// nodes. opts are per-call options applied to every permit, before the
// options of each Acquire (WithTTL, WithFencing, WithOnLost, WithMaxHold…).
// It does no I/O.
//
// It returns an error matching ErrInvalidArgument when permits is not in
// [1, MaxPermits], when name is not a valid resource (as for Lock), or
// when opts are not valid per call; ErrClosed after Close.
func (c *Client) Semaphore(name string, permits int, opts ...Option) (*Semaphore, error) {
	if permits < 1 || permits > MaxPermits {
		return nil, invalid("Semaphore: permits must be in [1, %d], got %d", MaxPermits, permits)
	}
	if err := c.checkResource(name); err != nil {
		return nil, fmt.Errorf("Semaphore: %w", err)
	}
	s := &Semaphore{c: c, name: name, slots: make([]string, permits), turnstile: name + turnstileSuffix, opts: opts}
	for i := range s.slots {
		s.slots[i] = name + permitInfix + strconv.Itoa(i)
	}
	for _, r := range []string{s.slots[permits-1], s.turnstile} {
		if err := c.checkResource(r); err != nil {
			return nil, fmt.Errorf("Semaphore %q: %w", name, err)
		}
	}
	if _, err := buildConfig(c.cfg, opts, true); err != nil {
		return nil, fmt.Errorf("Semaphore %q: %w", name, err)
	}
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	return s, nil
}

// Name returns the semaphore's name.
func (s *Semaphore) Name() string { return s.name }

// Permits returns K, the number of permits.
func (s *Semaphore) Permits() int { return len(s.slots) }

// PermitResource returns the resource of permit i (0 ≤ i < Permits), the
// resource of the *Lock that stands for it: "<name>:permit:<i>". It is ""
// for an i out of range.
func (s *Semaphore) PermitResource(i int) string {
	if i < 0 || i >= len(s.slots) {
		return ""
	}
	return s.slots[i]
}

// Permit returns the index of the permit l stands for, or -1 when l is not
// one of this semaphore's permits.
func (s *Semaphore) Permit(l *Lock) int {
	r := l.Resource()
	rest, ok := strings.CutPrefix(r, s.name+permitInfix)
	if !ok {
		return -1
	}
	i, err := strconv.Atoi(rest)
	if err != nil || i < 0 || i >= len(s.slots) || s.slots[i] != r {
		return -1
	}
	return i
}

func (s *Semaphore) callOpts(opts []Option) []Option {
	if len(opts) == 0 {
		return s.opts
	}
	return append(s.opts[:len(s.opts):len(s.opts)], opts...)
}

// TryAcquire takes one of the K permits without waiting. It tries one
// permit, chosen at random (one round trip, plus one with fencing), and
// when that one is held, all the others at once, in parallel (one more
// round trip); it keeps one permit granted and releases any other. The
// returned *Lock is the permit: renew, Extend, Lost, Context and Unlock it
// as any lock; Unlock gives the permit back.
//
// ctx bounds the call, not the permit. It returns an error matching
// ErrNotObtained when all K permits are held (every permit refused by its
// holder; matching ErrAlreadyHeld too when ctx comes from permits of this
// Client that are all K), ErrNoQuorum (joined with the node errors) when too few nodes
// answered for some permit that is not known to be held, ErrInvalidArgument
// on bad options, ErrClosed after Close; joined with ctx's error when ctx
// ended.
func (s *Semaphore) TryAcquire(ctx context.Context, opts ...Option) (*Lock, error) {
	return s.try(ctx, s.callOpts(opts))
}

// try is TryAcquire with the merged options. DESIGN steps 1–3 and 8 run per
// permit, in TryLock.
func (s *Semaphore) try(ctx context.Context, opts []Option) (*Lock, error) {
	k := len(s.slots)
	first := rand.IntN(k) // spreads the callers over the permits
	// A negative control of the simulator: a permit of one's own, never
	// held by another.
	if testhooks.SemaphoreSkipsPermits.Load() {
		return s.c.TryLock(ctx, s.slots[first]+":"+strconv.Itoa(rand.Int()), opts...)
	}
	l, err := s.c.TryLock(ctx, s.slots[first], opts...)
	if err == nil || k == 1 || !contended(err) {
		return l, err
	}
	// The first permit was taken: all the others in one fan-out.
	type result struct {
		l   *Lock
		err error
	}
	res := make([]result, k)
	res[first].err = err
	var wg sync.WaitGroup
	for i := range k {
		if i == first {
			continue
		}
		wg.Go(func() {
			l, err := s.c.TryLock(ctx, s.slots[i], opts...)
			res[i] = result{l, err}
		})
	}
	wg.Wait() // each TryLock returns once decided: within a node timeout
	var got *Lock
	var extra []*Lock
	errs := make([]error, 0, k)
	for j := range k {
		r := res[(first+j)%k]
		switch {
		case r.err != nil:
			errs = append(errs, r.err)
		case got == nil:
			got = r.l
		default:
			extra = append(extra, r.l)
		}
	}
	s.giveBack(ctx, extra)
	if got != nil {
		return got, nil
	}
	return nil, s.verdict(ctx, errs)
}

// contended reports whether err leaves other permits worth trying: the
// permit was refused or undecided, not a bad call or a closed Client.
func contended(err error) bool {
	return errors.Is(err, ErrNotObtained) || errors.Is(err, ErrNoQuorum)
}

// verdict is the error of an acquire that got no permit: ErrNotObtained
// when every permit was refused by its holder, else the first error that is
// not (a permit that too few nodes answered for may be free); joined with
// ctx's error when ctx ended.
func (s *Semaphore) verdict(ctx context.Context, errs []error) error {
	err := fmt.Errorf("%w: semaphore %q: all %d permits are held", ErrNotObtained, s.name, len(s.slots))
	if !slices.ContainsFunc(errs, func(e error) bool { return !errors.Is(e, ErrAlreadyHeld) }) {
		err = alreadyHeld(fmt.Sprintf("semaphore %q: ctx comes from this Client's holder of all %d permits", s.name, len(s.slots)))
	}
	for _, e := range errs {
		if !errors.Is(e, ErrNotObtained) {
			err = fmt.Errorf("semaphore %q: %w", s.name, e)
			break
		}
	}
	if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		err = errors.Join(err, ctx.Err())
	}
	return err
}

// giveBack releases permits granted to a fan-out beyond the one it keeps,
// on a context without ctx's cancellation (Unlock bounds it by the node
// timeout).
func (s *Semaphore) giveBack(ctx context.Context, ls []*Lock) {
	if len(ls) == 0 {
		return
	}
	dctx := context.WithoutCancel(ctx)
	var wg sync.WaitGroup
	for _, l := range ls {
		wg.Go(func() { _ = l.Unlock(dctx) })
	}
	wg.Wait()
}

// Acquire takes one of the K permits, waiting until one is free, ctx is
// done, WithRetryCount attempts were made on the waiters' lock, or the
// Client is closed. It first tries as TryAcquire does (at most two round
// trips when a permit is free); then it waits in line: the waiters of a
// semaphore queue on its lock "<name>:permits" in the nodes' order (step
// 9), and its holder alone waits on every permit, queued on each, so a
// release hands its permit to the first waiter and tells that waiter alone.
// A waiter that crashes as the line is handed to it holds the others up by
// one reservation of the waiters' lock (two node timeouts at the
// defaults); a head waiter that crashes later, until the waiters' lock
// expires: one TTL at most, as a crashed holder of any lock (permits freed
// meanwhile go to callers that try them, such as a newcomer's first round
// trips). The returned *Lock is the permit (see TryAcquire).
//
// ctx bounds the call, not the permit. It returns the errors of
// TryAcquire (ErrNotObtained once ctx ended, joined with ctx's error;
// ErrAlreadyHeld at once, without waiting in line, when ctx comes from the
// holder of every permit, which would wait for itself) and of Lock on the waiters' lock: ErrNoQuorum with the node errors when too
// few nodes answered, ErrClosed after Close.
func (s *Semaphore) Acquire(ctx context.Context, opts ...Option) (*Lock, error) {
	opts = s.callOpts(opts)
	l, err := s.try(ctx, opts)
	// A caller that holds every permit would wait in line for itself.
	if err == nil || !contended(err) || ctx.Err() != nil || errors.Is(err, ErrAlreadyHeld) {
		return l, err
	}
	// The verdict of the last round that ended before ctx did: a call cut
	// short by ctx says nothing about the nodes (as in Lock), so when ctx
	// ends while all permits are held, the caller learns ErrNotObtained,
	// not an outage.
	verdict := err
	settled := func(err error) error {
		if ctx.Err() != nil && verdict != nil {
			return errors.Join(verdict, ctx.Err())
		}
		return err
	}
	// In line: the waiters' lock orders the waiters and keeps all but one
	// off the permits. It protects nothing: safety comes from the permits
	// alone, so its loss only lets a second waiter onto the permits.
	line, err := s.c.Lock(ctx, s.turnstile, append(opts[:len(opts):len(opts)], WithFencing(false), WithMaxHold(0), WithOnLost(nil))...)
	if err != nil {
		return nil, settled(err)
	}
	defer func() { _ = line.Unlock(context.WithoutCancel(ctx)) }()
	// A permit may have come free while we waited in line.
	if l, err := s.try(ctx, opts); err == nil || !contended(err) {
		return l, err
	} else if ctx.Err() == nil {
		verdict = err
	}
	l, err = s.wait(ctx, opts)
	if err != nil {
		return nil, settled(err)
	}
	return l, nil
}

// wait is the head waiter's wait: a Lock call on every permit at once,
// each queued on its nodes; the first granted is kept, the other calls are
// cancelled, and a permit granted to them meanwhile is released (its
// release hands it to the next waiter queued there).
func (s *Semaphore) wait(ctx context.Context, opts []Option) (*Lock, error) {
	k := len(s.slots)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		l   *Lock
		err error
	}
	res := make(chan result, k)
	// A permit is never passed between goroutines locally (cohort.go):
	// each goes back through its nodes, where the semaphore's order is.
	opts = append(opts[:len(opts):len(opts)], WithLocalHandoff(0, 0))
	for i := range k {
		go func() {
			l, err := s.c.Lock(wctx, s.slots[i], opts...)
			res <- result{l, err}
		}()
	}
	var got *Lock
	var extra []*Lock
	errs := make([]error, 0, k)
	for range k {
		r := <-res
		switch {
		case r.err == nil && got == nil:
			got = r.l
			cancel() // the other calls end at once
		case r.err == nil:
			extra = append(extra, r.l)
		default:
			errs = append(errs, r.err)
		}
	}
	s.giveBack(ctx, extra)
	if got != nil {
		return got, nil
	}
	return nil, s.verdict(ctx, errs)
}

// Do acquires a permit (as Acquire does, with opts), runs fn, and releases
// the permit afterwards, as Client.Do does for a lock: fn's ctx is
// cancelled when the caller's ctx ends or the permit is lost (cause
// ErrLockLost). It returns fn's error, joined with ErrLockLost when the
// permit was lost before fn returned; Acquire's error, without calling fn,
// when no permit was obtained; ErrInvalidArgument when fn is nil.
func (s *Semaphore) Do(ctx context.Context, fn func(ctx context.Context) error, opts ...Option) error {
	if fn == nil {
		return invalid("fn must not be nil")
	}
	l, err := s.Acquire(ctx, opts...)
	if err != nil {
		return err
	}
	return runHeld(ctx, l, fn)
}

// InUse counts the permits a majority of nodes hold now, one IsLocked
// round per permit, in parallel. It returns an error matching ErrNoQuorum
// (with the count of the permits it could tell) when too few nodes answered
// for some permit.
func (s *Semaphore) InUse(ctx context.Context) (int, error) {
	held := make([]bool, len(s.slots))
	errs := make([]error, len(s.slots))
	var wg sync.WaitGroup
	for i, r := range s.slots {
		wg.Go(func() { held[i], errs[i] = s.c.IsLocked(ctx, r) })
	}
	wg.Wait()
	n := 0
	for _, h := range held {
		if h {
			n++
		}
	}
	return n, errors.Join(errs...)
}
