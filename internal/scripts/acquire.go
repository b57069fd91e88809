package scripts

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Acquire sets the lock key to token for ttl where it is absent and no
// waiter that comes first is queued, or refreshes it where it already holds
// token — unless token was released on the node (its guard key exists). A
// free key with waiters queued before us goes to the first live one (as a
// release hands it over; wake is from WakeArg). A refused waiter (w.Member
// set) joins the queue, or refreshes its entry's lapse deadline. It reports
// whether the key holds token now, and, with a fence key, the node's fence
// counter (0 without). A key of another type is an error (WRONGTYPE). It
// sends no not-after bound (see AcquireWith).
func Acquire(ctx context.Context, c redis.Scripter, k Keys, token string, ttl time.Duration, w Waiter, wake string) (bool, int64, error) {
	return AcquireWith(ctx, c, k, AcquireArgs(token, ttl, w, wake), nil)
}

// AcquireArgs boxes the arguments of Acquire once, for a lock that sends
// them to every node and on every attempt (AcquireWith).
func AcquireArgs(token string, ttl time.Duration, w Waiter, wake string) []any {
	// Not queueing: unused. Boxed as a constant, so TryLock's path
	// allocates nothing for it (a string variable boxed into an any does).
	var attempt any = "0"
	if w.Member != "" {
		a := strconv.FormatInt(w.Attempt, 10)
		if w.Fresh {
			a += "n"
		}
		attempt = a
	}
	return []any{token, ms(ttl), w.Member, w.Ticket, ms(w.Lapse), wake, attempt}
}

// ErrLate is the answer of a node that ran a request after its not-after
// bound (DESIGN step 4) and so changed nothing: the client had stopped
// waiting for it, or its estimate of the node's clock was wrong (a node's
// clock stepped), but read the reply anyway (its timer fired late, on a
// loaded machine). It is no refusal — the script read no key — and it
// matches context.DeadlineExceeded, as the client's own timeout would have
// (redlock reports it as the node's timeout once the deadline has passed).
var ErrLate error = lateError{}

type lateError struct{}

func (lateError) Error() string {
	return "the request reached the node after its deadline (its not-after bound on the node's clock) and changed nothing"
}

func (lateError) Is(target error) bool { return target == context.DeadlineExceeded }

// AcquireWith is Acquire with arguments from AcquireArgs and a not-after
// bound: the node's TIME, in ms, past which the request changes nothing
// and fails with ErrLate (DESIGN step 4: the client no longer waits for it
// then). nil or 0 sends no bound. The bound is read when the command is written,
// so *notAfter must not change until the call returns; a pointer (not a
// boxed int64) lets a round keep the bounds of all its nodes in one slice.
func AcquireWith(ctx context.Context, c redis.Scripter, k Keys, args []any, notAfter *int64) (bool, int64, error) {
	v, err := k.kind().acquire.run(ctx, c, k.acq, k.acqv, args, notAfter).Result()
	if err != nil {
		return false, 0, err
	}
	ok, fence, young, err := parseAcquire(v)
	if young {
		return false, 0, fmt.Errorf("scripts: acquire returned %v", v)
	}
	return ok, fence, err
}

// lateAcquire is the acquire scripts' reply past the not-after bound (see
// acquire.lua): -2, or {-2, fence counter}.
const lateAcquire = -2

// parseAcquire reads the reply of the acquire script: 1 or 0, or {1 or 0,
// fence counter}, or from the guarded variant {-1, uptime} (young); -2 or
// {-2, n} is ErrLate.
func parseAcquire(v any) (ok bool, n int64, young bool, err error) {
	switch v := v.(type) {
	case int64:
		switch v {
		case 0, 1:
			return v == 1, 0, false, nil
		case lateAcquire:
			return false, 0, false, ErrLate
		}
	case []any:
		if len(v) == 2 {
			g, ok1 := v[0].(int64)
			n, ok2 := v[1].(int64)
			switch {
			case ok1 && ok2 && g == -1:
				return false, n, true, nil
			case ok1 && ok2 && g == lateAcquire:
				return false, 0, false, ErrLate
			case ok1 && ok2 && (g == 0 || g == 1):
				return g == 1, n, false, nil
			}
		}
	}
	return false, 0, false, fmt.Errorf("scripts: acquire returned %v", v)
}

// CommitHash is the SHA1 of the commit script, which its EVALSHA carries:
// the simulator's fault layer recognizes phase 2 of a fenced acquire by it
// (issue 33: faults aimed at one protocol phase).
func CommitHash() string { return commit.Hash() }

// Commit is phase 2 of a fenced acquire: it raises the fence counter to
// max(counter, t) where the lock key still holds token, and reports whether
// it did.
func Commit(ctx context.Context, c redis.Scripter, k Keys, token string, t int64) (bool, error) {
	n, err := commit.Run(ctx, c, k.com, token, t).Int64()
	return n == 1, err
}
