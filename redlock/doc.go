// Package redlock is a Redlock client: a lock held on a majority of N
// independent Redis masters, acquired in one parallel round trip, kept alive
// by a quorum-aware watchdog, and reported lost as soon as it can no longer
// be trusted.
//
// Start with [New] over your nodes, then [Client.Lock] (or [Client.Do],
// which also releases). A [Lock] is renewed on every node each TTL/3 until
// [Lock.Unlock] or [Client.Close]; when fewer than a majority confirm, or its
// validity runs out first, [Lock.Lost] is closed and [Lock.Context] is
// cancelled with cause [ErrLockLost] — no later than [Lock.ValidUntil],
// before any other client could take the lock, whatever the hooks do — and
// then the [WithOnLost] callback runs.
//
// Errors are told apart with errors.Is and errors.As: [ErrNotObtained]
// (another owner holds it), [ErrNoQuorum] with one [*NodeError] per failed
// node (too few nodes answered), the ctx error when ctx ended,
// [ErrInvalidArgument], [ErrClosed], [ErrLockLost], [ErrNotHeld].
//
// Build node clients with ContextTimeoutEnabled: true: the node timeout is
// enforced by the fan-out either way, but only then does go-redis also free
// the connection of a request that timed out.
//
// # Read-write lock
//
// [Client.RLock] and [Client.WLock] (and their Try forms) return a *Lock
// of [ModeRead] or [ModeWrite]: renewed, reported lost, fenced (writers)
// and unlocked like any lock, by the same rounds. On each node a writer
// holds the resource's lock key with its token, exactly as a plain lock
// (so a plain Lock, redsync or node-redlock on the key excludes it and is
// excluded by it). Readers are a sorted set beside the key, token →
// expiry on the node's clock, and while any is live the key holds a
// marker no token equals, expiring with the latest reader: a crashed
// reader lapses by itself, and writers of other libraries find the key
// taken. A node grants a writer only with the key free and no live
// reader, and a reader only with no writer's token in the key, each in
// one script.
//
// Why no reader and writer hold together: a reader holds on a majority R
// of nodes, a writer on a majority W; |R| + |W| > N, so some node is in
// both, and that node granted both while the other's grant was live —
// which its script refuses, the grants being atomic and each lasting
// until its expiry on that node's clock (readers' scores, the writer's
// PX), which outlasts the holder's validity (DESIGN step 3). Two writers
// are excluded as two plain locks are. A node restarted empty may grant
// the other kind while it heals, exactly as for a plain lock: see
// WithRestartGuard, which applies to both kinds.
//
// Fairness, on each node: a waiting RLock or WLock call is recorded with
// its ticket (the call's start) and lapses unless its attempts refresh
// it. A writer is granted only if no waiter of either kind comes before
// it; a reader only if no waiting writer comes before it. So a writer
// waits only for the holders and the waiters ahead of it, never for
// readers that came later (no writer starvation), and a reader waits only
// for the writers ahead of it, never for later writers (no reader
// starvation): the kinds take turns in arrival order, the readers between
// two writers sharing a turn. The Try forms wait for nobody and are
// refused by any waiter that keeps them out.
//
// # Multi-resource lock
//
// [Client.LockAll] holds several resources as one *Lock ([ModeMulti]): on
// each node one script sets every resource's plain lock key to our token,
// or none, and a majority must grant; renewal re-arms them all or counts
// the node as lost. Any two multi-locks that share a resource need
// majorities that meet on a node, where the shared key holds one token:
// they never hold together. There is no deadlock in any order of the
// resources: no node ever holds part of a set, and an attempt without a
// majority gives back what it got before it waits, so nobody holds while
// waiting. On Redis Cluster nodes a script touches one slot only: a set
// whose keys are on different slots is refused with a [*CrossSlotError].
//
// The algorithm, its guarantees and its limits are described in the module's
// top-level package, github.com/quorumlock/quorumlock.
package redlock
