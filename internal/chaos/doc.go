// Package chaos is the fault-injection checker of quorumlock: it runs lock
// clients against real redis-server nodes while a nemesis injects faults,
// records what every client saw on one monotonic clock, and checks the
// history for violations of mutual exclusion, of fencing, of lost-lock
// reporting, and of releases (a released lock's key must not come back, and
// Lock must return only valid locks).
//
// # The run
//
// C clients (each its own redlock.Client, auto-renew and fencing on) loop
// over R resources: Lock, then write to a shared in-process [Register] at
// once and at random intervals while Lock.Valid holds, then Unlock. The
// register, fenced or not per profile, records every write offered: writer,
// hold, token, time, applied or refused. The nemesis acts on the nodes
// through internal/redistest (SIGSTOP/SIGCONT, SIGKILL and a restart after
// more than the TTL, latency, cuts and resets through the node's proxy) and
// on the clients (a holder that stops past its TTL, then writes). The
// late-requests profile adds the faults of issue 12: short latency spikes on
// one node that hold the requests it reads for 1.5–4× the node timeout, so
// that they land after their caller gave up and can be overtaken by a later
// release, and one spike in three followed at once by a pause (SIGSTOP) of
// that node for 2.2–3×TTL, so that the requests it held wait in its socket
// while their locks are unlocked, and run when it resumes (issue 21 item
// 10: past the release guard of before, two TTLs); raw subscribers on every Client's wake-up channel, so that
// every handoff finds a listener; and nodes killed while clients wait in Lock and restarted empty
// after the TTL (sometimes paused at once). The frozen-waiter profile puts
// every client on one resource and freezes (SIGSTOP) a child process of
// the test binary while it waits in Lock, for longer than the TTL: the
// checker's WaitBound then requires the next hold after every release to
// begin within one reservation, a retry delay and two node timeouts (plus
// the slack) while a client waits. Each [Profile] picks the faults and says whether it
// must show 0 violations (safe) or at least one (a negative control, which
// proves the checker sees).
//
// The semaphore profiles run redlock.Semaphore (K=2): "semaphore" has the
// clients share one semaphore under the minority nemesis; "semaphore-split"
// has K+1 clients acquire, each with a different minority of nodes cut, so
// that their majorities are ones that fool a per-node count ({0,1,2},
// {3,4,0}, {1,2,3} of 5: no node sees more than 2); its negative control,
// "semaphore-counted", runs that scenario on a semaphore that counts holders
// per node and asks a majority (a test-only design in this package, never
// in redlock), and must show K+1 holders.
//
// # The checker
//
// [Check] works on a [Snapshot] of the history; every time in it is a
// time.Now() reading of this one process, so all share one monotonic clock.
//
//   - A hold is the interval [Lock returned, min(Unlock called, Lost()
//     closed, OnLost called, last ValidUntil)]. Two holds of one resource
//     that intersect are an overlap.
//   - In the order holds started, each fencing token must exceed every
//     earlier token of the resource.
//   - Replaying the register's writes in order, a write applied with a
//     token below one applied earlier is a stale write.
//   - A write made outside its writer's own hold is flagged; applied after
//     another hold of the resource had started, it is a violation.
//   - Loss reports are measured against ValidUntil; for majority-loss
//     events, from the moment the majority went away.
//   - Lock and TryLock must return only valid locks: Valid() is read the
//     moment they return, and false is a violation.
//   - No key of a released lock may come back. A sampler reads every lock
//     key with its PTTL on every node, directly (not through the proxies),
//     every TTL/25 during the run and once after it, and records each key
//     holding the token of a lock whose Unlock had returned before the read
//     was sent. The PTTL says when the key was last written. Written before
//     Unlock returned (plus a 20ms settle), it was left by a release that
//     had not landed yet (a slow, paused or cut node). Written later, a
//     request of ours landed after the release: if the key is seen at least
//     TTL/2 old, it came back (a violation), else it raced a release still
//     in flight behind it, which deleted it. On a node under a fault since
//     the release, the age counts from the fault's end: a request the node
//     held is past its not-after bound when the node comes back (DESIGN
//     step 4; the proof is in the module's doc), but our release may land
//     late there (the Client holds requests back from a stuck node for up
//     to a second), and meanwhile another client's release may hand the
//     key to our finished token for one reservation: nodes paused, cut,
//     killed or slowed get one TTL and a second more; latency spikes (the
//     late-requests profile) get none. The negative control release-unguarded turns the release
//     guard and the bounds off (testhooks.SkipReleaseGuard, SkipNotAfter),
//     and late-unbounded only the bounds, keeping the short guard that
//     they allow; both must show a key come back.
//   - Semaphores: the holds of a semaphore's permits (resources
//     "<name>:permit:…") are intervals as above; a hold that begins while K
//     others are alive is a violation (more than K holders).
//   - With a WaitBound (frozen-waiter), after each release of a resource
//     that a client waits for in Lock, the next hold must begin within the
//     bound; a handover that a frozen grantee held for its whole TTL (the
//     library before the short reservation) fails it.
//   - The rwlock profile (issue 24) runs read-write locks, readers:writers
//     9:1 (Config.RW), under the minority nemesis: two read holds
//     (Hold.Shared) may overlap, a write hold and any other may not;
//     readers have no fence and do not write to the register. Its negative
//     control, rwlock-reader-ignores-writer, grants readers beside a writer
//     (testhooks.ReaderIgnoresWriter) and must show overlaps.
//
// After a run, every client is closed and every fault undone, and the
// nodes are scanned for lock keys left behind. The package's tests check
// for leaked goroutines.
//
// Results, per profile, are in [Outcome] (and its JSON); counts that are not
// violations, such as keys seen left after a release or wake-up messages,
// are there too.
//
// Entry points: go test ./internal/chaos -run TestChaos -chaos.duration=20s,
// and go run ./internal/chaos/cmd/chaos -duration 5m.
package chaos
