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
// (another owner holds it; or, matching [ErrGrantExpired] too, a majority
// granted it too late to use), [ErrNoQuorum] with one [*NodeError] per failed
// node (too few nodes answered), the ctx error when ctx ended,
// [ErrInvalidArgument], [ErrClosed], [ErrLockLost], [ErrNotHeld].
//
// A call never waits for itself. Locks are not reentrant, and Go has no
// goroutine identity: the caller is known by its ctx. A lock's
// [Lock.Context] and [Client.Do]'s fn ctx carry the lock, and a Lock,
// TryLock, WLock, RLock (a reader reading again too: it would queue
// behind a waiting writer that waits for it), LockAll or Do whose ctx
// comes from them while the lock is held returns [ErrAlreadyHeld] at once, with no I/O; a [Semaphore] skips the permits
// its caller holds. Any other ctx is another caller's — another goroutine
// sharing the Client, as a process's goroutines do — and waits its turn;
// the holder calling again with such a ctx (context.Background(), say)
// waits for itself until that ctx ends. Pass the *Lock, or its Context,
// to the code that runs under it.
//
// # Local handoff
//
// A Client's Lock calls on one resource wait in one line, and only the
// first contends on the nodes. When a goroutine unlocks while another
// goroutine of the same Client waits in Lock for the same resource, Unlock
// passes the lock to it without a round trip (lock cohorting, after Dice,
// Marathe and Shavit, PPoPP 2012): the waiter's Lock returns a new *Lock
// over the same lease — same Token, ValidUntil, renewal — and the old
// *Lock is unlocked before the waiter's Lock returns (Valid is false, its
// Context is cancelled with [ErrUnlocked], its ValidUntil is the zero
// time, Unlock, Extend and Detach return [ErrNotHeld], also an Extend
// under way at the handoff; its Lost is never closed after). Hooks report it as an acquisition and a release
// with Local set. The handoff is bounded ([WithLocalHandoff]: 16 times,
// within 10ms of the acquisition on the nodes, by default): then the lock
// goes back through the nodes, where other Clients' waiters are served in
// their order, so one of them queued there waits for this Client's lease
// at most that time plus one hold and a release. Only plain exclusive
// locks are passed on: Lock and Do calls with no per-call option, without
// fencing (a fence is taken on the nodes: a former holder's writes are
// refused by [FencedSet] once the next holder, served through the nodes,
// has written), without [WithMaxHold] and without [WithRetryCount]. Read-write locks, multi-locks,
// semaphore permits, election terms, TryLock and [Client.Resume] never hand off locally;
// a detached lock is never passed on.
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
// # Handover, introspection and a hold cap
//
// A lock can change hands between processes: the holder calls
// [Lock.Detach] (renewal stops, its Client forgets the lock and will not
// release it) and passes Resource and Token to another process, whose
// [Client.Resume] takes it over with two rounds: a read, then a re-arm
// that sets no key where it is absent, and it succeeds only when a
// majority of nodes still hold that token in both, so it can never revive
// a lock that expired or was released, also between its rounds (a node
// that lost the key is healed by the lock's first renewal, after that
// majority confirmed, as a renewal heals it). Between Detach and Resume the lock is
// renewed by nobody: Resume must come within the TTL. Only plain locks
// change hands: Detach refuses a reader, a writer and a multi-lock, which
// Resume could not take. [Client.Held] lists
// the locks a Client holds now. [WithMaxHold] caps how long a lock is held:
// after it, renewal stops and the lock is lost with a cause matching
// [ErrMaxHold].
//
// # Semaphores
//
// [Client.Semaphore] gives K permits on the Client's N nodes. Permit i is an
// ordinary lock on the resource "<name>:permit:<i>" (its key
// "<prefix><name>:permit:<i>" on every node), and holding a permit means
// holding one of these K locks. Counting holders on each node and asking a
// majority would not be safe for K ≥ 2: with K = 2 and N = 3, holders
// granted by nodes {1,2}, {2,3} and {1,3} each have a majority and no node
// counts more than 2, yet 3 hold.
//
// Safety. Each permit is a Redlock lock, so under the assumptions that
// make a lock safe (below, and in the module's documentation) at most one
// holder has permit i at any instant: two holders of it would need two
// majorities of N that granted the same key to two tokens in overlapping
// validity windows, and any two majorities share a node, which grants a
// key to one token at a time. A holder holds exactly one permit (an
// acquire that is granted several keeps one and releases the others before
// it returns), so at most K hold at once. Renewal, loss, fencing and
// release are those of a lock: a permit is lost when it can no longer be
// trusted, no later than its ValidUntil, before another holder can get it.
//
// Faults. Each permit tolerates what a lock tolerates: ⌊(N−1)/2⌋ nodes
// down, paused or cut (2 of 5), whatever K is; a node restarted empty is
// the lock's case too (see WithRestartGuard). A holder that crashes gives
// its permit back when its key expires: within one TTL of its last renewal
// (a permit handed to a waiter that then crashed, within one reservation).
//
// Waiting. An acquire first tries one permit chosen at random (one round
// trip, as TryLock), then, if that one is held, every other permit at once
// (a second round trip): an uncontended acquire takes at most two. A
// waiter ([Semaphore.Acquire]) then queues on the lock "<name>:permits",
// in the nodes' waiter order (DESIGN step 9), and only its holder — the
// head waiter — waits on the permits, with a Lock call on each, queued on
// each. A release hands its permit to that one waiter and tells it alone;
// the others wait on the waiters' lock, so a release wakes no herd. That
// lock protects nothing: safety rests on the permits alone, and if it is
// lost two waiters may wait on the permits at once, which costs requests,
// never a (K+1)th holder. A caller that does not wait (TryAcquire, or a
// newcomer's first two round trips) takes a permit only when it is free
// and no waiter is queued on it, as a TryLock does.
//
// Limits. Every Client must give a semaphore the same K (one that says
// K+1 adds a permit). Fencing tokens (WithFencing) increase per permit,
// not across the semaphore. Permit keys are ordinary lock keys: a plain
// Lock on "<name>:permit:0" takes that permit.
//
// The algorithm, its guarantees and its limits are described in the module's
// top-level package, github.com/quorumlock/quorumlock.
package redlock
