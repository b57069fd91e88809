package redlock

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/node"
)

// How a lock's rounds use the node layer's unit (node.Token, DESIGN step
// 4): a Lock is its token's owner (node.Owner), through owner below; each
// round is node.Run with a node.Op saying what it is for, and the node
// layer registers it, fixes its start, orders it and bounds it.

// owner is a Lock as its token's owner (its mutex, l.mu, is the one under
// which Unlock's, Detach's and Close's finish change the state): whether it
// is held, and how a failed request is reported.
type owner Lock

func (o *owner) Open() bool    { return (*Lock)(o).heldNow() }
func (o *owner) Usable() error { return (*Lock)(o).usable() }
func (o *owner) Fail(ctx context.Context, i int, op string, err error) error {
	return o.c.nodeError(ctx, i, site{o.cfg.obs, op, o.resource}, err)
}

// heldNow reports whether l is held and valid. l.mu is held.
func (l *Lock) heldNow() bool { return l.state == stateHeld && time.Now().Before(l.validUntil) }

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
	v, err := node.Call(ctx, c.set, i, lockOp, c.cfg.nodeTimeout, fn)
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
