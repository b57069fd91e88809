package scripts

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/testhooks"
)

// Released is what a release did with the lock key on one node.
type Released int8

// The outcomes of Release.
const (
	NotOurs    Released = iota // the key did not hold our token
	Deleted                    // deleted: nobody was queued
	HandedOver                 // set to the first waiter's token, who was told
	Kept                       // yielding: nobody before us in the queue, the key stays ours
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

// ReleaseWith is Release with arguments from ReleaseArgs.
func ReleaseWith(ctx context.Context, c redis.Scripter, k Keys, args []any) (Released, error) {
	s := k.kind().release
	if s == release && testhooks.QueueTieKeeps.Load() {
		s = releaseTieKeeps // a negative control
	}
	return parseReleased(s.run(ctx, c, k.rel, k.relv, args).Int64())
}

// tieRule is the line of queue.lua that breaks a tie of tickets by member.
const tieRule = "return ticket < t or (ticket == t and bytesLess(member, head))"

// ReleaseCmd queues Release on a pipeline, as EVALSHA (see ExtendCmd),
// with arguments from ReleaseArgs (not yielding). Read the outcome with
// ReleaseResult after Exec.
func ReleaseCmd(ctx context.Context, p redis.Pipeliner, k Keys, args []any) *redis.Cmd {
	return k.kind().release.EvalSha(ctx, p, k.rel, args...)
}

// ReleaseResult reads the outcome of a command queued by ReleaseCmd.
func ReleaseResult(cmd *redis.Cmd) (Released, error) {
	return parseReleased(cmd.Int64())
}

// ReleaseArgs boxes the arguments of Release once, for a lock that sends
// them to every node (ReleaseWith, ReleaseCmd).
func ReleaseArgs(token string, guard time.Duration, r Waiter, yield bool, wake string) []any {
	g := int64(0)
	if guard > 0 {
		g = ms(guard)
	}
	ticket := ""
	if yield {
		ticket = strconv.FormatInt(r.Ticket, 10)
	}
	var at any = "0 0" // no member: unused (a boxed constant: no allocation)
	if r.Member != "" {
		at = strconv.FormatInt(r.Attempt, 10) + " " + strconv.FormatInt(r.Ticket, 10)
	}
	return []any{token, g, r.Member, wake, ticket, ms(r.Lapse), at}
}

// Unqueued returns args from ReleaseArgs (not yielding) without the
// member, for a node where no entry of ours can be left: the release then
// does not look for one (see Release).
func Unqueued(args []any) []any {
	a := slices.Clone(args)
	a[2] = ""
	return a
}

func parseReleased(n int64, err error) (Released, error) {
	if err != nil {
		return NotOurs, err
	}
	if n == -1 {
		return NotOurs, ErrLate // a yield past its not-after bound: it changed nothing
	}
	if n >= 0 && n <= 3 {
		return Released(n), nil
	}
	return NotOurs, fmt.Errorf("scripts: release returned %d", n)
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
