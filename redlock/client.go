package redlock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/scripts"
	"github.com/quorumlock/quorumlock/quorum"
	"github.com/quorumlock/quorumlock/renew"
)

const (
	// maxInFlight caps the requests one Client has in flight on one node, so
	// that a node that hangs cannot pile up goroutines without bound.
	maxInFlight = 1024
	// closeGrace is added to the node timeout when Close waits for requests
	// still in flight.
	closeGrace = 250 * time.Millisecond
)

var errBusy = errors.New("too many requests in flight on this node")

// node is one Redis master.
type node struct {
	c    redis.UniversalClient
	addr string
	sem  chan struct{} // requests in flight, capped
}

// Client acquires locks on a majority of N independent Redis masters. It is
// safe for concurrent use. Close it when done: it stops the renewals and
// releases every lock still held.
type Client struct {
	nodes  []node
	cfg    config // defaults for every lock
	quorum int
	sched  *renew.Scheduler
	// wg owns every goroutine an operation leaves behind: stragglers after an
	// early decision, background releases, OnLost callbacks.
	wg      sync.WaitGroup
	closing chan struct{} // closed by Close

	mu      sync.Mutex // protects closed, locks, maxWait
	closed  bool
	locks   map[*Lock]struct{}
	maxWait time.Duration // longest node timeout used, for Close's bounded wait
	owned   []io.Closer   // node clients this Client built (none with New)
}

// New returns a Client over nodes, which must be independent Redis masters
// (a *redis.Client, a failover client, or a *redis.ClusterClient each; not a
// *redis.Ring, which moves keys between shards). Options set the defaults of
// every lock. New does no I/O. Build node clients with
// ContextTimeoutEnabled: true, so that a node timeout also frees the
// connection. Close does not close the node clients.
//
// New returns an error matching ErrInvalidArgument on bad input.
func New(nodes []redis.UniversalClient, opts ...Option) (*Client, error) {
	if len(nodes) == 0 {
		return nil, invalid("nodes: at least one node is needed")
	}
	cfg := buildConfig(defaultConfig(), opts)
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &Client{
		nodes:   make([]node, len(nodes)),
		cfg:     cfg,
		quorum:  quorum.Size(len(nodes)),
		closing: make(chan struct{}),
		locks:   make(map[*Lock]struct{}),
		maxWait: cfg.timeout(),
	}
	for i, n := range nodes {
		if isNil(n) {
			return nil, invalid("nodes[%d] is nil", i)
		}
		if _, ok := n.(*redis.Ring); ok {
			return nil, invalid("nodes[%d] is a *redis.Ring: it moves keys between shards, so it is not one independent master", i)
		}
		c.nodes[i] = node{c: n, addr: nodeAddr(n), sem: make(chan struct{}, maxInFlight)}
	}
	c.cfg.keyPrefixSet = false
	c.sched = renew.New()
	return c, nil
}

func isNil(n redis.UniversalClient) bool {
	if n == nil {
		return true
	}
	v := reflect.ValueOf(n)
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return v.IsNil()
	}
	return false
}

func nodeAddr(n redis.UniversalClient) string {
	switch c := n.(type) {
	case *redis.ClusterClient:
		return "cluster(" + strings.Join(c.Options().Addrs, ",") + ")"
	case interface{ Options() *redis.Options }:
		return c.Options().Addr
	}
	return fmt.Sprintf("%T", n)
}

// begin registers an operation, so that Close waits for it; it fails once
// the Client is closed. end must follow.
func (c *Client) begin() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	c.wg.Add(1)
	return nil
}

func (c *Client) end() { c.wg.Done() }

// callConfig merges per-call options over the Client's defaults and checks
// the result.
func (c *Client) callConfig(resource string, opts []Option) (config, error) {
	cfg := buildConfig(c.cfg, opts)
	if resource == "" {
		return cfg, invalid("resource must not be empty")
	}
	if cfg.keyPrefixSet {
		return cfg, invalid("WithKeyPrefix is valid for New only: per call it would hide the key from IsLocked")
	}
	return cfg, cfg.validate()
}

// call runs fn on node i with the in-flight cap, and turns any failure into
// a *NodeError.
func call[T any](c *Client, ctx context.Context, i int, fn func(ctx context.Context, s redis.Scripter) (T, error)) (T, error) {
	n := &c.nodes[i]
	var zero T
	select {
	case n.sem <- struct{}{}:
	default:
		return zero, &NodeError{Node: i, Addr: n.addr, Err: errBusy}
	}
	v, err := fn(ctx, n.c)
	<-n.sem
	if err != nil {
		return zero, &NodeError{Node: i, Addr: n.addr, Err: err}
	}
	return v, nil
}

// Lock acquires the lock on resource, retrying with a jittered delay (see
// WithRetryDelay) until it is acquired, WithRetryCount attempts were made,
// ctx is done, or the Client is closed. ctx bounds the call, not the lease:
// the lock stays held (and renewed, unless WithAutoRenew(false)) until
// Unlock, loss or Close.
//
// It returns an error matching ErrNotObtained when another owner holds the
// lock, ErrNoQuorum (joined with one *NodeError per failed node) when too few
// nodes answered, joined with ctx's error when ctx ended;
// ErrInvalidArgument on bad input; ErrClosed after Close.
func (c *Client) Lock(ctx context.Context, resource string, opts ...Option) (*Lock, error) {
	return c.lock(ctx, resource, opts, false)
}

// TryLock makes exactly one attempt to acquire the lock on resource. It
// returns the same errors as Lock.
func (c *Client) TryLock(ctx context.Context, resource string, opts ...Option) (*Lock, error) {
	return c.lock(ctx, resource, opts, true)
}

func (c *Client) lock(ctx context.Context, resource string, opts []Option, once bool) (*Lock, error) {
	cfg, err := c.callConfig(resource, opts)
	if err != nil {
		return nil, err
	}
	if err := c.begin(); err != nil {
		return nil, err
	}
	defer c.end()
	c.noteTimeout(cfg.timeout())

	var delay backoff.BackOff = jitter{cfg.retryMin, cfg.retryMax}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for attempt := 1; ; attempt++ {
		l, err := c.attempt(ctx, resource, cfg)
		if err == nil {
			return l, nil
		}
		if errors.Is(err, ErrClosed) {
			return nil, err
		}
		if ctx.Err() != nil {
			return nil, errors.Join(err, ctx.Err())
		}
		if once || (cfg.retryCount > 0 && attempt >= cfg.retryCount) {
			return nil, err
		}
		d := delay.NextBackOff()
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		select {
		case <-timer.C:
		case <-ctx.Done():
			return nil, errors.Join(err, ctx.Err())
		case <-c.closing:
			return nil, ErrClosed
		}
	}
}

func (c *Client) noteTimeout(d time.Duration) {
	c.mu.Lock()
	c.maxWait = max(c.maxWait, d)
	c.mu.Unlock()
}

// attempt is one acquisition round (DESIGN steps 1–4). Each attempt uses a
// fresh token: a background release left by a failed attempt must never
// delete the key of a later attempt.
func (c *Client) attempt(ctx context.Context, resource string, cfg config) (*Lock, error) {
	id, err := uuid.NewRandom() // v4, 122 bits from crypto/rand
	if err != nil {
		return nil, fmt.Errorf("redlock: token: %w", err)
	}
	l := &Lock{
		c:        c,
		resource: resource,
		key:      c.cfg.keyPrefix + resource,
		token:    id.String(),
		cfg:      cfg,
		lost:     make(chan struct{}),
	}
	// Step 1: one parallel round on every node.
	r := quorum.Start(ctx, len(c.nodes), cfg.timeout(), &c.wg, func(ctx context.Context, i int) (reply, error) {
		return call(c, ctx, i, func(ctx context.Context, s redis.Scripter) (reply, error) {
			ok, err := scripts.Acquire(ctx, s, l.key, l.token, cfg.ttl)
			return reply{ours: ok}, err
		})
	})
	l.track(r)
	// Step 2: decide as soon as a majority granted or became impossible.
	t := r.Collect(ctx, classify, quorum.Majority)
	if t.Quorum() {
		// Step 3: validity, from before the first request was sent.
		if v := quorum.Validity(cfg.ttl, t.Elapsed, cfg.drift); v > 0 {
			return c.hold(ctx, l, quorum.Deadline(r.Started(), cfg.ttl, cfg.drift))
		}
	}
	// Step 4: a failed or cancelled attempt releases what it may have set.
	c.abandon(ctx, l, r, t)
	return nil, c.attemptError(ctx, t, cfg)
}

// reply is one node's answer to a lock script.
type reply struct {
	ours   bool // the key holds our token there now
	healed bool // extend set it again where it was absent
}

func classify(_ int, rep quorum.Reply[reply]) (quorum.Vote, error) {
	switch {
	case rep.Err != nil:
		return quorum.Failed, rep.Err
	case rep.Val.ours:
		return quorum.Yes, nil
	}
	return quorum.No, nil
}

// attemptError tells contention from failure: ErrNotObtained when the
// refusals alone made a majority impossible, ErrNoQuorum when failed nodes
// could have made the difference. Nodes cut short because ctx ended are not
// failures: the caller gave up, and the ctx error is joined by the caller.
// Node errors are joined either way.
func (c *Client) attemptError(ctx context.Context, t quorum.Tally, cfg config) error {
	n := len(c.nodes)
	if t.Quorum() {
		return fmt.Errorf("%w: a majority granted after %v, which left no validity of the TTL %v", ErrNotObtained, t.Elapsed.Round(time.Millisecond), cfg.ttl)
	}
	failed := t.Failed
	if ctx.Err() != nil {
		for _, e := range t.Errs {
			if errors.Is(e, context.Canceled) || errors.Is(e, context.DeadlineExceeded) {
				failed--
			}
		}
	}
	var head error
	if t.Yes+failed < c.quorum {
		head = fmt.Errorf("%w: %d of %d nodes hold another owner's key", ErrNotObtained, t.No, n)
	} else {
		head = fmt.Errorf("%w: %d of %d nodes granted, %d needed", ErrNoQuorum, t.Yes, n, c.quorum)
	}
	return c.joinNodeErrors(head, t)
}

// joinNodeErrors joins head with one *NodeError per failed node of t.
func (c *Client) joinNodeErrors(head error, t quorum.Tally) error {
	errs := []error{head}
	for i, e := range t.Errs {
		if e == nil {
			continue
		}
		if ne := (*NodeError)(nil); !errors.As(e, &ne) {
			e = &NodeError{Node: i, Addr: c.nodes[i].addr, Err: e}
		}
		errs = append(errs, e)
	}
	if len(errs) == 1 {
		return head
	}
	return errors.Join(errs...)
}

// hold turns a granted attempt into a held Lock: registered with the Client
// (so Close releases it) and with the renewal scheduler.
func (c *Client) hold(ctx context.Context, l *Lock, validUntil time.Time) (*Lock, error) {
	l.validUntil = validUntil
	l.ctx, l.cancel = context.WithCancelCause(context.WithoutCancel(ctx))
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		l.finish(ErrClosed)
		l.release(ctx)
		return nil, ErrClosed
	}
	c.locks[l] = struct{}{}
	c.mu.Unlock()
	h, err := c.sched.Add(watch{l}, renew.Options{AutoRenew: l.cfg.autoRenew, Interval: l.cfg.interval()})
	if err != nil { // closed meanwhile; Close will release it
		return nil, ErrClosed
	}
	l.mu.Lock()
	l.handle = h
	l.mu.Unlock()
	return l, nil
}

// abandon releases a failed attempt on every node (step 4), on a context
// that ignores the caller's cancellation. Nodes that granted are released
// before it returns; the others are released in the background once their
// acquire request has answered or timed out, so that no acquire lands after
// its release.
func (c *Client) abandon(ctx context.Context, l *Lock, r *quorum.Round[reply], t quorum.Tally) {
	l.mu.Lock()
	l.state = stateFinished
	l.mu.Unlock()
	dctx := context.WithoutCancel(ctx)
	var wg sync.WaitGroup
	for i, v := range t.Votes {
		switch v {
		case quorum.No:
			// Another token holds the key there: nothing of ours to delete.
		case quorum.Yes:
			wg.Go(func() { l.releaseNode(dctx, i) })
		default:
			c.wg.Go(func() {
				<-r.Done(i)
				if rep, _ := r.Reply(i); rep.Err != nil || rep.Val.ours {
					l.releaseNode(dctx, i)
				}
			})
		}
	}
	wg.Wait()
}

// IsLocked reports whether a majority of nodes hold a key for resource,
// whoever owns it. It returns an error matching ErrNoQuorum when too few
// nodes answered to tell.
func (c *Client) IsLocked(ctx context.Context, resource string) (bool, error) {
	if resource == "" {
		return false, invalid("resource must not be empty")
	}
	if err := c.begin(); err != nil {
		return false, err
	}
	defer c.end()
	key := c.cfg.keyPrefix + resource
	n := len(c.nodes)
	r := quorum.Start(ctx, n, c.cfg.timeout(), &c.wg, func(ctx context.Context, i int) (reply, error) {
		return call(c, ctx, i, func(ctx context.Context, s redis.Scripter) (reply, error) {
			ok, err := scripts.Exists(ctx, s, key)
			return reply{ours: ok}, err
		})
	})
	t := r.Collect(ctx, classify, func(t quorum.Tally) bool {
		return t.Yes >= c.quorum || t.No > n-c.quorum || t.Pending == 0
	})
	switch {
	case t.Yes >= c.quorum:
		return true, nil
	case t.No > n-c.quorum:
		return false, nil
	}
	return false, c.joinNodeErrors(fmt.Errorf("%w: %d of %d nodes answered, %d needed", ErrNoQuorum, t.Yes+t.No, n, c.quorum), t)
}

// Close stops every renewal, releases every lock still held (their
// Context is cancelled with cause ErrClosed; OnLost is not called), and
// waits for the Client's goroutines: at most the node timeout plus a short
// grace for requests still in flight. It does not close node clients given
// to New. It is idempotent; afterwards every call returns ErrClosed. It
// returns the errors of releases that failed.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	close(c.closing)
	locks := c.locks
	c.locks = nil
	wait := c.maxWait + closeGrace
	c.mu.Unlock()

	c.sched.Close()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for l := range locks {
		wg.Go(func() {
			l.finish(ErrClosed)
			if err := l.release(context.Background()); err != nil && !errors.Is(err, ErrNotHeld) {
				mu.Lock()
				errs = append(errs, fmt.Errorf("release %q: %w", l.resource, err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	waitTimeout(&c.wg, wait)
	for _, o := range c.owned {
		if err := o.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// waitTimeout waits for wg, at most d. A request to a client built without
// ContextTimeoutEnabled may outlive its context; Close does not hang on it.
func waitTimeout(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
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
