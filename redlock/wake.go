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

// nodeSub is the subscription connection to one node and its reader.
type nodeSub struct {
	ps   *redis.PubSub
	done chan struct{} // closed when the reader has returned
}

func newWakeups(c *Client) *wakeups {
	return &wakeups{c: c, subs: make([]*nodeSub, len(c.nodes)), entries: make(map[string]*wakeEntry)}
}

// join registers a waiter on channel, subscribing on every node if it is the
// Client's first waiter there. The caller must be inside an operation
// (Client.begin), and must call leave.
func (w *wakeups) join(channel string) (*waiter, error) {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil, ErrClosed
	}
	wt := &waiter{w: w, channel: channel, c: make(chan struct{}, 1)}
	e := w.entries[channel]
	first := e == nil
	if first {
		e = &wakeEntry{waiters: make(map[*waiter]struct{}), ready: make(chan struct{})}
		w.entries[channel] = e
	}
	e.waiters[wt] = struct{}{}
	wt.ready = e.ready
	var subs []*nodeSub
	if first {
		for i := range w.subs {
			subs = append(subs, w.sub(i))
		}
	}
	w.mu.Unlock()
	// Subscribe only writes the command (after dialing, the first time);
	// the reader sees the confirmation. Nodes are asked in parallel, outside
	// w.mu, so a node that hangs delays nobody else. A node that is down
	// fails here or later; the fallback delay covers it.
	var wg sync.WaitGroup
	for _, s := range subs {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), w.c.cfg.timeout())
			defer cancel()
			_ = s.ps.Subscribe(ctx, channel)
		})
	}
	wg.Wait()
	return wt, nil
}

// sub returns node i's subscription, starting it if needed. w.mu is held.
func (w *wakeups) sub(i int) *nodeSub {
	if s := w.subs[i]; s != nil {
		return s
	}
	s := &nodeSub{ps: w.c.nodes[i].c.Subscribe(context.Background()), done: make(chan struct{})}
	w.subs[i] = s
	w.c.wg.Go(func() { w.read(s) })
	return s
}

// read delivers node messages to waiters until the subscription is closed.
func (w *wakeups) read(s *nodeSub) {
	defer close(s.done)
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
				w.confirmed(m.Channel)
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

func (w *wakeups) confirmed(channel string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	e := w.entries[channel]
	if e == nil {
		return
	}
	e.confirm++
	if e.confirm == w.c.quorum {
		close(e.ready)
	}
}

// leave unregisters the waiter, and unsubscribes the channel when it was
// the last one.
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
	if w.closed {
		return
	}
	for _, s := range w.subs {
		if s != nil {
			ctx, cancel := context.WithTimeout(context.Background(), w.c.cfg.timeout())
			_ = s.ps.Unsubscribe(ctx, wt.channel)
			cancel()
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

// close closes every subscription and waits for the readers.
func (w *wakeups) close() {
	w.mu.Lock()
	w.closed = true
	subs := w.subs
	w.mu.Unlock()
	for _, s := range subs {
		if s != nil {
			_ = s.ps.Close()
			<-s.done
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
