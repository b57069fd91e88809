package redlock

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/quorumlock/quorumlock/internal/node"
	"github.com/quorumlock/quorumlock/internal/scripts"
	"github.com/quorumlock/quorumlock/quorum"
	"github.com/redis/go-redis/v9"
)

// How a lock's rounds use the node layer's unit (node.Token, DESIGN step
// 4): register registers a round in one step with the check that the lock
// may send it (under l.mu, as Unlock's, Detach's and Close's finish change
// the state), and fixes its start; startRound sends it from that start.

// register registers a round of l before anything of it is sent, and fixes
// its start (node.Token.Register). With held, it does so only in one step
// with the check that the lock is held and valid; it then returns the
// error of usable. Without held (an acquire attempt, its fence commit and
// yields, Resume's rounds, Detach's leaving the queues: the lock is not
// handed out, and its release comes from the same goroutine after the
// round), it always registers.
func (l *Lock) register(held bool) (*node.Pending, error) {
	open := l.heldNow
	if !held {
		open = nil
	}
	for {
		if p, ok := l.tok.Register(&l.mu, open); ok {
			return p, nil
		}
		if err := l.usable(); err != nil {
			return nil, err
		}
	}
}

// heldNow reports whether l is held and valid. l.mu is held.
func (l *Lock) heldNow() bool { return l.state == stateHeld && time.Now().Before(l.validUntil) }

// startRound sends the registered round p to every node (node.Send).
func startRound[T any](ctx context.Context, l *Lock, p *node.Pending, timeout time.Duration, fn func(ctx context.Context, i int) (T, error)) *quorum.Round[T] {
	return node.Send(ctx, l.tok, p, timeout, &l.c.wg, fn)
}

// round registers a round of l and sends it (register, startRound).
func round[T any](ctx context.Context, l *Lock, held bool, timeout time.Duration, fn func(ctx context.Context, i int) (T, error)) (*quorum.Round[T], error) {
	p, err := l.register(held)
	if err != nil {
		return nil, err
	}
	return startRound(ctx, l, p, timeout, fn), nil
}

// site says what a request is for, so that a failure can be reported.
type site struct {
	obs      Hooks // nil: none
	op       string
	resource string
}

// call runs fn on node i through the node layer (node.Call: the identity
// check before this Client's first request to a node, the down-node and
// stuck-node gate, the in-flight cap, the classification of what a failed
// request may have done), and turns any failure into a *NodeError,
// reported to the hooks. Releases and publishes go out even once two
// nodes were found to reach one server (a lock granted before it was
// found must still be released); nothing else does.
func call[T any](c *Client, ctx context.Context, i int, at site, fn func(ctx context.Context, s redis.Scripter) (T, error)) (T, error) {
	lockOp := at.op != "release" && at.op != "publish"
	v, err := node.Call(ctx, c.set, i, lockOp, c.cfg.timeout(), fn)
	if err == nil {
		return v, nil
	}
	if scriptRefused(err) && !strings.Contains(err.Error(), "+info") {
		err = fmt.Errorf("%w (the node's ACL user lacks a command the library's scripts call: see the minimal ACL in the README)", err)
	}
	addr := c.nodes[i].Addr
	if at.obs != nil {
		at.obs.NodeError(ctx, NodeErrorInfo{Resource: at.resource, Op: at.op, Node: i, Addr: addr, Kind: errorKind(err), Err: err})
	}
	var zero T
	return zero, &NodeError{Node: i, Addr: addr, Err: err}
}

// scriptRefused reports whether err is a node refusing a command inside a
// script for want of an ACL right.
func scriptRefused(err error) bool {
	return err != nil && strings.Contains(err.Error(), "can't run this command")
}

// relKey names a lock key on one node; Client.releasing holds, per
// relKey, one channel per release of it in flight there, closed when that
// release ends.
type relKey struct {
	key  string // the lock key on the node
	node int
}

// releaseBegin registers a release of keys on node i (under each of its
// lock keys: a multi-lock's every resource), before it is handed to a
// goroutine or sent; done ends it. Every sender of a release registers
// it: Unlock's round, a refused call's cleanup and a lost call's abandon
// (release.go), and the retry loop's pipelines (releaser.go). This
// Client's next acquire of any of those keys waits on each node for the
// releases registered there before its round was (releasesBefore), so
// that its own leftovers never refuse it: a TryLock right after a refused
// one found the first one's grant still there
// (TestReal_evenNNeedsThreeOfFour, once beside stress-ng).
func (c *Client) releaseBegin(keys scripts.Keys, i int) (done func()) {
	locks := keys.LockKeys()
	f := make(chan struct{}) // closed when the release has ended
	c.relMu.Lock()
	if c.releasing == nil {
		c.releasing = make(map[relKey][]chan struct{})
	}
	for _, key := range locks {
		k := relKey{key, i}
		c.releasing[k] = append(c.releasing[k], f)
	}
	c.relMu.Unlock()
	return func() {
		c.relMu.Lock()
		for _, key := range locks {
			k := relKey{key, i}
			fs := c.releasing[k]
			if j := slices.Index(fs, f); j >= 0 {
				fs = slices.Delete(fs, j, j+1)
			}
			if len(fs) == 0 {
				delete(c.releasing, k)
			} else {
				c.releasing[k] = fs
			}
		}
		c.relMu.Unlock()
		close(f)
	}
}

// releasesBefore returns, per node, this Client's releases of keys in
// flight now (nil: none anywhere). An acquire round takes it when it is
// registered, and each of its requests waits for those only
// (awaitReleases): a release registered later is never one it must
// follow, and may be its own call's cleanup, which waits for the
// request's answer — a request that started late waited for it, the two
// until the node timeout, and every acquire of the key on that node
// behind them (lockbench's semaphore: waits in steps of one node timeout;
// TestLate_lateRequestDoesNotWaitForItsOwnCleanup).
func (c *Client) releasesBefore(keys []scripts.Keys) [][]chan struct{} {
	c.relMu.Lock()
	defer c.relMu.Unlock()
	if len(c.releasing) == 0 {
		return nil
	}
	var out [][]chan struct{}
	for i, k := range keys {
		for _, key := range k.LockKeys() {
			if fs := c.releasing[relKey{key, i}]; len(fs) > 0 {
				if out == nil {
					out = make([][]chan struct{}, len(keys))
				}
				out[i] = append(out[i], fs...)
			}
		}
	}
	return out
}

// awaitReleases waits until the releases fs took for node i have ended
// (each within its node timeout), or ctx ends.
func awaitReleases(ctx context.Context, fs [][]chan struct{}, i int) {
	if fs == nil {
		return
	}
	for _, f := range fs[i] {
		select {
		case <-f:
		case <-ctx.Done():
			return
		}
	}
}
