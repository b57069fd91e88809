package redlock

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/quorumlock/quorumlock/internal/node"
	"github.com/quorumlock/quorumlock/internal/scripts"
)

// The Client's background releases (DESIGN step 4). A call returns once its
// outcome is decided; a release a node has not confirmed — the node timed
// out, the connection broke, the node was busy (errBusy) or answered with an
// error — becomes a pending release of that node, and one retry loop per
// node sends its pending releases, up to relChunk of them in one pipeline,
// until the node answers each. A release that never left the client (the
// dial was refused, the name did not resolve) cannot land, and one is queued
// for it only where a request of the lock may still land (node.Release).
//
// Memory: a pending release is the lock's keys on that node (a
// scripts.Keys value, 232 bytes, whose strings and slices it shares with
// the Lock) with its guard and node (node.Part), its arguments with the
// guard (six boxed values) and its deadline: 937 bytes measured with the strings it keeps alive and the
// queue's slack, for a resource name of 20 bytes and a queued member. One
// that never left the client while a request of its lock was in flight
// there also keeps the lock's node.Token (a few KB with its rounds) until that request has ended and
// tells whether it left. A node holds at most maxPending of them (about
// 15 MB); past that the oldest is dropped, its key left to its TTL. A
// pending release is given up after retryWindow. At 100 unlocks a second
// with a node paused, a minute's releases (6,000) fit.
const (
	// maxPending caps the pending releases of one node.
	maxPending = 1 << 14
	// relChunk is how many pending releases one round of a retry loop
	// sends to its node, in one pipeline (the node layer's pipeline
	// carries 512 commands at most).
	relChunk = 512
	// retryMax is the longest pause between two rounds of a retry loop.
	retryMax = time.Second
)

// pendingRelease is one lock's release that a node has not confirmed.
type pendingRelease struct {
	part  node.Part // the lock's keys on that node and the guard (node.Release)
	args  []any     // with that guard
	until time.Time // given up after this
}

// releaser owns the per-node retry loops of a Client.
type releaser struct {
	c     *Client
	nodes []relQueue
	g     errgroup.Group // the loops; zero Group: one loop's failure cancels nothing

	mu      sync.Mutex // protects stopped and relQueue.running
	stopped bool
}

// relQueue is one node's pending releases and its loop's controls.
type relQueue struct {
	mu      sync.Mutex // protects q, head, sending, dropped, done
	q       []pendingRelease
	head    int  // q[head:] are pending
	sending int  // taken by the loop's round in flight
	dropped int  // releases dropped for the cap, for tests
	done    bool // Close has drained this node: no more releases are taken
	running bool // the loop has started (releaser.mu)
	kick    chan struct{}
	stop    chan struct{} // closed to stop this node's loop
	exited  chan struct{} // closed when the loop has returned
}

func newReleaser(c *Client) *releaser {
	r := &releaser{c: c, nodes: make([]relQueue, len(c.nodes))}
	for i := range r.nodes {
		q := &r.nodes[i]
		q.kick = make(chan struct{}, 1)
		q.stop = make(chan struct{})
		q.exited = make(chan struct{})
	}
	return r
}

// add makes the release p, whose arguments are args, pending with its
// node's loop (given up after retryWindow of the lock's ttl), and starts
// the loop if it is not running yet. After Close has drained the node,
// the release is left to the key's TTL.
func (r *releaser) add(p node.Part, args []any, ttl time.Duration) {
	i := p.Node
	q := &r.nodes[i]
	e := pendingRelease{part: p, args: args, until: time.Now().Add(retryWindow(ttl))}
	q.mu.Lock()
	if q.done {
		q.mu.Unlock()
		return
	}
	if len(q.q)-q.head >= maxPending {
		q.q[q.head] = pendingRelease{}
		q.head++
		q.dropped++
	}
	q.q = append(q.q, e)
	q.mu.Unlock()
	select {
	case q.kick <- struct{}{}:
	default:
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped || q.running {
		return
	}
	q.running = true
	r.g.Go(func() error {
		defer close(q.exited)
		r.loop(i)
		return nil
	})
}

// pending returns how many releases node i has pending, with those of the
// round in flight.
func (r *releaser) pending(i int) int {
	q := &r.nodes[i]
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.q) - q.head + q.sending
}

// take removes up to k pending releases of node i, dropping those given
// up, and returns them.
func (q *relQueue) take(i, k int, now time.Time) []pendingRelease {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []pendingRelease
	for q.head < len(q.q) && len(out) < k {
		e := q.q[q.head]
		q.q[q.head] = pendingRelease{}
		q.head++
		if now.Before(e.until) {
			out = append(out, e)
		}
	}
	q.compact()
	q.sending += len(out)
	return out
}

// putBack ends a round of sent releases: es, those the node did not
// confirm, go back ahead of the others.
func (q *relQueue) putBack(sent int, es []pendingRelease) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.sending -= sent
	if len(es) == 0 || q.done {
		return
	}
	if q.head >= len(es) {
		q.head -= len(es)
		copy(q.q[q.head:], es)
	} else {
		q.q = append(es[:len(es):len(es)], q.q[q.head:]...)
		q.head = 0
	}
	for len(q.q)-q.head > maxPending {
		q.q[q.head] = pendingRelease{}
		q.head++
		q.dropped++
	}
}

// compact keeps q's backing array from growing without bound. q.mu is held.
func (q *relQueue) compact() {
	switch {
	case q.head == len(q.q):
		clear(q.q)
		q.q, q.head = q.q[:0], 0
	case q.head > len(q.q)/2 && q.head > 1024:
		n := copy(q.q, q.q[q.head:])
		clear(q.q[n:])
		q.q, q.head = q.q[:n], 0
	}
}

// loop is node i's retry loop: while releases are pending, it sends up to
// relChunk of them in one pipeline, at once again when the node confirmed
// them all, else after a pause that doubles from the node timeout up to
// retryMax. The node's own answer is what ends a release: a timeout, a
// connection error, errBusy or an error reply keep it pending.
func (r *releaser) loop(i int) {
	q := &r.nodes[i]
	base := min(max(r.c.cfg.nodeTimeout, 10*time.Millisecond), retryMax)
	delay := base
	t := time.NewTimer(delay)
	defer t.Stop()
	for {
		idle := r.pending(i) == 0
		if idle {
			delay = base
		}
		select {
		case <-q.stop:
			return
		case <-q.kick:
			if !idle {
				continue // a round is due anyway: wait for its timer
			}
			// A release just became pending: its node did not answer it
			// within the node timeout a moment ago; try again after one.
			t.Reset(delay)
			continue
		case <-t.C:
		}
		es := q.take(i, relChunk, time.Now())
		if len(es) == 0 {
			continue
		}
		left := r.send(context.Background(), i, es)
		q.putBack(len(es), left)
		if len(left) == 0 && r.pending(i) > 0 {
			delay = base
			t.Reset(0) // the node is answering: on with the next chunk
			continue
		}
		if len(left) > 0 {
			delay = min(2*delay, retryMax)
		}
		t.Reset(delay)
	}
}

// send sends es to node i in one pipeline, bounded by the node timeout,
// and returns those the node did not confirm.
func (r *releaser) send(ctx context.Context, i int, es []pendingRelease) []pendingRelease {
	c := r.c
	ctx, cancel := context.WithTimeout(ctx, c.cfg.nodeTimeout)
	defer cancel()
	parts := partsOf(es)
	cmds, err := c.resend(ctx, i, parts, func(ctx context.Context, p redis.Pipeliner, j int) *redis.Cmd {
		return scripts.ReleaseCmd(ctx, p, es[j].part.Keys, es[j].args)
	})
	if err != nil {
		return es
	}
	var left []pendingRelease
	for j, cmd := range cmds {
		if cmd == nil {
			continue // need not be sent (node.Resend)
		}
		if _, err := scripts.ReleaseResult(cmd); err != nil {
			left = append(left, es[j]) // an error reply: again later
		}
	}
	return left
}

// partsOf returns the node layer's parts of es.
func partsOf(es []pendingRelease) []node.Part {
	parts := make([]node.Part, len(es))
	for j, e := range es {
		parts[j] = e.part
	}
	return parts
}

// resend sends parts, releases on node i, in pipelines of the release
// script (node.Resend), part j's command built by queue; cmds[j] is nil
// for a part the node layer found need not be sent. A failure is a
// *NodeError, reported to the hooks.
func (c *Client) resend(ctx context.Context, i int, parts []node.Part, queue func(ctx context.Context, p redis.Pipeliner, j int) *redis.Cmd) ([]*redis.Cmd, error) {
	cmds, err := node.Resend(ctx, c.set, i, parts, c.cfg.nodeTimeout, queue)
	if err != nil {
		return nil, c.nodeError(ctx, i, site{c.cfg.obs, "release", ""}, err)
	}
	return cmds, nil
}

// stopNode stops node i's loop without waiting for it; exited tells when
// it has returned (at once if it never ran).
func (r *releaser) stopNode(i int) (exited <-chan struct{}) {
	q := &r.nodes[i]
	r.mu.Lock()
	defer r.mu.Unlock()
	close(q.stop)
	if !q.running {
		q.running = true // never to start now
		close(q.exited)
	}
	return q.exited
}

// drain takes node i's pending releases for good: later ones are left to
// their keys' TTLs.
func (r *releaser) drain(i int) []pendingRelease {
	q := &r.nodes[i]
	q.mu.Lock()
	defer q.mu.Unlock()
	q.done = true
	es := q.q[q.head:]
	q.q, q.head = nil, 0
	now := time.Now()
	keep := es[:0]
	for _, e := range es {
		if now.Before(e.until) {
			keep = append(keep, e)
		}
	}
	return keep
}

// stop stops every loop and waits for them; Close calls it after it has
// drained every node.
func (r *releaser) stop() {
	r.mu.Lock()
	r.stopped = true
	r.mu.Unlock()
	_ = r.g.Wait()
}
