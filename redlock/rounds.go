package redlock

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/quorumlock/quorumlock/internal/node"
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
	var zero T
	return zero, c.nodeError(ctx, i, at, err)
}

// request is call for node i's request of l's registered round p: a lock
// request that carries its not-after bound, after l's own releases p
// follows (node.Request).
func request[T any](c *Client, ctx context.Context, l *Lock, p *node.Pending, i int, at site, fn func(ctx context.Context, s redis.Scripter, notAfter *int64) (T, error)) (T, error) {
	v, err := node.Request(ctx, l.tok, p, i, fn)
	if err == nil {
		return v, nil
	}
	var zero T
	return zero, c.nodeError(ctx, i, at, err)
}

// nodeError is the *NodeError of a request to node i that failed with
// err, reported to the hooks.
func (c *Client) nodeError(ctx context.Context, i int, at site, err error) error {
	if scriptRefused(err) && !strings.Contains(err.Error(), "+info") {
		err = fmt.Errorf("%w (the node's ACL user lacks a command the library's scripts call: see the minimal ACL in the README)", err)
	}
	addr := c.nodes[i].Addr
	if at.obs != nil {
		at.obs.NodeError(ctx, NodeErrorInfo{Resource: at.resource, Op: at.op, Node: i, Addr: addr, Kind: errorKind(err), Err: err})
	}
	return &NodeError{Node: i, Addr: addr, Err: err}
}

// scriptRefused reports whether err is a node refusing a command inside a
// script for want of an ACL right.
func scriptRefused(err error) bool {
	return err != nil && strings.Contains(err.Error(), "can't run this command")
}
