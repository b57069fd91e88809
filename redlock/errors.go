package redlock

import (
	"context"
	"errors"
	"fmt"

	"github.com/quorumlock/quorumlock/quorum"
	"github.com/redis/go-redis/v9"
)

var (
	// ErrNotObtained means the lock was not obtained though the nodes
	// answered: another owner holds it (enough nodes refused that a majority
	// was impossible), or — and then the error also matches ErrGrantExpired
	// — a majority granted it too late to use. It is the last attempt's
	// error, for Lock. When the caller's ctx ended, it is joined with ctx's
	// error.
	ErrNotObtained = errors.New("redlock: not obtained")

	// ErrGrantExpired means a majority granted the lock, but its validity
	// ran out before it could be returned: the round took longer than the
	// TTL less the drift allowance, or the process was starved between the
	// grant and the return. Nobody else need hold the lock; the grants were
	// released. The error also matches ErrNotObtained, so that code that
	// retries on contention retries on it too.
	ErrGrantExpired = errors.New("redlock: granted too late to use")

	// ErrAlreadyHeld means the call would wait for a lock its caller holds:
	// its ctx comes from the Context of a lock of this Client that is still
	// held on the resource (a Lock's Context, Do's fn ctx, or a ctx derived
	// from them), so Lock, TryLock, RLock, WLock, LockAll and Do return it
	// at once, with no I/O. Locks are not reentrant, and neither is reading:
	// a reader's RLock would queue behind a writer that waits for the
	// reader, as with sync.RWMutex. A ctx that does not come from the lock is another
	// caller's, which waits for the lock like a caller in another process
	// (goroutines of one process share a Client that way). The error also
	// matches ErrNotObtained.
	ErrAlreadyHeld = errors.New("redlock: the caller holds the lock already")

	// ErrNoQuorum means too few nodes answered to decide. It is joined with
	// one *NodeError per node that failed.
	ErrNoQuorum = errors.New("redlock: no quorum")

	// ErrLockLost means the lease could not be kept on a majority of nodes,
	// or its validity ran out before a renewal succeeded. Another client may
	// hold the lock now.
	ErrLockLost = errors.New("redlock: lock lost")

	// ErrNotHeld means no node holds our token: Unlock or Extend of a lock
	// that is no longer ours (or a nil *Lock).
	ErrNotHeld = errors.New("redlock: lock not held")

	// ErrUnlocked is the cause of a Lock's Context after Unlock.
	ErrUnlocked = errors.New("redlock: unlocked")

	// ErrClosed means the Client is closed. It is also the cause of a Lock's
	// Context after Close.
	ErrClosed = errors.New("redlock: client closed")

	// ErrInvalidArgument means bad input. It is joined with a message naming
	// the argument. No I/O is done, except by Dial when it finds that the
	// nodes it asked are not independent masters (see Dial).
	ErrInvalidArgument = errors.New("redlock: invalid argument")
)

// NodeError is the failure of one node: an error reply (such as WRONGTYPE or
// NOPERM), a connection error, or a timeout. Errors that carry several are
// joined with errors.Join; use errors.As to find them.
type NodeError struct {
	Node int    // index of the node in the slice given to New
	Addr string // the node's address, as its client knows it
	Err  error  // what went wrong
}

func (e *NodeError) Error() string {
	return fmt.Sprintf("redlock: node %d (%s): %v", e.Node, e.Addr, e.Err)
}

// Unwrap returns the node's error, so that errors.Is(err,
// context.DeadlineExceeded) holds for a node that timed out.
func (e *NodeError) Unwrap() error { return e.Err }

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidArgument, fmt.Sprintf(format, args...))
}

// classed is an error with one message that matches several sentinels: a
// loss that is also "not held" reads as one sentence, not two prefixes.
type classed struct {
	msg   string
	class []error
	cause error // may be nil
}

func (e *classed) Error() string {
	if e.cause != nil {
		return e.msg + ": " + e.cause.Error()
	}
	return e.msg
}

func (e *classed) Unwrap() []error {
	if e.cause != nil {
		return append(e.class[:len(e.class):len(e.class)], e.cause)
	}
	return e.class
}

// permanentPrefixes are the error replies that another attempt cannot
// change: a key of another type, a replica, a missing ACL right, a script
// the node refuses to load, a missing command.
var permanentPrefixes = []string{"WRONGTYPE", "READONLY", "NOPERM", "NOSCRIPT", "NOAUTH", "WRONGPASS", "ERR unknown command"}

// permanentReply reports whether err is a node's error reply that retrying will
// not change.
func permanentReply(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return errors.Is(err, ErrInvalidArgument)
	}
	for _, p := range permanentPrefixes {
		if redis.HasErrorPrefix(re, p) {
			return true
		}
	}
	return false
}

// errPermanent marks an attempt's error that no retry can change: Lock
// returns it at once.
var errPermanent = errors.New("permanent")

// isPermanent reports whether an attempt's error ends Lock's retries.
func isPermanent(err error) bool { return errors.Is(err, errPermanent) }

// permanentError is an attempt's error marked with errPermanent; it reads
// as the error itself.
type permanentError struct{ err error }

func (e *permanentError) Error() string   { return e.err.Error() }
func (e *permanentError) Unwrap() []error { return []error{e.err, errPermanent} }

// permanentFailures counts the nodes of t whose error reply another attempt
// cannot change (permanentReply).
func permanentFailures(t quorum.Tally) int {
	n := 0
	for i, v := range t.Votes {
		if v == quorum.Failed && permanentReply(t.Errs[i]) {
			n++
		}
	}
	return n
}

// cancelled reports whether t's round was cut short because the caller
// cancelled its ctx (not a deadline) before any node answered or failed by
// itself: then the round says nothing about the nodes.
func cancelled(t quorum.Tally) bool {
	if t.Yes+t.No > 0 || t.Failed == 0 || t.Failed != t.CutShort() {
		return false
	}
	for i, e := range t.Errs {
		if t.Cut[i] && errors.Is(e, context.Canceled) {
			return true
		}
	}
	return false
}

// ctxCancelled is the error of a round the caller cancelled (see
// cancelled): it matches context.Canceled, never ErrNoQuorum, so that a
// caller's own cancellation is not reported as an outage. (A deadline that
// ends a round of silent nodes stays ErrNoQuorum, as the contract says: the
// nodes had that long to answer.)
func ctxCancelled(detail string) error {
	return &classed{msg: "redlock: ctx cancelled before the nodes answered: " + detail, class: []error{context.Canceled}}
}

// ctxDoneBefore is the error of a call whose ctx was done before it sent
// anything: it matches ctx's error (context.Canceled or
// context.DeadlineExceeded) and neither ErrNoQuorum nor ErrNotObtained,
// since no node was asked.
func ctxDoneBefore(ctx context.Context) error {
	return &classed{msg: "redlock: nothing sent: ctx was done before the call", class: []error{ctx.Err()}, cause: context.Cause(ctx)}
}
