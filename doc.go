// Package quorumlock is a Redlock client for Go: a distributed lock held on a
// majority of N independent Redis masters, acquired in one parallel round
// trip, kept alive by a quorum-aware watchdog, and reported lost the moment it
// can no longer be trusted. The API is in package
// [github.com/quorumlock/quorumlock/redlock]; start with redlock.New and
// Client.Lock or Client.Do. Leader election on top of it is package
// [github.com/quorumlock/quorumlock/election], and the command cmd/qlock
// runs a command under a lock, or only while elected leader.
//
// # The algorithm
//
//  1. Acquire: one round, in parallel on all N nodes, of a Lua script that
//     sets key = token with PX ttl where the key is free (or refreshes it
//     where it already holds this token). The token is a uuid v4: 122 bits
//     from crypto/rand, one per Lock call (all its attempts carry it).
//  2. Decide early: the call returns as soon as a majority (N/2+1) granted, or
//     as soon as a majority became impossible. Slower nodes finish in the
//     background, bounded by the node timeout, which the fan-out enforces
//     itself (it stops waiting for that node).
//  3. Validity = TTL − elapsed − (TTL·drift + 2ms), on the monotonic clock
//     from before the first request. A majority reached with no validity
//     left is a failure, and Lock checks validity again just before it
//     returns: it never returns an expired lock.
//  4. A failed or cancelled Lock call releases its key on every node, on a
//     context without the caller's cancellation. Every acquire and extend
//     carries a "not after" bound on the node's own clock: the latest the
//     node's TIME can read when the client stops waiting for the request,
//     from an estimate of the node's clock (a TIME round trip, learned on
//     first use and refreshed every second in use, its error growing with
//     its age by the drift factor). The scripts refuse a request that runs
//     past it, however late it arrives — delayed on the way, or queued for
//     any length of time in a paused node's socket — so it changes nothing,
//     and say so with a reply of their own: a client that still reads it
//     (its timer fired late, on a loaded machine) counts the node as timed
//     out, never as held by another owner, nor a lock as lost.
//     Where a request of the lock may still be in flight (it timed out, or
//     has not answered), the release also sets a guard key beside the lock
//     key, <key>:released:<token>, for the window the bounds' error leaves
//     (about a node timeout plus four clock errors; see "Why a late request
//     changes nothing"): a request that lands in it finds the guard and sets
//     nothing, whatever the lock key holds then.
//  5. Extend re-arms the TTL only where the key holds our token, and sets it
//     again where the key is absent and unguarded (a node that restarted
//     empty is healed); a node where another token holds the key counts
//     against us.
//  6. Release is check-and-delete on every node (with the guard of step 4
//     where needed): the lock key is free at once for every Redlock client
//     of it (redsync, node-redlock, aioredlock in a rolling migration).
//     Unlock returns once a majority confirmed the release (with none of
//     them holding our token, once the others answered too, within the node
//     timeout); a failed attempt's cleanup is not waited for at all. The
//     Client finishes the rest: one retry loop per node sends the releases a
//     node has not confirmed (timed out, connection broken, busy, or an
//     error reply), up to 512 in one pipeline, every node timeout doubling
//     to 1s, until the node answers each, for ten TTLs (at least a minute);
//     at most 16,384 wait per node (about 0.9 KB each), the oldest
//     dropped past that. A release that never left the client (a refused
//     dial) is not retried where no request of the lock can land. Close
//     sends each node its releases, held locks and pending ones, in
//     pipelines for as long as the node answers them. With waiters queued,
//     the key is handed over instead (step 9).
//  7. Renewal: one scheduler per Client extends every held lock each TTL/3,
//     retrying a failed round quickly with jittered backoff while validity
//     remains. A lock is lost when a majority says the key is not ours, or
//     when its ValidUntil passes without a successful renewal (also when an
//     Extend round ends after it), whichever comes first; a timer armed at
//     ValidUntil fires even if a renewal hangs.
//  8. Fencing (opt-in, WithFencing): the acquire script also returns the
//     node's fence counter for the resource; t = max(counters) + 1; then a
//     second phase raises the counter to max(counter, t) on every node that
//     granted, only where the key still holds our token. The lock and its
//     token count only when a majority committed, with validity measured
//     over both phases. Extend raises the counter to t wherever it re-arms
//     or heals a key. A handed-over lock with fencing is confirmed by an
//     ordinary attempt, so it is fenced like any other.
//  9. Waiters queue on the nodes: a Lock call refused on a node joins that
//     node's queue of the resource (<key>:queue, by a ticket taken once per
//     call: its start time) in the same script, and refreshes its entry's
//     own lapse deadline (carried in the entry itself, on the node's clock:
//     two retry delays and four node timeouts) with every attempt; an entry
//     whose waiter stopped attempting is passed over once it lapses. One order
//     serves everywhere: (ticket, member), so no tie of tickets can keep
//     two waiters apart. A release that finds waiters sets the key to the
//     first live one's token for a short reservation (two node timeouts, or
//     two retry delays and a node timeout when that is more, at most half
//     the TTL), and publishes that token, with the number of the waiter's
//     attempt that queued or last refreshed the entry, on its Client's
//     channel only (one channel per Client, subscribed once); a waiter
//     whose Client is not listening there (PUBLISH reaches no receiver: its
//     process is gone, so nobody was told) is dropped, and the next one is
//     served in the same step (its SET replaces the key), or the key is
//     deleted. A release that finds the key free (its own
//     lease ran out, or it never held that node) serves the queue the same
//     way. A waiter told by a majority holds the
//     lock until the reservations end (see "What is guaranteed"), and its
//     first renewal, due halfway to the last node timeout of that validity,
//     extends the key to its TTL; with fencing, for a fixed lease, after a
//     split vote, or when less than one and a half node timeouts is left,
//     it confirms with an ordinary attempt instead (which re-arms a key
//     that holds its token to the TTL). On a free key the first in the
//     order goes first. A waiter that won only a minority in a split vote
//     yields those nodes to waiters before it in the order, so splits
//     settle toward the first. A waiter keeps its jittered retry delay as a
//     fallback. A failed attempt's cleanup passes a key it got on a node to
//     the first waiter there, as a release does, and tells nobody else. A
//     Client's own Lock calls on one resource also take turns in arrival
//     order.
//
// # What is guaranteed
//
// Mutual exclusion: while Lock.Valid reports true, no other client holds the
// lock on a majority, provided that (a) the nodes are independent masters
// (no replication between them: replication is asynchronous, and a failover
// can hand a promoted replica an empty keyspace), (b) clocks advance at
// roughly the same rate — drift is bounded by the drift factor; clocks may be
// slewed but not stepped (a wall-clock jump on a node can expire a key early),
// and (c) a node that crashes either persists its keys (appendfsync always)
// or stays down longer than the longest TTL before it rejoins (the Redlock
// spec's delayed restart). Validity counts from before the first request was
// sent, so the time the grant took to travel back is not counted as held.
//
// A lock handed over by releases (step 9) is valid until the q-th latest of
// start(a_i) + R − (R·drift + 2ms) over the nodes i whose messages it got,
// where R is the reservation, a_i the attempt number node i's message
// names, and start(a) when attempt a began (or the call's first queued
// attempt, when a is no longer recorded). Why: node i recorded a_i with
// the entry it served, and an entry is recorded only by a request of that
// attempt reaching the node (a yield records one too, but a waiter that
// yielded confirms with a round instead), so the key was set after
// start(a_i), for R
// on the node's clock. A message that arrives late cannot stretch this:
// if the reservation lapsed and the waiter queued again, the new entry
// carries a later attempt, and the old message names the old one. The key
// holds our token on those nodes until then (only our token's requests or
// release change it), and q of them are a majority. The message is sent
// after the key is set. The lock's first renewal re-arms the key to the
// TTL within that validity; if it fails, the lock is lost at that
// validity, as any lock is at its ValidUntil.
//
// Any two majorities of the same N nodes intersect, and a node holds at most
// one token per key; so two clients cannot both have a majority of
// unexpired keys at once. Every script checks the token before it re-arms or
// deletes, so a client whose lease ran out never extends or deletes a key
// that a later holder set.
//
// Loss is reported, not hidden: Lock.Lost is closed and Lock.Context is
// cancelled (cause ErrLockLost) at ValidUntil plus scheduling delay;
// ValidUntil is before any other client can reach a majority.
// A renewal that is decided after the old ValidUntil does not count: another
// client might have held the lock in the gap.
//
// # Why a late request changes nothing
//
// Write n(t) for a node's clock (its TIME, in µs) at local instant t, and
// suppose the two clocks' rates differ by at most the drift factor ρ
// (assumption b). A TIME probe sent at local s and answered at r read T at
// some instant of [s, r]; so with m = (s+r)/2 and e = (r−s)/2 + 1µs, for
// every t: lo(t) ≤ n(t) ≤ hi(t), where lo, hi = T + (t−m) ∓ (e + ρ|t−m|).
// A request whose caller waits for it until local D (its round's
// deadline: its start plus the node timeout, or the caller's earlier
// deadline) carries
// N = hi(D), rounded up to whole ms, and its script refuses it when the
// node's TIME, rounded down to ms, exceeds N. It is never refused while
// waited for: it runs at some t ≤ D, and n(t) ≤ n(D) ≤ hi(D) ≤ N. It changes
// nothing once n has passed N, however long it was held.
//
// The release of the lock on a node where a request may still land is
// sent at local s_r and runs at node time R ≥ n(s_r) ≥ lo(s_r). A request
// of ours that runs on that node before R is undone by the release (it
// deletes or hands over a key that holds our token); one that runs in (R,
// R+G] finds the guard of lifetime G; one that runs later is refused by its
// bound if N ≤ R+G. So G ≥ N − lo(s_r) for every N that can still land
// suffices. Bounds already sent are at most the node's latest recorded
// bound (recorded before each request goes out). A request of a round that
// was registered before the release but computes its bound only now has D
// ≤ s_r + node timeout, and uses the current estimate or a later one, which
// replaces it only when its own error is no larger (so it is smaller at
// every later instant too): its N ≤ hi'(D) ≤ n(D) + 2e'(D) ≤ hi(s_r+timeout)
// + 2(e + ρ|s_r+timeout−m|). The release takes G as the largest of these
// over the nodes, less lo(s_r), plus 2ms: about a node timeout plus four
// clock errors (a clock error is half a round trip, and ρ times the
// estimate's age, at most a second in use). A node whose clock is not known
// yet gets 2(node timeout + probe timeout): a request that waits for the
// first probe gets an estimate whose error is at most half the probe's
// timeout, which is the Client's node timeout. No request goes out without a
// bound (a round always has a deadline); one that did would keep the guard
// of before, two TTLs.
//
// One type owns this argument, not each caller, and two files can be
// checked against it: internal/node/round.go for the rounds and release.go
// for the releases. Every round of a lock token is node.Run (a renewal
// batch's is node.Batch) on the token's node.Token — acquire, extension,
// fence commit, yield, Resume's rounds, Detach's leaving the queues, and an
// election's identity writes; the caller names only what to send (a node.Op
// and a script call). Run registers the round under the lock's own mutex,
// in one step with the lock's held check where the round needs it held (an
// extension), and fixes its start s there; it then sends every request
// from s: D = s + node timeout (or the caller's earlier deadline) however
// long a goroutine waits before it sends. Unlock, Detach and Close change
// the lock's state under the same mutex, so a round is either registered
// before the release (s ≤ s_r, so D ≤ s_r + node timeout: covered by G) or
// never sent. Each request passes the node's gates, goes after the
// Client's own releases of the key that were in flight there at
// registration (an acquire), and carries that node's N (Set.notAfter,
// clock.go; one per lock and node in a batch). Every release of a token is
// node.Release (Unlock's round, and the cleanup of a failed or refused
// call's attempt) or node.Resend (the retry loop's and Close's pipelines of
// node.Parts); the caller names only the script and its arguments for the
// guard it is given. Each registers itself as a release of the key on
// each node before any goroutine sends it (what an acquire follows), and
// sizes its guard on a node (Token.guard): none only when each request of
// the token there was answered — the node replied (a late reply included),
// or the request provably never left the client: kept back by the Client
// (the node known down or stuck, the in-flight cap full), or refused a
// connection by a go-redis client whose retries are off (built with
// MaxRetries: -1, which go-redis stores as 0; Dial's clients keep
// go-redis's 3 retries, so their dial errors "may have landed") — else
// G above (Set.guardLifetime, guardclock.go); a release the node did not
// confirm goes to the Client's retry loop with G, unless it provably never
// left the client and no request of the token can land there. A timeout, a
// broken connection, or a dial error after go-redis may have retried a
// written request "may have landed". Requests do not inherit the caller's
// cancellation: they end at D, so a caller that cancels as it returns
// leaves no grant half-made. A lock handed over by Detach takes nothing of
// this with it: WaitOut (guardclock.go) waits until every round's requests
// have ended or the latest round has passed D, and where one went
// unanswered for G more, before the Lock
// call's entry is taken out of the queues; Resume writes nothing until a
// majority has confirmed the token.
// On a Redis Cluster node "the node's clock" is the clock of the key's
// master: the Client keeps one estimate per master, probed with a keyed
// script that only that master answers, and a request's bound and a
// release's guard use the estimate of its key's master (a Cluster's
// masters are separate hosts whose clocks may differ by seconds).
//
// Hence the guard no longer has to outlast the longest pause, and a release
// needs to reach a node only once: retried until the node answers. A key
// that a request set before its bound lives at most a TTL from then on the
// node's clock. The chaos checker (internal/chaos) allows a key of a released
// lock no extra time on a node that was paused, cut or killed since the
// release: its late-requests profile pauses a node right after a latency
// spike, with the requests the spike held in its socket, for longer than the
// guard used to live. The cost: the first request to each node after New
// waits for one TIME round trip (within the node timeout), and each node
// gets one TIME a second while the Client uses it.
//
// # Why fencing tokens strictly increase
//
// Let holder A commit its token t_A on a set of nodes M_A, a majority, and
// let B be the next holder, granted on a majority M_B. Two majorities of the
// same N nodes intersect: take a node x in both. On x, A's commit ran while
// x held A's key (the commit script checks the token), and B's grant ran when
// x held no key of A's — so A's commit ran before B's phase-1 read on x, and
// B read a counter ≥ t_A there. B's token is max(counters it read) + 1 >
// t_A. A commit can never land late and raise a counter after the key moved
// on, because it needs the key to still hold its token. A per-node INCR
// with the maximum over the granting nodes would not do: failed attempts
// bump counters on a minority, and a later grant on another majority can
// then return a smaller maximum.
//
// This needs the counters to survive: run the nodes with appendonly yes and
// appendfsync always, and with no eviction (maxmemory-policy noeviction);
// counters are small keys that are never deleted (one per resource per
// node). If a majority of nodes restarts empty, tokens can go back (a test
// shows it, behind QUORUMLOCK_BOUNDARY=1).
//
// A token protects a resource only if the resource checks it: it must
// remember the highest token it has accepted and refuse writes with a lower
// one. redlock.FencedSet does that for a resource stored in Redis; the
// example ExampleLock_Fence does it for one in the process.
//
// # The limits
//
// A lock service cannot stop a holder that does not look: a process that is
// paused (GC, SIGSTOP, a VM migration) longer than its validity wakes up
// believing it holds a lock that another client may now hold. Lost and
// Context tell a running process; only fencing tokens, checked by the
// resource itself, protect against a paused one. Without them, treat the
// lock as an efficiency device, not a correctness guarantee, or use fencing.
//
// A waiter is handed the key only while its Client listens on the node, so
// a waiter whose process died costs the next one nothing. A waiter whose
// process is alive but frozen (SIGSTOP, a long stall), or whose host
// vanished without closing its connections, is handed the key like any
// other, and holds up the next waiter for one reservation (2s at the
// default options: TestReal_frozenWaiterDelaysTheNextByOneReservation
// measures 2.1s with a 30s TTL); so is a dead waiter on Redis Cluster
// nodes, which cannot see who listens (a Client's channel lives on another
// shard than the key), until its entry lapses. A waiter that freezes or
// dies in the middle of an attempt keeps what that attempt was granted,
// as a frozen or dead holder would, until the TTL: a minority of the nodes
// (a majority would have made it the holder), which holds the others up
// only while the rest of the nodes that are up make no majority. Callers
// outside the queue (TryLock, WithWakeUp(false), other libraries'
// clients) get the key only when no live waiter is queued. "In order" means in the order of the
// callers' wall clocks: a host whose clock lags goes ahead of calls that
// started within its lag.
//
// A node that restarts empty within one TTL can break exclusion: a lock may
// sit on a bare majority (the other nodes were down when it was taken, and
// renewal has not healed them yet), and then one restarted node of that
// majority lets another client in (the chaos checker's negative control
// shows it every time). Persist the keys, delay restarts past the longest
// TTL, or use redlock.WithRestartGuard.
package quorumlock
