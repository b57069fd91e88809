// Package election is leader election on top of the quorum lock of package
// redlock: among the candidates for a named leadership, the leader is
// whoever holds the lock on the resource of that name, so leadership has
// the lock's guarantees — held on a majority of independent nodes, reported
// lost before any other candidate can take it (the leader's context is
// cancelled), and, with redlock.WithFencing, a fencing token that strictly
// increases from term to term.
//
// Start with [New] over a [redlock.Client] (the election acts on its nodes:
// those given to [redlock.New] or dialled by [redlock.Dial]), then
// [Election.Run] for the common case:
//
//	e, err := election.New(client, "scheduler")
//	err = e.Run(ctx, func(ctx context.Context, t *election.Term) error {
//		return schedule(ctx, t.Fence()) // ctx is cancelled when leadership is lost
//	})
//
// or [Election.Campaign] and [Term.Resign] for control over each term.
// [Election.Leader] answers who leads as a majority of nodes sees it, and
// [Election.Observe] streams the changes.
//
// # How it works
//
// A campaign is a [redlock.Client.Lock] call on the resource NAME: it waits
// in line and is woken as soon as the leader releases the lock, so a
// resignation hands over within a round trip or two. The lock key holds an
// opaque token, so the winner then writes its identity ([Leader]: identity,
// term, fence, start) in a key beside the lock key, NAME's lock key plus
// [LeaderSuffix], on every node — with a script that writes only where the
// lock key holds the winner's token, and gives the identity the lock key's
// remaining TTL, so that it can never outlive the lease. The term's
// goroutine writes it again as soon as a renewal has moved the lease's
// validity on (it looks every quarter of the lock's node timeout), before
// the TTL it copied runs out, so the identity does not lapse while the
// term lasts; Resign deletes it (only where it is still ours) before the
// release, and marks the term withdrawn on each node, so that a write of
// the term still in flight (left running by a step decided at a majority)
// writes nothing when it lands after that.
// [Election.Leader] reads it on every node and answers with what a majority
// holds. Candidates PUBLISH on [Election.Channel] when they take or leave
// office, which is what drives Observe; a slow poll covers a leader that
// died and whose lease simply expired.
//
// Every step — Leader's read, the identity's writes and deletes, the
// announcements — goes to every node at once and is decided at a majority,
// as the lock is: a node that is slow or down holds up no step. The
// requests it leaves behind finish in the background on goroutines the
// redlock Client owns (its Close waits for them, at most the node timeout
// plus a short grace). The fan-out stops waiting for a node at the node
// timeout itself, not only through the request's context, so node clients
// with go-redis's default options (no ContextTimeoutEnabled, whose reads
// ignore context deadlines and end at the 3s read timeout) hold up no step
// either. The node timeout is the lock's by default (see
// [WithNodeTimeout]): the election's requests share the Client's node
// clients' connection pools with the lock's, and go-redis closes a
// connection whose request timed out, so an election request times out
// only where a lock request would. Each request is one round trip (the
// scripts go out with EVAL, never a NOSCRIPT retry). The deprecated
// [NewWithNodes] gives the election connections of its own, to the same
// nodes.
//
// The identity is not proof of leadership: only the lock is. A deposed
// leader whose process was paused past its lease learns it when it runs
// again (its context is cancelled with cause redlock.ErrLockLost, at its
// ValidUntil at the latest); writes it may still attempt in between are
// what the fence token is for.
//
// # Keys and permissions
//
// With the default prefix "lock:", election NAME uses the lock's keys
// (lock:NAME, lock:NAME:fence with fencing, the waiter queue
// lock:NAME:queue) and its own: the identity key lock:NAME:leader, the
// announcement channel of the same name (covered by an ACL's &lock:*), and
// per ended term lock:NAME:leader:withdrawn:TERM, which expires after about
// a TTL. The
// prefix must be the redlock Client's (see [WithKeyPrefix]). On Cluster
// nodes the name is a hash tag, as redlock makes it. Leader and Observe
// read the identity key with a plain GET.
package election
