package redlock

import (
	"context"
	"errors"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// wakeups wakes waiting Lock calls when a release is published (DESIGN step
// 9). A Client keeps one subscription connection per node, shared by all its
// waiters (not one connection per waiter); a channel is subscribed while at
// least one of the Client's waiters wants it.
//
// Nothing that waits on a node runs in a Lock call or under mu: joining and
// leaving only change the set of wanted channels and kick each node's
// worker, which subscribes and unsubscribes on its own goroutine. A node
// whose subscription connection hangs (paused while go-redis re-dials it,
// holding the PubSub's mutex) delays only its own worker.
type wakeups struct {
	c *Client

	mu      sync.Mutex // protects the fields below
	subs    []*nodeSub // per node; nil until first needed
	entries map[string]*wakeEntry
	closed  bool
}

// wakeEntry is one channel and the waiters on it.
type wakeEntry struct {
	waiters map[*waiter]struct{}
	ready   chan struct{} // closed once a majority of nodes confirmed the subscription
	by      []bool        // per node: confirmed
	confirm int           // nodes that confirmed so far
}

// waiter is one Lock call waiting for a release.
type waiter struct {
	w       *wakeups
	channel string
	c       chan struct{} // buffered 1: a release was published
	rivals  atomic.Int32  // clients waiting on the node, as the last release said
	ready   <-chan struct{}
}

// nodeSub is the subscription connection to one node, its reader and its
// worker.
type nodeSub struct {
	i    int
	ps   *redis.PubSub
	kick chan struct{} // buffered 1: the wanted channels changed
}

func newWakeups(c *Client) *wakeups {
	return &wakeups{c: c, subs: make([]*nodeSub, len(c.nodes)), entries: make(map[string]*wakeEntry)}
}

// join registers a waiter on channel; the nodes' workers subscribe to it
// if it is the Client's first waiter there. It never waits for a node. The
// caller must be inside an operation (Client.begin), and must call leave.
func (w *wakeups) join(channel string) (*waiter, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil, ErrClosed
	}
	wt := &waiter{w: w, channel: channel, c: make(chan struct{}, 1)}
	e := w.entries[channel]
	if e == nil {
		e = &wakeEntry{waiters: make(map[*waiter]struct{}), ready: make(chan struct{}), by: make([]bool, len(w.subs))}
		w.entries[channel] = e
		for i := range w.subs {
			w.sub(i).poke()
		}
	}
	e.waiters[wt] = struct{}{}
	wt.ready = e.ready
	return wt, nil
}

// sub returns node i's subscription, starting its reader and worker if
// needed. w.mu is held.
func (w *wakeups) sub(i int) *nodeSub {
	if s := w.subs[i]; s != nil {
		return s
	}
	s := &nodeSub{i: i, ps: w.c.nodes[i].c.Subscribe(context.Background()), kick: make(chan struct{}, 1)}
	w.subs[i] = s
	w.c.wg.Go(func() { w.read(s) })
	w.c.wg.Go(func() { w.work(s) })
	return s
}

func (s *nodeSub) poke() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// work brings node s's subscriptions in line with the wanted channels
// whenever they change, until the Client closes. Subscribe and Unsubscribe
// may block (go-redis holds the PubSub's mutex while it reconnects); only
// this goroutine waits for them. go-redis remembers the channels even when
// the command fails, and subscribes to them again when it reconnects.
func (w *wakeups) work(s *nodeSub) {
	have := make(map[string]bool)
	for {
		select {
		case <-s.kick:
		case <-w.c.closing:
			return
		}
		var add, drop []string
		w.mu.Lock()
		for ch, e := range w.entries {
			if have[ch] {
				// Subscribed since an earlier waiter: no confirmation will
				// come, so count this node as confirmed now.
				w.confirmedLocked(s.i, ch, e)
			} else {
				add = append(add, ch)
			}
		}
		for ch := range have {
			if w.entries[ch] == nil {
				drop = append(drop, ch)
			}
		}
		w.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), w.c.cfg.timeout())
		if len(add) > 0 {
			_ = s.ps.Subscribe(ctx, add...)
		}
		if len(drop) > 0 {
			_ = s.ps.Unsubscribe(ctx, drop...)
		}
		cancel()
		for _, ch := range add {
			have[ch] = true
		}
		for _, ch := range drop {
			delete(have, ch)
		}
	}
}

// read delivers node messages to waiters until the subscription is closed.
func (w *wakeups) read(s *nodeSub) {
	fails := 0
	for {
		msg, err := s.ps.Receive(context.Background())
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
			w.notify(m.Channel, m.Payload)
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				w.mu.Lock()
				if e := w.entries[m.Channel]; e != nil {
					w.confirmedLocked(s.i, m.Channel, e)
				}
				w.mu.Unlock()
			}
		}
	}
}

func (w *wakeups) notify(channel, payload string) {
	waiting, err := strconv.Atoi(payload)
	if err != nil {
		waiting = 2
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if e := w.entries[channel]; e != nil {
		for wt := range e.waiters {
			wt.rivals.Store(int32(waiting))
			select {
			case wt.c <- struct{}{}:
			default:
			}
		}
	}
}

// confirmedLocked counts node i's confirmation of channel. w.mu is held.
func (w *wakeups) confirmedLocked(i int, channel string, e *wakeEntry) {
	if e.by[i] {
		return
	}
	e.by[i] = true
	e.confirm++
	if e.confirm == w.c.quorum {
		close(e.ready)
	}
}

// leave unregisters the waiter; when it was the last on its channel, the
// workers unsubscribe. It never waits for a node.
func (wt *waiter) leave() {
	w := wt.w
	w.mu.Lock()
	defer w.mu.Unlock()
	e := w.entries[wt.channel]
	if e == nil {
		return
	}
	delete(e.waiters, wt)
	if len(e.waiters) > 0 {
		return
	}
	delete(w.entries, wt.channel)
	for _, s := range w.subs {
		if s != nil {
			s.poke()
		}
	}
}

// awaitReady waits until a majority of nodes confirmed the subscription, at
// most d, so that an attempt made afterwards cannot miss a release published
// on those nodes in between.
func (wt *waiter) awaitReady(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-wt.ready:
	case <-t.C:
	case <-ctx.Done():
	}
}

// close closes every subscription without waiting: closing one may wait
// for go-redis to finish re-dialing its node. The readers, workers and
// closes are the Client's goroutines; Close waits for them, bounded.
func (w *wakeups) close() {
	w.mu.Lock()
	w.closed = true
	subs := w.subs
	w.mu.Unlock()
	for _, s := range subs {
		if s != nil {
			w.c.wg.Go(func() { _ = s.ps.Close() })
		}
	}
}

// agePause is how long a woken waiter lets others go first when several
// clients wait: the longer it has waited, the shorter the pause, so the
// oldest waiter usually attempts first and wins — an approximation of a
// queue across clients without one on the nodes. It falls from 4ms (just
// started waiting) on a log scale: 2.6ms at 50ms waited, 1.3ms at 500ms,
// 0 from about 5s.
func agePause(waited time.Duration) time.Duration {
	const most = 4 * time.Millisecond
	f := 1 - math.Log2(1+float64(waited)/float64(5*time.Millisecond))/10
	if f <= 0 {
		return 0
	}
	return time.Duration(f * float64(most))
}
