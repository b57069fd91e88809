package scripts

import (
	"context"
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
