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
// The algorithm, its guarantees and its limits are described in the module's
// top-level package, github.com/quorumlock/quorumlock.
package redlock
