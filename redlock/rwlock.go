package redlock

import (
	"context"
	"slices"
)

// Mode is what kind of lock a *Lock is (issue 24): a plain lock, a reader
// or a writer of a read-write lock, or a multi-resource lock. Every kind
// is renewed, lost and unlocked the same way.
type Mode int8

// The kinds of lock.
const (
	ModeMutex Mode = iota // Client.Lock, TryLock, Do
	ModeRead              // Client.RLock, TryRLock: shared with other readers
	ModeWrite             // Client.WLock, TryWLock: exclusive, like a plain lock
	ModeMulti             // Client.LockAll, TryLockAll: several resources at once
)

func (m Mode) String() string {
	switch m {
	case ModeRead:
		return "read"
	case ModeWrite:
		return "write"
	case ModeMulti:
		return "multi"
	}
	return "mutex"
}

// Mode returns the kind of l; ModeMutex for a nil *Lock.
func (l *Lock) Mode() Mode {
	if l == nil {
		return ModeMutex
	}
	return l.cfg.mode
}

// RLock acquires a read lock on resource: it is held together with any
// number of other read locks of resource, never with a write lock (WLock)
// or with any other holder of the lock key (a plain Lock, redsync,
// node-redlock). It blocks until granted on a majority, WithRetryCount
// attempts were made, ctx is done, or the Client is closed: it attempts
// again when a release on a node says it may be its turn (a message on
// the Client's wake-up channel), and at the latest after the retry delay
// (WithRetryDelay). While it waits, a writer that began waiting earlier
// goes first; readers that came before a waiting writer go before it (see
// WLock for the rule). ctx bounds the call, not the lease.
//
// The *Lock it returns is renewed, reported lost (Lost, Context, OnLost,
// hooks) and unlocked exactly as a plain lock; its Fence is 0 (readers
// share, so there is nothing to order: WithFencing is ignored for
// readers). Errors are those of Lock: ErrNotObtained (a writer
// holds it, or waits before us; joined with ctx's error when ctx ended),
// ErrNoQuorum with one *NodeError per failed node, ErrInvalidArgument,
// ErrClosed.
//
// Read and write locks of a resource are keyed beside the lock key of
// that resource (the readers set and the waiters: see
// docs/rwlock.md); the argument that no reader majority can coexist with
// a writer majority is in the package documentation. A waiter is told to
// attempt, never handed the lock: unlike Lock's queue (DESIGN step 9),
// every grant is an attempt's, on a majority.
func (c *Client) RLock(ctx context.Context, resource string, opts ...Option) (*Lock, error) {
	return c.lock(ctx, resource, withMode(opts, ModeRead), false)
}

// TryRLock makes one attempt at a read lock on resource (see RLock): it
// is refused (ErrNotObtained) while a writer holds the lock or any writer
// waits for it. It does not block beyond one round on the nodes.
func (c *Client) TryRLock(ctx context.Context, resource string, opts ...Option) (*Lock, error) {
	return c.lock(ctx, resource, withMode(opts, ModeRead), true)
}

// WLock acquires the write lock on resource: exclusive of every reader
// and every other writer, and of any holder of the lock key (a plain Lock
// of resource, redsync or node-redlock on the same key: a writer holds
// that key itself). It blocks until granted on a majority, WithRetryCount
// attempts, ctx done or Close, and attempts when told or after the retry
// delay, as RLock.
//
// Fairness, on each node: a waiting call (RLock or WLock, not the Try
// forms) is recorded with its ticket (the time the call began) and goes
// in ticket order by kind. A writer is granted only with no reader or
// writer holding the lock and no waiter of either kind before it; a
// reader only with no writer holding it and no waiting writer before it.
// So a stream of readers cannot keep a waiting writer out (no new reader
// is let in once it waits), and a stream of writers cannot keep a waiting
// reader out (every reader that began waiting before the next writer is
// let in first, all together). A waiter that stops attempting (crashed,
// partitioned) drops out by itself a queue lapse after its last attempt
// (twice the longest retry delay plus four node timeouts).
//
// The lock is renewed, lost and unlocked as a plain one, and can be
// fenced (WithFencing(true): its Fence is ordered with the plain locks'
// and other writers' of the resource). Errors are those of Lock.
func (c *Client) WLock(ctx context.Context, resource string, opts ...Option) (*Lock, error) {
	return c.lock(ctx, resource, withMode(opts, ModeWrite), false)
}

// TryWLock makes one attempt at the write lock on resource (see WLock):
// it is refused (ErrNotObtained) while any reader or writer holds it or
// any call waits for it.
func (c *Client) TryWLock(ctx context.Context, resource string, opts ...Option) (*Lock, error) {
	return c.lock(ctx, resource, withMode(opts, ModeWrite), true)
}

// withMode appends the option that makes a call of kind m: last, so that
// no caller's option undoes it. Read-write calls do not use the plain
// wake-up queue (it hands the lock key to one token, which readers do not
// hold): they record themselves in rw.lua's waiters and are told to
// attempt (waiting.go).
func withMode(opts []Option, m Mode) []Option {
	return append(slices.Clip(opts), optionFunc(func(c *config) {
		c.mode = m
		if m == ModeRead || m == ModeWrite {
			c.wakeUp = false
		}
		if m == ModeRead || m == ModeMulti {
			c.fencing = false // nothing to order (see RLock, LockAll)
		}
	}))
}

// queuesFor reports whether a waiting call of kind m records itself on
// the nodes without the wake-up queue (the read-write lock's fairness,
// rw.lua).
func queuesFor(m Mode) bool { return m == ModeRead || m == ModeWrite }
