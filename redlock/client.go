package redlock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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
	// closeParallel is how many locks Close releases at once.
	closeParallel = 64
)

var errBusy = errors.New("too many requests in flight on this node")

// node is one Redis master.
type node struct {
	c       redis.UniversalClient
	addr    string
	sem     chan struct{} // requests in flight, capped
	cluster bool          // a Redis Cluster client: keys of a lock share a hash tag
}

// fenceSuffix names a resource's fence counter: key + fenceSuffix.
const fenceSuffix = ":fence"

// keys names the keys of resource on this node. On a Cluster node the lock
// key and the fence counter share a hash tag, so they live in one slot and
// one script may touch both.
func (n *node) keys(prefix, resource string, fencing bool) scripts.Keys {
	lock := prefix + resource
	if n.cluster {
		lock = prefix + "{" + resource + "}"
	}
	fence := ""
	if fencing {
		fence = lock + fenceSuffix
	}
	return scripts.NewKeys(lock, fence)
}

// Client acquires locks on a majority of N independent Redis masters. It is
// safe for concurrent use. Close it when done: it stops the renewals and
// releases every lock still held.
type Client struct {
	nodes  []node
	cfg    config // defaults for every lock
	quorum int
	sched  *renew.Scheduler
	wake   *wakeups
	// anyCluster is set when a node is a Cluster client: resources may then
	// not contain braces, which would change the hash tag.
	anyCluster bool
	// wg owns every goroutine an operation leaves behind: stragglers after an
	// early decision, background releases, OnLost callbacks.
	wg      sync.WaitGroup
	closing chan struct{} // closed by Close
	ids     atomic.Uint64 // call and lock IDs for hooks

	lineMu sync.Mutex                 // protects lines
	lines  map[string][]chan struct{} // per resource: this Client's Lock calls in arrival order

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
		lines:   make(map[string][]chan struct{}),
		maxWait: cfg.timeout(),
	}
	for i, n := range nodes {
		if isNil(n) {
			return nil, invalid("nodes[%d] is nil", i)
		}
		if _, ok := n.(*redis.Ring); ok {
			return nil, invalid("nodes[%d] is a *redis.Ring: it moves keys between shards, so it is not one independent master", i)
		}
		if err := checkNode(nodes, i); err != nil {
			return nil, err
		}
		_, cluster := n.(*redis.ClusterClient)
		c.nodes[i] = node{c: n, addr: nodeAddr(n), sem: make(chan struct{}, maxInFlight), cluster: cluster}
		c.anyCluster = c.anyCluster || cluster
	}
	c.cfg.keyPrefixSet, c.cfg.renewBatchSet = false, false
	// Renewals due within a short window go out together: a twentieth of
	// the default interval, at most 20ms early.
	c.sched = renew.NewBatched(batcher{c}, renew.Batching{Max: cfg.renewBatch, Window: min(cfg.interval()/20, 20*time.Millisecond)})
	c.wake = newWakeups(c)
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
	if err := c.checkResource(resource); err != nil {
		return cfg, err
	}
	if cfg.keyPrefixSet {
		return cfg, invalid("WithKeyPrefix is valid for New only: per call it would hide the key from IsLocked")
	}
	if cfg.renewBatchSet {
		return cfg, invalid("WithRenewBatch is valid for New only")
	}
	return cfg, cfg.validate()
}

// checkResource refuses resource names that would collide with other keys.
func (c *Client) checkResource(resource string) error {
	switch {
	case resource == "":
		return invalid("resource must not be empty")
	case strings.HasSuffix(resource, fenceSuffix):
		return invalid("resource %q: the suffix %q is reserved for fence counters", resource, fenceSuffix)
	case c.anyCluster && strings.ContainsAny(resource, "{}"):
		return invalid("resource %q: braces are not allowed with Cluster nodes, where the library sets the hash tag itself", resource)
	}
	return nil
}

// site says what a request is for, so that a failure can be reported.
type site struct {
	obs      Hooks // nil: none
	op       string
	resource string
}

// call runs fn on node i with the in-flight cap, and turns any failure into
// a *NodeError, reported to the hooks.
func call[T any](c *Client, ctx context.Context, i int, at site, fn func(ctx context.Context, s redis.Scripter) (T, error)) (T, error) {
	n := &c.nodes[i]
	var zero T
	var err error
	select {
	case n.sem <- struct{}{}:
		var v T
		v, err = fn(ctx, n.c)
		<-n.sem
		if err == nil {
			return v, nil
		}
	default:
		err = errBusy
	}
	if at.obs != nil {
		at.obs.NodeError(ctx, NodeErrorInfo{Resource: at.resource, Op: at.op, Node: i, Addr: n.addr, Kind: errorKind(err), Err: err})
	}
	return zero, &NodeError{Node: i, Addr: n.addr, Err: err}
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

func (c *Client) lock(ctx context.Context, resource string, opts []Option, once bool) (l *Lock, err error) {
	cfg, err := c.callConfig(resource, opts)
	if err != nil {
		return nil, err
	}
	attempts := 0
	started := time.Now()
	callID := c.ids.Add(1)
	if obs := cfg.obs; obs != nil {
		start := time.Now()
		defer func() {
			info := AcquireInfo{Call: callID, Resource: resource, Wait: time.Since(start), Attempts: attempts,
				Outcome: outcomeOf(err), Fence: l.Fence(), Err: err}
			if l != nil {
				info.Lock = l.id
			}
			obs.Acquire(ctx, info)
		}()
	}
	if err := c.begin(); err != nil {
		return nil, err
	}
	defer c.end()
	c.noteTimeout(cfg.timeout())
	if !once {
		// Fairness within this Client: its Lock calls on one resource take
		// turns in arrival order, and only the first contends on the
		// nodes. A goroutine that unlocks and locks again goes to the back.
		leave, err := c.line(ctx, resource)
		if err != nil {
			return nil, err
		}
		defer leave()
	}

	var delay backoff.BackOff = jitter{cfg.retryMin, cfg.retryMax}
	var timer *time.Timer
	var w *waiter // set once this call waits for releases (step 9)
	defer func() {
		if timer != nil {
			timer.Stop()
		}
		if w != nil {
			w.leave()
		}
	}()
	for attempt := 1; ; attempt++ {
		attempts = attempt
		l, granted, err := c.attempt(ctx, callID, resource, cfg, w != nil)
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
		// Step 9: after the first refusal, subscribe to the resource's
		// release channel, then attempt again at once, so that a release
		// published before the subscription took effect is not missed.
		if w == nil && cfg.wakeUp && errors.Is(err, ErrNotObtained) {
			if w, err = c.wake.join(c.cfg.keyPrefix + resource); err != nil {
				return nil, err
			}
			w.awaitReady(ctx, cfg.timeout())
			continue
		}
		d := delay.NextBackOff()
		if granted > 0 {
			// A split vote: nobody holds the lock now, but the others that
			// lost it too will retry; a short random pause breaks the tie
			// sooner than the full retry delay.
			d = splitPause()
		}
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		var woken <-chan struct{}
		if w != nil {
			woken = w.c
		}
		select {
		case <-timer.C:
		case <-woken:
			// Alone, attempt at once. With waiters of other Clients (within
			// a Client only the first in line waits on the nodes), the one
			// that has waited longest goes first.
			if w.rivals.Load() > 1 {
				time.Sleep(agePause(time.Since(started)))
			}
		case <-ctx.Done():
			return nil, errors.Join(err, ctx.Err())
		case <-c.closing:
			return nil, ErrClosed
		}
	}
}

// splitPause is a random pause of up to 3ms: long enough to order the
// attempts of waiters on one host (a local round trip is ~0.1ms), short
// against any retry delay.
func splitPause() time.Duration { return rand.N(3 * time.Millisecond) }

// line queues a Lock call behind this Client's earlier calls on resource
// and returns when it is first. leave must be called when the call is done
// contending: it hands the turn to the next in line.
func (c *Client) line(ctx context.Context, resource string) (leave func(), err error) {
	turn := make(chan struct{})
	c.lineMu.Lock()
	q := append(c.lines[resource], turn)
	c.lines[resource] = q
	ahead := len(q) - 1
	c.lineMu.Unlock()
	leave = func() {
		c.lineMu.Lock()
		defer c.lineMu.Unlock()
		q := c.lines[resource]
		i := slices.Index(q, turn)
		q = slices.Delete(q, i, i+1)
		if len(q) == 0 {
			delete(c.lines, resource)
			return
		}
		c.lines[resource] = q
		if i == 0 {
			close(q[0]) // the next caller's turn
		}
	}
	if ahead == 0 {
		return leave, nil
	}
	select {
	case <-turn:
		return leave, nil
	case <-ctx.Done():
		leave()
		return nil, errors.Join(fmt.Errorf("%w: %d earlier Lock calls of this client were waiting for it", ErrNotObtained, ahead), ctx.Err())
	case <-c.closing:
		leave()
		return nil, ErrClosed
	}
}

func (c *Client) noteTimeout(d time.Duration) {
	c.mu.Lock()
	c.maxWait = max(c.maxWait, d)
	c.mu.Unlock()
}

// attempt is one acquisition round (DESIGN steps 1–4, and 8 with fencing).
// It returns the lock, or the number of nodes that granted and the error.
// Each attempt uses a fresh token: a background release left by a failed
// attempt must never delete the key of a later attempt.
func (c *Client) attempt(ctx context.Context, callID uint64, resource string, cfg config, waiter bool) (*Lock, int, error) {
	start := time.Now()
	l, t, err := c.try(ctx, resource, cfg, waiter)
	if cfg.obs != nil {
		cfg.obs.Attempt(ctx, AttemptInfo{Call: callID, Resource: resource, Latency: time.Since(start), Granted: t.Yes,
			Quorum: c.quorum, Nodes: len(c.nodes), Outcome: outcomeOf(err), Err: err, NodeErrors: c.nodeErrors(t)})
	}
	return l, t.Yes, err
}

// try is attempt without the hook; it also returns the tally of phase 1.
func (c *Client) try(ctx context.Context, resource string, cfg config, waiter bool) (*Lock, quorum.Tally, error) {
	id, err := uuid.NewRandom() // v4, 122 bits from crypto/rand
	if err != nil {
		return nil, quorum.Tally{}, fmt.Errorf("redlock: token: %w", err)
	}
	n := len(c.nodes)
	l := &Lock{
		c:        c,
		resource: resource,
		keys:     make([]scripts.Keys, n),
		token:    id.String(),
		cfg:      cfg,
		lost:     make(chan struct{}),
		lostDone: make(chan struct{}),
	}
	for i := range c.nodes {
		// Plain nodes share one set of keys; Cluster nodes need hash tags.
		if i > 0 && !c.nodes[i].cluster && !c.nodes[i-1].cluster {
			l.keys[i] = l.keys[i-1]
			continue
		}
		l.keys[i] = c.nodes[i].keys(c.cfg.keyPrefix, resource, cfg.fencing)
	}
	// Step 1: one parallel round on every node.
	r := quorum.Start(ctx, n, cfg.timeout(), &c.wg, func(ctx context.Context, i int) (reply, error) {
		return call(c, ctx, i, site{cfg.obs, "acquire", resource}, func(ctx context.Context, s redis.Scripter) (reply, error) {
			ok, fence, err := acquireOn(ctx, s, l.keys[i], l.token, cfg, waiter) // guard.go
			return reply{ours: ok, fence: fence}, err
		})
	})
	l.track(roundRef{r})
	// Step 2: decide as soon as a majority granted or became impossible.
	t := r.Collect(ctx, classify, quorum.Majority)
	deadline := quorum.Deadline(r.Started(), cfg.ttl, cfg.drift)
	// Step 3: validity, from before the first request was sent.
	if t.Quorum() && quorum.Validity(cfg.ttl, t.Elapsed, cfg.drift) > 0 {
		if !cfg.fencing {
			l, err := c.hold(ctx, l, deadline)
			return l, t, err
		}
		t2 := c.commitFence(ctx, l, r)
		if t2.Quorum() && time.Now().Before(deadline) {
			l, err := c.hold(ctx, l, deadline)
			return l, t, err
		}
		c.abandon(ctx, l, r, t)
		return nil, t, c.attemptError(ctx, t2, cfg)
	}
	// Step 4: a failed or cancelled attempt releases what it may have set.
	c.abandon(ctx, l, r, t)
	return nil, t, c.attemptError(ctx, t, cfg)
}

// commitFence is phase 2 of a fenced acquire (step 8). t = max(counters
// read in phase 1) + 1; phase 1's granting majority is among the nodes
// read, and any earlier holder committed its token on a majority, which
// intersects it, so t exceeds every earlier token. Each node that granted is
// sent the commit as soon as its own phase-1 reply is in; the lock counts
// only if a majority commits.
func (c *Client) commitFence(ctx context.Context, l *Lock, r *quorum.Round[reply]) quorum.Tally {
	var top int64
	for i := range r.N() {
		if rep, ok := r.Reply(i); ok && rep.Err == nil {
			top = max(top, rep.Val.fence)
		}
	}
	l.fence = top + 1
	r2 := quorum.Start(ctx, r.N(), l.cfg.timeout(), &c.wg, func(ctx context.Context, i int) (reply, error) {
		select {
		case <-r.Done(i):
		case <-ctx.Done():
			return reply{}, ctx.Err()
		}
		rep, _ := r.Reply(i)
		if rep.Err != nil || !rep.Val.ours {
			return reply{}, rep.Err // not granted: nothing to commit there
		}
		return call(c, ctx, i, site{l.cfg.obs, "commit", l.resource}, func(ctx context.Context, s redis.Scripter) (reply, error) {
			ok, err := scripts.Commit(ctx, s, l.keys[i], l.token, l.fence)
			return reply{ours: ok}, err
		})
	})
	l.track(roundRef{r2})
	return r2.Collect(ctx, classify, quorum.Majority)
}

// reply is one node's answer to a lock script.
type reply struct {
	ours   bool  // the key holds our token there now
	healed bool  // extend set it again where it was absent
	fence  int64 // the node's fence counter (fenced acquire only)
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
	// Failures that are only the caller giving up do not count as node
	// failures.
	failed := t.Failed
	if ctx.Err() != nil {
		for _, e := range t.Errs {
			if errors.Is(e, context.Canceled) || errors.Is(e, context.DeadlineExceeded) {
				failed--
			}
		}
	}
	var head error
	if t.No > n-c.quorum || failed == 0 {
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
	l.acquired = time.Now()
	l.id = c.ids.Add(1)
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
	// Nodes still answering when the attempt was decided are waited for,
	// up to the node timeout, unless the caller gave up: a node that grants
	// a moment after the others refused is released before the call
	// returns too. One that answers later still is released when it does.
	var wait chan struct{} // closed when waiting is over; shared by every node
	if ctx.Err() == nil {
		wait = make(chan struct{})
		tm := time.AfterFunc(max(l.cfg.timeout()-time.Since(r.Started()), 0)+closeGrace, func() { close(wait) })
		defer tm.Stop()
	}
	var wg sync.WaitGroup
	for i, v := range t.Votes {
		switch v {
		case quorum.No:
			// Another token holds the key there: nothing of ours to delete.
		case quorum.Yes:
			wg.Go(func() { l.releaseNode(dctx, i, false) })
		default:
			late := func() {
				<-r.Done(i)
				if rep, _ := r.Reply(i); rep.Err != nil || rep.Val.ours {
					l.releaseNode(dctx, i, false)
				}
			}
			if wait == nil {
				c.wg.Go(late)
				continue
			}
			wg.Go(func() {
				select {
				case <-r.Done(i):
					late() // answered: releases now, before abandon returns
				case <-wait:
					c.wg.Go(late)
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
	if err := c.checkResource(resource); err != nil {
		return false, err
	}
	if err := c.begin(); err != nil {
		return false, err
	}
	defer c.end()
	n := len(c.nodes)
	r := quorum.Start(ctx, n, c.cfg.timeout(), &c.wg, func(ctx context.Context, i int) (reply, error) {
		return call(c, ctx, i, site{c.cfg.obs, "exists", resource}, func(ctx context.Context, s redis.Scripter) (reply, error) {
			ok, err := scripts.Exists(ctx, s, c.nodes[i].keys(c.cfg.keyPrefix, resource, false).Lock)
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
	// Release with bounded parallelism: a Client may hold many thousands of
	// locks, and the nodes' in-flight caps must not turn Close into errors.
	sem := make(chan struct{}, closeParallel)
	for l := range locks {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			l.reportExpiry()
			l.finish(ErrClosed)
			if err := l.release(context.Background()); err != nil && !errors.Is(err, ErrNotHeld) {
				mu.Lock()
				errs = append(errs, fmt.Errorf("release %q: %w", l.resource, err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	c.wake.close()
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
