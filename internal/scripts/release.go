package scripts

import (
	"context"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
)

// Release gives up the lock key where it holds token: it hands it to the
// first live waiter queued on the node (for that waiter's reservation; its
// client is told on its channel, with the token and the waiter's attempt:
// see ParseHandoff; wake is from WakeArg), or
// deletes it when nobody waits. A key already gone goes to the first live
// waiter too. Our member (r.Member) leaves the queue in any case. With
// guard > 0 it also sets the token's guard key for guard, whatever the lock
// key holds, so that a request of ours still in flight cannot set the key
// again when it lands (see Acquire, Extend).
//
// Yielding (yield true, a waiter with a minority of grants): the key is
// handed over only to a waiter before (r.Ticket, r.Member) in the order
// (else Kept), and r stays queued.
func Release(ctx context.Context, c redis.Scripter, k Keys, token string, guard time.Duration, r Waiter, yield bool, wake string) (Released, error) {
	return ReleaseWith(ctx, c, k, ReleaseArgs(token, guard, r, yield, wake))
}

// Unqueued returns args from ReleaseArgs (not yielding) without the
// member, for a node where no entry of ours can be left: the release then
// does not look for one (see Release).
func Unqueued(args []any) []any {
	a := slices.Clone(args)
	a[2] = ""
	return a
}

// Yield is Release for a waiter giving back the grants of a failed attempt
// (see Release, yield), with its not-after bound in the node's clock (ms; 0:
// none): past it, the node changes nothing and Yield returns ErrLate.
func Yield(ctx context.Context, c redis.Scripter, k Keys, token string, r Waiter, wake string, notAfter int64) (Released, error) {
	args := append(ReleaseArgs(token, 0, r, true, wake), notAfter)
	return ReleaseWith(ctx, c, k, args)
}

// ReleaseHash is the SHA1 of the plain lock's release script, which its
// EVALSHA carries: the simulator's fault layer recognises a yield (a
// release with a ticket) by it and by its ticket argument (issue 30 item 5:
// a fault aimed at yields).
func ReleaseHash() string { return release.Hash() }
