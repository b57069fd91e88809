// Package sim is the simulation tester of quorumlock (issue 23): the real
// redlock.Client and the real Lua scripts of internal/scripts, run against
// in-memory miniredis nodes inside a testing/synctest bubble, where time is
// the bubble's fake clock (miniredis expires keys by it, and TIME — also
// inside the scripts — reads it). Every node client's Dialer returns one
// end of a net.Pipe whose other end miniredis serves, and every byte
// passes through a fault layer (network) that delays, resets, pauses and
// freezes connections as a seeded Plan says.
//
// A run ([Run]) draws nothing itself: the Plan (from [NewPlan] and a seed)
// fixes the cluster, the options, the faults and their times, and each
// workload goroutine draws its choices from a generator of its own keyed
// by the seed ([Env.Rand]). Goroutine scheduling inside the bubble is not
// fully deterministic, so a replay of a seed runs the same plan and the
// same choices, in an interleaving that may differ.
//
// The invariants checked on every run are in [History] (no overlap of
// holds, fencing tokens rising, fenced writes never applied backwards,
// the liveness bound once faults stopped), in [LockProfile] (Lock never
// returns an invalid lock, a released key never comes back) and in Run
// itself (no goroutine of the library outlives Close; the bubble's
// goroutines stay bounded). Synchronizers other than the lock join as a
// [Profile] with invariants of their own: [SemaphoreProfile] (at most K
// holders at once) and [RWLockProfile] (a writer holds alone), one seed
// in ten and one in five of the seed loop, and [ElectionProfile], one
// seed in ten, runs package election's candidates, an observer of
// Leader and a watcher of Observe (terms never overlap, fences rise, a
// leader within a bound, Observe in order and within a bound; see
// docs/simulation.md).
//
// Each node's clock drifts within the drift factor (a miniredis pre-hook
// sets it before every command), a long-hold episode freezes or cuts off
// a holder for longer than the TTL and ends its hold only at Lost(), and
// the key-back check covers every token a Client gave up, seen on the
// wire (issue 33). Faults aimed at one phase (aimed.go) drop a fence
// commit on a majority of links, cut a long holder off right after a
// renewal whose replies came late, and start Lock calls of every Client
// at one instant (equal tickets); a semaphore waiter is granted within a
// bound while fewer than K hold (sem-liveness); and a seed that never
// ends (a loop that stops the fake clock) is reported after -sim.hang of
// wall time. Issue 33's third session added a handoff episode (a lock
// held by a majority of handoffs naming attempts far apart, then cut off
// from that majority), a yield episode (a waiter frozen right after it
// yielded and kept half of 4 nodes: yield-kept), unlock-not-held (Unlock
// of a valid lock never says no node held it) and rw-liveness (the
// read-write lock's waiters are not kept out while nobody holds). Issue
// 42 added the residue check (residue.go: every key of every kind on every
// node belongs to a token a Client sent, lives no longer than its kind's
// bound, and is gone within a bound once its token was given up or its
// Client closed), leader-current (Leader names the term that holds while
// no fault is under way), and plans aimed at the code written since
// (aimed42.go: latency in the quiet phase, slow clock probes, delayed
// handoff messages, a mid-run Close, an Extend started while Detach
// waits, long holds in the quiet phase, K = 3 semaphores, a majority
// paused during a Resume's re-arm, a key evicted before a Resume, the
// holder locking again) with their checks: resume-honest (a Resume's
// error against the keys the nodes hold), resume-heal (a node that did
// not confirm a Resume's re-arm is healed at once) and reentry
// (ErrAlreadyHeld at once). A quiet lag of a quarter node timeout or
// more each way cuts requests over new connections, and counts as a
// fault. Issue 42's fifth session added the observer
// every Client carries (margin.go: margin, an extension's reported
// margin against the keys the nodes hold; decided, a failed attempt
// had no majority within reach when it stopped), slow TIME far (probes
// slowed 0.6-0.85 node timeouts) and the subscribe-close episode
// (subclose.go: a Client closed while its subscriptions are in their
// first SUBSCRIBE; hang) and the late-handoff episode (latehandoff.go:
// a queued attempt handed a key half a node timeout into its round
// while nodes are pending; decided). Its sixth session added the guard
// episode (guard.go: Clients of their own, whose clock probes the
// network slows by the episode's delays, race an Extend held until 1 ms
// short of the not-after bound it carries against the Unlock: with a
// young estimate, with the held round settled and another registered,
// and with an estimate refreshed between the Extend and the release;
// key-back). The simulator's power is measured by mutation:
// internal/sim/mutate applies the one-line mutants of its mutants.txt to
// a scratch copy and reports which invariant caught each.
//
// The tests (sim_test.go) run 500 seeds by default (-sim.seeds=N, 60
// under -race), replay one with -sim.seed=S, and check that each negative
// control of internal/testhooks is caught (TestControls). See
// docs/simulation.md.
package sim
