package scripts

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// guardSrc is prepended to acquire.lua: one script, so the node's uptime is
// read in the same atomic step as the grant, and a node too young grants
// nothing at all (no key to clean up, nothing for a holder's renewal to
// trip on).
//
//go:embed guard.lua
var guardSrc string

var acquireGuarded = newScript(guardSrc + "\n" + queueSrc + acquireSrc)

// Young is the error of AcquireGuarded on a node that has been up for less
// than the restart guard: it granted nothing and changed nothing.
type Young struct {
	Uptime time.Duration // as the node reports it, in whole seconds
	Guard  time.Duration // the reported uptime must exceed it; whole seconds
}

func (e *Young) Error() string {
	return fmt.Sprintf("node up for %v, not more than the restart guard %v", e.Uptime, e.Guard)
}

// AcquireGuarded is Acquire on a node that grants nothing while it may have
// been up for less than guard: while its reported uptime, in whole seconds,
// does not exceed guard rounded up to whole seconds. It returns a *Young
// error there, and the lock key is left as it was. The uptime is read with INFO inside the script (Redis
// ≥ 5, which replicates script effects; the ACL must allow INFO), so it
// cannot change between the check and the grant.
func AcquireGuarded(ctx context.Context, c redis.Scripter, k Keys, token string, ttl time.Duration, w Waiter, wake string, guard time.Duration) (bool, int64, error) {
	return AcquireGuardedWith(ctx, c, k, AcquireArgs(token, ttl, w, wake), nil, guard)
}

// AcquireGuardedWith is AcquireGuarded with arguments from AcquireArgs and
// a not-after bound (see AcquireWith; nil or 0: none).
func AcquireGuardedWith(ctx context.Context, c redis.Scripter, k Keys, args []any, notAfter *int64, guard time.Duration) (bool, int64, error) {
	secs := int64((guard + time.Second - 1) / time.Second)
	v, err := k.set.acquireGuarded.Run(ctx, c, k.acq, append(args[:len(args):len(args)], notAfter, secs)...).Result()
	if err != nil {
		return false, 0, err
	}
	ok, n, young, err := parseAcquire(v)
	if young {
		return false, 0, &Young{Uptime: time.Duration(n) * time.Second, Guard: time.Duration(secs) * time.Second}
	}
	return ok, n, err
}
