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
func (n *node) keys(prefix, resource string, fencing bool, token string) scripts.Keys {
	lock := prefix + resource
	if n.cluster {
		lock = prefix + "{" + resource + "}"
	}
	fence := ""
	if fencing {
		fence = lock + fenceSuffix
	}
	return scripts.NewKeys(lock, fence, token)
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
	id      string        // names this Client in queue entries and its wake-up channel

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
		_, cluster := n.(*redis.ClusterClient)
		c.nodes[i] = node{c: n, addr: nodeAddr(n), sem: make(chan struct{}, maxInFlight), cluster: cluster}
		c.anyCluster = c.anyCluster || cluster
	}
	c.cfg.keyPrefixSet, c.cfg.renewBatchSet = false, false
	// Renewals due within a short window go out together: a twentieth of
	// the default interval, at most 20ms early.
	c.sched = renew.NewBatched(batcher{c}, renew.Batching{Max: cfg.renewBatch, Window: min(cfg.interval()/20, 20*time.Millisecond)})
	id, err := uuid.NewRandom()
	if err != nil {
		return nil, fmt.Errorf("redlock: client ID: %w", err)
	}
	c.id = id.String()
	c.wake = newWakeups(c, c.channelPrefix()+c.id)
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
	case strings.HasSuffix(resource, scripts.QueueSuffix) || strings.HasSuffix(resource, scripts.ExpirySuffix):
		return invalid("resource %q: the suffixes %q and %q are reserved for waiter queues", resource, scripts.QueueSuffix, scripts.ExpirySuffix)
	case strings.Contains(resource, scripts.GuardSuffix):
		return invalid("resource %q: %q is reserved for release guards", resource, scripts.GuardSuffix)
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

	return c.acquire(ctx, callID, resource, cfg, once, &attempts)
}

// channelPrefix is the prefix of the Clients' wake-up channels: a
// release tells the first waiter's Client on prefix + its ID.
func (c *Client) channelPrefix() string { return c.cfg.keyPrefix + "wake:" }

// acquire is Lock's attempt loop (TryLock: one attempt). One token serves
// the whole call, so that the waiter queued on the nodes (step 9) is the
// one a release hands the key to; a token is replaced only when an attempt
// ended with a request of ours unanswered that could still change the key
// (see settle).
//
// Nothing slow runs between a grant and the return (step 6): leaving the
// wake-up registry and this Client's line only unregisters, and the lock's
// validity is checked last, so an expired lock is never returned.
func (c *Client) acquire(ctx context.Context, callID uint64, resource string, cfg config, once bool, attempts *int) (*Lock, error) {
	var delay backoff.BackOff = jitter{cfg.retryMin, cfg.retryMax}
	var timer *time.Timer
	var w *waiter // set once this call waits for a handoff (step 9)
	defer func() {
		if timer != nil {
			timer.Stop()
		}
		if w != nil {
			w.leave()
		}
	}()
	ticket := time.Now().UnixMicro()
	l, err := c.newLock(resource, cfg)
	if err != nil {
		return nil, err
	}
	// A Client that has waited before listens already: queue from the
	// first attempt, which saves a refused round under contention.
	if !once && cfg.wakeUp && c.wake.awaitReady(ctx, 0) {
		if w, err = c.wake.join(l.token); err != nil {
			return nil, err
		}
		l.waiter = scripts.Waiter{Member: scripts.Member(c.id, l.token), Ticket: ticket, Lapse: cfg.lapse()}
	}
	var verdict error // the error of the last attempt that settled anything
	for attempt := 1; ; attempt++ {
		*attempts = attempt
		t, err, settled := c.attempt(ctx, callID, l)
		if err == nil {
			if l.Valid() {
				return l, nil
			}
			// Validity ran out between the decision and here (the process
			// was starved or paused): never hand out an expired lock.
			c.drop(ctx, l)
			err, settled = fmt.Errorf("%w: granted, but its validity ran out before Lock could return it", ErrNotObtained), true
			next, nerr := c.newLockLike(l, w)
			if nerr != nil {
				return nil, nerr
			}
			l = next
		}
		if errors.Is(err, ErrClosed) {
			c.abandon(ctx, l, t)
			return nil, err
		}
		// An attempt cut short by ctx says nothing about the nodes: the
		// last attempt that did tells contention from an outage.
		if settled {
			verdict = err
		} else if verdict != nil {
			err = verdict
		}
		if ctx.Err() != nil || once || (cfg.retryCount > 0 && attempt >= cfg.retryCount) {
			c.abandon(ctx, l, t)
			if ctx.Err() != nil {
				return nil, errors.Join(err, ctx.Err())
			}
			return nil, err
		}
		// Between attempts: grants of a failed attempt go to older waiters
		// (or back, without a queue), so that split votes settle.
		if !c.settle(ctx, l, t) {
			c.abandon(ctx, l, quorum.Tally{})
			next, nerr := c.newLockLike(l, w)
			if nerr != nil {
				return nil, nerr
			}
			l = next
		}
		// Step 9: after the first refusal, wait in the queue: subscribe
		// this Client's channel (once per Client), then queue on the nodes
		// with the next attempt, made at once.
		if w == nil && cfg.wakeUp && errors.Is(err, ErrNotObtained) {
			if w, err = c.wake.join(l.token); err != nil {
				c.abandon(ctx, l, quorum.Tally{})
				return nil, err
			}
			if c.wake.awaitReady(ctx, cfg.timeout()) {
				l.waiter = scripts.Waiter{Member: scripts.Member(c.id, l.token), Ticket: ticket, Lapse: cfg.lapse()}
			}
			continue
		}
		if w != nil && l.waiter.Member == "" && c.wake.awaitReady(ctx, 0) {
			l.waiter = scripts.Waiter{Member: scripts.Member(c.id, l.token), Ticket: ticket, Lapse: cfg.lapse()}
		}
		d := delay.NextBackOff()
		if l.waiter.Member == "" && t.Yes > 0 && t.No < c.quorum {
			// A split vote without a queue: nobody holds the lock on a
			// majority, but the others that lost it too will retry; a
			// short random pause breaks the tie sooner than the full
			// retry delay. (When a majority refused, someone holds it:
			// that is contention.)
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
		case <-woken: // a release handed us the key somewhere: confirm at once
		case <-ctx.Done():
			c.abandon(ctx, l, quorum.Tally{})
			return nil, errors.Join(err, ctx.Err())
		case <-c.closing:
			c.abandon(ctx, l, quorum.Tally{})
			return nil, ErrClosed
		}
	}
}

// newLock returns a lock for one Lock or TryLock call on resource, with a
// fresh token, not yet held.
func (c *Client) newLock(resource string, cfg config) (*Lock, error) {
	id, err := uuid.NewRandom() // v4, 122 bits from crypto/rand
	if err != nil {
		return nil, fmt.Errorf("redlock: token: %w", err)
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
		state:    stateFinished, // held only once hold has run
	}
	for i := range c.nodes {
		// Plain nodes share one set of keys; Cluster nodes need hash tags.
		if i > 0 && !c.nodes[i].cluster && !c.nodes[i-1].cluster {
			l.keys[i] = l.keys[i-1]
			continue
		}
		l.keys[i] = c.nodes[i].keys(c.cfg.keyPrefix, resource, cfg.fencing, l.token)
	}
	return l, nil
}

// newLockLike replaces the call's lock with one of a fresh token, queued
// with the same ticket; the waiter follows the new token.
func (c *Client) newLockLike(old *Lock, w *waiter) (*Lock, error) {
	l, err := c.newLock(old.resource, old.cfg)
	if err != nil {
		return nil, err
	}
	if old.waiter.Member != "" {
		l.waiter = old.waiter
		l.waiter.Member = scripts.Member(c.id, l.token)
	}
	if w != nil {
		w.retoken(l.token)
	}
	return l, nil
}

// drop takes back a lock granted but never handed out: its renewal stops
// and it is released, without hooks (the caller never saw it).
func (c *Client) drop(ctx context.Context, l *Lock) {
	l.mu.Lock()
	h := l.handle
	l.mu.Unlock()
	if h != nil {
		h.Stop()
	}
	l.finish(nil)
	c.mu.Lock()
	delete(c.locks, l)
	c.mu.Unlock()
	l.releaseAll(ctx)
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

// attempt is one acquisition round for l (DESIGN steps 1–3, and 8 with
// fencing): on success l is held. It returns the tally of phase 1 and the
// error, and whether the attempt settled anything: false when ctx ended
// before the nodes that could have made the difference answered.
func (c *Client) attempt(ctx context.Context, callID uint64, l *Lock) (quorum.Tally, error, bool) {
	start := time.Now()
	t, err, settled := c.try(ctx, l)
	if obs := l.cfg.obs; obs != nil {
		obs.Attempt(ctx, AttemptInfo{Call: callID, Resource: l.resource, Latency: time.Since(start), Granted: t.Yes,
			Quorum: c.quorum, Nodes: len(c.nodes), Outcome: outcomeOf(err), Err: err, NodeErrors: c.nodeErrors(t)})
	}
	return t, err, settled
}

// try is attempt without the hook.
func (c *Client) try(ctx context.Context, l *Lock) (quorum.Tally, error, bool) {
	cfg, n := l.cfg, len(c.nodes)
	w := l.waiter
	// Step 1: one parallel round on every node.
	r := quorum.Start(ctx, n, cfg.timeout(), &c.wg, func(ctx context.Context, i int) (reply, error) {
		return call(c, ctx, i, site{cfg.obs, "acquire", l.resource}, func(ctx context.Context, s redis.Scripter) (reply, error) {
			ok, fence, err := acquireOn(ctx, s, l.keys[i], l.token, cfg, w) // guard.go
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
			return t, c.hold(ctx, l, deadline), true
		}
		t2 := c.commitFence(ctx, l, r)
		if t2.Quorum() && time.Now().Before(deadline) {
			return t, c.hold(ctx, l, deadline), true
		}
		err, settled := c.attemptError(t2, cfg)
		return t, err, settled
	}
	err, settled := c.attemptError(t, cfg)
	return t, err, settled
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
// refusals alone made a majority impossible (or a majority granted too late
// to leave any validity), ErrNoQuorum when nodes failed — errors, or no
// answer within the node timeout — where they could have made the
// difference. Nodes cut short because ctx ended before their node timeout
// are neither: the caller gave up on them. An attempt decided only by such
// nodes settles nothing (settled is false); it is ErrNoQuorum, as too few
// nodes answered, and the caller may prefer an earlier attempt's verdict.
// Node errors are joined either way.
func (c *Client) attemptError(t quorum.Tally, cfg config) (err error, settled bool) {
	n := len(c.nodes)
	if t.Quorum() {
		return fmt.Errorf("%w: a majority granted after %v, which left no validity of the TTL %v", ErrNotObtained, t.Elapsed.Round(time.Millisecond), cfg.ttl), true
	}
	cut := t.CutShort()
	var head error
	switch {
	case t.No > n-c.quorum:
		head = fmt.Errorf("%w: %d of %d nodes hold another owner's key", ErrNotObtained, t.No, n)
	case t.Failed > cut:
		head = fmt.Errorf("%w: %d of %d nodes granted, %d needed (%d failed, %d refused)", ErrNoQuorum, t.Yes, n, c.quorum, t.Failed-cut, t.No)
	default:
		return c.joinNodeErrors(fmt.Errorf("%w: %d of %d nodes granted, %d needed; %d refused, %d did not answer before ctx ended",
			ErrNoQuorum, t.Yes, n, c.quorum, t.No, cut), t), false
	}
	return c.joinNodeErrors(head, t), true
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
func (c *Client) hold(ctx context.Context, l *Lock, validUntil time.Time) error {
	l.mu.Lock()
	l.state = stateHeld
	l.validUntil = validUntil
	l.mu.Unlock()
	l.acquired = time.Now()
	l.id = c.ids.Add(1)
	l.ctx, l.cancel = context.WithCancelCause(context.WithoutCancel(ctx))
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		l.finish(ErrClosed)
		return ErrClosed
	}
	c.locks[l] = struct{}{}
	c.mu.Unlock()
	h, err := c.sched.Add(watch{l}, renew.Options{AutoRenew: l.cfg.autoRenew, Interval: l.cfg.interval()})
	if err != nil { // closed meanwhile; Close will release it
		return ErrClosed
	}
	l.mu.Lock()
	l.handle = h
	l.mu.Unlock()
	return nil
}

// settle is what a failed attempt leaves between two attempts of a Lock
// call. The nodes that granted keep our key or pass it on: a queued call
// yields each to an older waiter queued there (who is told), so that split
// votes settle toward the oldest ticket; a call not queued gives them back.
// Requests of ours still unanswered may grant later; that is harmless, as
// the next attempt carries the same token. settle waits for its requests,
// each bounded by the node timeout, and reports whether every one
// answered: if not, a late one could still hand over a key that our next
// attempt counts, so the caller must go on with a fresh token.
func (c *Client) settle(ctx context.Context, l *Lock, t quorum.Tally) bool {
	dctx := context.WithoutCancel(ctx)
	yield := l.waiter.Member != ""
	var wg sync.WaitGroup
	var unsure atomic.Bool
	for i, v := range t.Votes {
		if v != quorum.Yes {
			continue
		}
		wg.Go(func() {
			rctx, cancel := context.WithTimeout(dctx, l.cfg.timeout())
			defer cancel()
			_, err := call(c, rctx, i, site{l.cfg.obs, "release", l.resource}, func(ctx context.Context, s redis.Scripter) (scripts.Released, error) {
				return l.releaseScript(ctx, i, s, 0, yield)
			})
			if err != nil && !answered(err) {
				unsure.Store(true)
			}
		})
	}
	wg.Wait()
	return !unsure.Load()
}

// abandon ends a Lock call's lock that was never handed out (step 4): it
// is released on every node where anything of ours may be — nodes that
// granted, nodes that have not answered (with the token's guard, so that an
// acquire still on its way sets nothing when it lands), and, for a queued
// call, every node, to take our queue entry out. It waits for those
// releases, each bounded by the node timeout, unless the caller gave up:
// then they finish in the background. t is the last attempt's tally (zero:
// release everywhere).
func (c *Client) abandon(ctx context.Context, l *Lock, t quorum.Tally) {
	l.mu.Lock()
	l.state = stateFinished
	l.mu.Unlock()
	dctx := context.WithoutCancel(ctx)
	wait := ctx.Err() == nil
	var wg sync.WaitGroup
	for i := range c.nodes {
		if t.Votes != nil && t.Votes[i] == quorum.No && l.waiter.Member == "" && l.guardFor(i) == 0 {
			continue // refused, and no request of ours unanswered: nothing of ours there
		}
		rel := func() {
			rctx, cancel := context.WithTimeout(dctx, l.cfg.timeout())
			defer cancel()
			_, _ = l.releaseNode(rctx, i)
		}
		if wait {
			wg.Go(rel)
		} else {
			c.wg.Go(rel)
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
			ok, err := scripts.Exists(ctx, s, c.nodes[i].keys(c.cfg.keyPrefix, resource, false, "").Lock)
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
	wait := c.maxWait
	deadline := time.Now().Add(wait + closeGrace)
	c.mu.Unlock()

	c.sched.Close()
	ls := make([]*Lock, 0, len(locks))
	for l := range locks {
		l.reportExpiry()
		l.finish(ErrClosed)
		ls = append(ls, l)
	}
	// One round of pipelines for every lock: bounded by the node timeout
	// and the grace whatever the number of locks (thousands of releases
	// take a node some milliseconds).
	errs := c.releaseMany(ls, wait+closeGrace)
	c.wake.close()
	waitTimeout(&c.wg, time.Until(deadline))
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
