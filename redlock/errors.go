package redlock

import (
	"errors"
	"fmt"
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
