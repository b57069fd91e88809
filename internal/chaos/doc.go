// Package chaos is the fault-injection checker of quorumlock: it runs lock
// clients against real redis-server nodes while a nemesis injects faults,
// records what every client saw on one monotonic clock, and checks the
// history for violations of mutual exclusion, of fencing, and of lost-lock
// reporting.
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
// on the clients (a holder that stops past its TTL, then writes). Each
// [Profile] picks the faults and says whether it must show 0 violations
// (safe) or at least one (a negative control, which proves the checker
// sees).
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
//
// After a run, every client is closed and every fault undone, and the
// nodes are scanned for lock keys left behind. The package's tests check
// for leaked goroutines.
//
// Entry points: go test ./internal/chaos -run TestChaos -chaos.duration=20s,
// and go run ./internal/chaos/cmd/chaos -duration 5m.
package chaos
