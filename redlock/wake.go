package redlock

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/scripts"
)

// wakeups tells waiting Lock calls that a release handed them the key
// (DESIGN step 9). A release that finds waiters queued on a node sets the
// key to the first one's token for its reservation and publishes that
// token, with the waiter's attempt the node recorded (see
// scripts.ParseHandoff), on its client's channel only: one channel per
// Client, subscribed once on every node (one connection per node, shared
// by all its waiters) when the Client first waits, and kept until Close. A
// release sets the key before it tells, so a message means the key holds
// the token on that node (until the token releases it, or the reservation
// ends); a majority of them make the waiter the holder (see handedTo). Its
// fallback attempts cover a message lost.
//
// Nothing that waits on a node runs in a Lock call or under mu: each node's
// subscription is made and read on a goroutine of its own. A node whose
// subscription connection hangs (paused while go-redis re-dials it, holding
// the PubSub's mutex) delays only that goroutine.
type wakeups struct {
	c       *Client
	channel string // this Client's channel

	mu   sync.Mutex // protects the fields below
	subs []*redis.PubSub
	// subscribing marks, per node, a reader still in its first SUBSCRIBE:
	// go-redis holds the PubSub's mutex across that dial and handshake, so
	// close leaves such a subscription for its reader to close once the
	// SUBSCRIBE returned (within the node timeout) instead of queueing on
	// the mutex (see close).
	subscribing []bool
	ready       chan struct{} // closed once a majority of nodes confirmed the subscription
	confirmed   []bool        // per node
	confirms    int
	waiters     map[string]*waiter // by token
	closed      bool
}

// waiter is one Lock call waiting for its token to be handed the key.
type waiter struct {
	w     *wakeups
	token string
	c     chan struct{} // buffered 1: a release handed us the key somewhere
	// Per node, under w.mu: the highest attempt number a message for token
	// named (the attempt that queued or last refreshed the entry the
	// release served: it was sent before the key was set), -1 for none.
	att   []int64
	count int // nodes with a message (under w.mu)
}

func newWakeups(c *Client, channel string) *wakeups {
	return &wakeups{c: c, channel: channel, ready: make(chan struct{}), confirmed: make([]bool, len(c.nodes)),
		waiters: make(map[string]*waiter)}
}

// join registers a waiter for token, subscribing the Client's channel on
// every node the first time. It never waits for a node. The caller must be
// inside an operation (Client.begin), and must call leave.
func (w *wakeups) join(token string) (*waiter, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil, ErrClosed
	}
	if w.subs == nil {
		w.subs = make([]*redis.PubSub, len(w.c.nodes))
		w.subscribing = make([]bool, len(w.c.nodes))
		for i := range w.subs {
			ps := w.c.nodes[i].C.Subscribe(context.Background()) // no channel yet: no I/O
			w.subs[i] = ps
			w.subscribing[i] = true
			w.c.wg.Go(func() { w.read(i, ps) })
		}
	}
	wt := &waiter{w: w, token: token, c: make(chan struct{}, 1), att: make([]int64, len(w.c.nodes))}
	wt.reset()
	w.waiters[token] = wt
	return wt, nil
}

// read subscribes node i's connection to the Client's channel, then
// delivers its messages until the subscription is closed. go-redis
// remembers the channel even when SUBSCRIBE fails, and subscribes again
// whenever it reconnects.
func (w *wakeups) read(i int, ps *redis.PubSub) {
	ctx, cancel := context.WithTimeout(context.Background(), w.c.cfg.nodeTimeout)
	_ = ps.Subscribe(ctx, w.channel)
	cancel()
	w.mu.Lock()
	w.subscribing[i] = false
	closed := w.closed
	w.mu.Unlock()
	if closed { // close left it to us (see close)
		_ = ps.Close()
		return
	}
	fails := 0
	for {
		msg, err := ps.Receive(context.Background())
		if err != nil {
			w.mu.Lock()
			closed := w.closed
			w.mu.Unlock()
			if closed || errors.Is(err, redis.ErrClosed) {
				return
			}
			// The node is down or the connection broke: go-redis
			// reconnects and subscribes again on the next Receive. Until
			// then, waiters fall back to their retry delay.
			fails++
			select {
			case <-time.After(min(time.Duration(fails)*50*time.Millisecond, time.Second)):
			case <-w.c.closing:
				return
			}
			continue
		}
		fails = 0
		switch m := msg.(type) {
		case *redis.Message:
			w.notify(i, m.Payload)
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				w.confirm(i)
			}
		}
	}
}

// notify records that node i handed the key to the token a message
// names, and wakes its waiter.
func (w *wakeups) notify(i int, payload string) {
	token, attempt := scripts.ParseHandoff(payload)
	w.mu.Lock()
	defer w.mu.Unlock()
	if wt := w.waiters[token]; wt != nil {
		if wt.att[i] < 0 {
			wt.count++
		}
		wt.att[i] = max(wt.att[i], attempt)
		select {
		case wt.c <- struct{}{}:
		default:
		}
	}
}

func (w *wakeups) confirm(i int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.confirmed[i] {
		return
	}
	w.confirmed[i] = true
	w.confirms++
	if w.confirms == w.c.quorum {
		close(w.ready)
	}
}

// awaitReady waits until a majority of nodes confirmed the subscription, at
// most d, and reports whether they have: a waiter queues on the nodes only
// then, so that a handoff cannot go to a channel nobody reads yet (if one
// does, the waiter's fallback attempt finds the key and confirms it).
func (w *wakeups) awaitReady(ctx context.Context, d time.Duration) bool {
	select {
	case <-w.ready:
		return true
	default:
	}
	if d <= 0 {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-w.ready:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

// leave unregisters the waiter. It never waits for a node.
func (wt *waiter) leave() {
	w := wt.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.waiters[wt.token] == wt {
		delete(w.waiters, wt.token)
	}
}

// retoken moves the waiter to a new token of its Lock call.
func (wt *waiter) retoken(token string) {
	w := wt.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.waiters[wt.token] == wt {
		delete(w.waiters, wt.token)
	}
	wt.token = token
	wt.reset()
	w.waiters[token] = wt
}

// reset forgets every message (under w.mu, or before wt is shared).
func (wt *waiter) reset() {
	for i := range wt.att {
		wt.att[i] = -1
	}
	wt.count = 0
}

// handed returns on how many nodes a release handed the key to token (0
// when token is not the waiter's current one).
func (wt *waiter) handed(token string) int {
	w := wt.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if wt.token != token {
		return 0
	}
	return wt.count
}

// handedAttempts returns, per node, the attempt number the latest message
// for token named (-1: none), or nil when token is not the waiter's
// current one.
func (wt *waiter) handedAttempts(token string) []int64 {
	w := wt.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if wt.token != token {
		return nil
	}
	return slices.Clone(wt.att)
}

// close closes every subscription without waiting: closing one may wait
// for go-redis to finish re-dialing its node. The readers and closes are
// the Client's goroutines; Close waits for them, bounded. A subscription
// whose reader is still in its first SUBSCRIBE is left to that reader,
// which closes it once the SUBSCRIBE returns (bounded by the node
// timeout): go-redis holds the PubSub's mutex across that dial and
// handshake, and a goroutine queued on a mutex stops the simulator's
// fake clock, so the handshake's own deadline could never come (seed 316
// hung beside the race suite, twice). Both sides read and write
// subscribing and closed under mu, so exactly one of them closes it.
func (w *wakeups) close() {
	w.mu.Lock()
	w.closed = true
	var subs []*redis.PubSub
	for i, ps := range w.subs {
		if !w.subscribing[i] {
			subs = append(subs, ps)
		}
	}
	w.mu.Unlock()
	for _, ps := range subs {
		w.c.wg.Go(func() { _ = ps.Close() })
	}
}
