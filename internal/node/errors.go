package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/scripts"
)

// ErrNotSent marks the error of a request that provably never left the
// client: it cannot land on the node later.
var ErrNotSent = errors.New("not sent")

// ErrBusy is the error of a request not sent because the node's in-flight
// cap was full. It matches ErrNotSent.
var ErrBusy = &busyError{}

type busyError struct{}

func (*busyError) Error() string { return "too many requests in flight on this node" }
func (*busyError) Unwrap() error { return ErrNotSent }

// errMayHaveLanded marks the error of a request that may have been written
// before it failed (see NeverWrote).
var errMayHaveLanded = errors.New("may have landed")

// Unsent reports whether a request provably never left the client, so
// that nothing of it can land on the node later: the node layer kept it
// back (the in-flight cap was full; the node is down or stuck), or go-redis
// got it no connection on its only try (see NeverWrote, and Do). Every
// other failure — a timeout, a broken connection, a dial error after
// go-redis retried a request it may have written — "may have landed".
func Unsent(err error) bool { return err != nil && errors.Is(err, ErrNotSent) }

// Answered reports whether a request that ended with err can no longer
// change anything on the node: the node replied (a result, an error reply,
// or scripts.ErrLate: it ran past its not-after bound and changed nothing),
// or the request provably never left the client (Unsent). A timeout or a
// broken connection leaves it unknown whether (and when) the request
// reaches the node.
func Answered(err error) bool { return Replied(err) || Unsent(err) }

// Replied reports whether a request that ended with err got the node's
// reply: a result, an error reply, or scripts.ErrLate.
func Replied(err error) bool {
	if err == nil {
		return true // before the errors.As target, which escapes
	}
	var re redis.Error
	return errors.As(err, &re) || errors.Is(err, scripts.ErrLate)
}

// NeverWrote reports whether err, returned by a node client whose retries
// are off (MaxRetries -1), says that the request got no connection, so that
// no byte of it was written: a dial refused or timed out, a name that did
// not resolve, the pool timed out, exhausted or closed. With retries on
// (go-redis's default), a dial error may follow a first try that wrote the
// request and lost its connection, so it proves nothing (issue 30 item 6).
// An error marked by MayHaveLanded proves nothing either.
func NeverWrote(err error) bool {
	if err == nil || errors.Is(err, errMayHaveLanded) {
		return false
	}
	var oe *net.OpError
	var de *net.DNSError
	switch {
	case errors.Is(err, redis.ErrPoolTimeout), errors.Is(err, redis.ErrPoolExhausted), errors.Is(err, redis.ErrClosed):
		return true
	case errors.As(err, &de):
		return true
	case errors.As(err, &oe):
		return oe.Op == "dial"
	}
	return false
}

// MayHaveLanded marks err as the error of a request that may have been
// written before it failed (a pipeline that sent part of its commands): it
// reads as err, and NeverWrote is false for it.
func MayHaveLanded(err error) error { return &markedError{err, errMayHaveLanded} }

// neverSent marks err as the error of a request that was never written.
func neverSent(err error) error { return &markedError{err, ErrNotSent} }

// markedError is an error with a marker; it reads as the error itself.
type markedError struct{ err, mark error }

func (e *markedError) Error() string   { return e.err.Error() }
func (e *markedError) Unwrap() []error { return []error{e.err, e.mark} }

// ConnError is the error of a node that could not be reached: its dial
// failed (refused, unresolvable, unreachable); Err is the dialer's error.
type ConnError struct {
	Err     error
	notSent bool // the request was not sent: the node was known down
}

func (e *ConnError) Error() string {
	if e.notSent {
		return "not sent: the node is down (last dial: " + e.Err.Error() + ")"
	}
	return e.Err.Error()
}

func (e *ConnError) Unwrap() []error {
	if e.notSent {
		return []error{ErrNotSent, e.Err}
	}
	return []error{e.Err}
}

// StuckError is the error of a request not sent because a request to the
// node is in flight past its deadline, with no reply since. It matches
// context.DeadlineExceeded and ErrNotSent.
type StuckError struct {
	Late     time.Duration
	Inflight int32
}

func (e *StuckError) Error() string {
	return fmt.Sprintf("not sent: the node is not answering (%d requests in flight, the oldest past its deadline by %v)",
		e.Inflight, e.Late.Round(time.Millisecond))
}

func (e *StuckError) Unwrap() []error { return []error{ErrNotSent, context.DeadlineExceeded} }

// IsTimeout reports whether err is a deadline or a network timeout.
func IsTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}
