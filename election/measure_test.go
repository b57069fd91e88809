package election_test

import (
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/election"
	"github.com/quorumlock/quorumlock/internal/redistest"
	"github.com/quorumlock/quorumlock/redlock"
)

// The measurements of docs/qlock.md. They are skipped unless their
// environment variable sets the number of trials:
//
//	QUORUMLOCK_ELECTION_TRIALS=50 go test -count=1 -v -run TestMeasure_handover ./election
//	QUORUMLOCK_ELECTION_TRIALS=20 go test -count=1 -v -run TestMeasure_handoverNodePaused ./election
//	QUORUMLOCK_TAKEOVER_TRIALS=10 go test -count=1 -v -run TestMeasure_takeover ./election

func trials(t *testing.T, env string) int {
	t.Helper()
	n, err := strconv.Atoi(os.Getenv(env))
	if err != nil || n <= 0 {
		t.Skipf("set %s to the number of trials", env)
	}
	return n
}

// directCandidate is a candidate whose clients reach the servers directly,
// without the test proxies, so that the figures are those of plain
// connections.
func directCandidate(t *testing.T, rc *redistest.Cluster, name, id string, lockOpts ...redlock.Option) *candidate {
	t.Helper()
	return directCandidateWith(t, rc, true, name, id, lockOpts...)
}

// directCandidateWith is directCandidate with node clients that set
// ContextTimeoutEnabled as ctxTimeout says (false: go-redis's defaults).
func directCandidateWith(t *testing.T, rc *redistest.Cluster, ctxTimeout bool, name, id string, lockOpts ...redlock.Option) *candidate {
	t.Helper()
	var nodes []redis.UniversalClient
	for i := range rc.N() {
		n := redis.NewClient(&redis.Options{Addr: rc.ServerAddr(i), ContextTimeoutEnabled: ctxTimeout})
		t.Cleanup(func() { n.Close() })
		nodes = append(nodes, n)
	}
	client, err := redlock.New(nodes)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	e, err := election.New(client, name, election.WithIdentity(id), election.WithLockOptions(lockOpts...))
	if err != nil {
		t.Fatal(err)
	}
	return &candidate{client: client, e: e}
}

// quantile returns the q-quantile of sorted ds (nearest rank).
func quantile(ds []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(ds))+0.5) - 1
	return ds[min(max(i, 0), len(ds)-1)]
}

// handovers runs n handovers between the candidates cs, which campaign for
// one election, and returns, sorted, the time from each Resign to the
// return of the waiting candidate's Campaign, and how long each Resign
// took. pause, if not nil, runs once the first candidate leads.
func handovers(t *testing.T, cs []*candidate, n int, pause func()) (handover, resign []time.Duration) {
	t.Helper()
	term, err := cs[0].e.Campaign(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if pause != nil {
		pause()
	}
	for i := range n {
		ch := campaign(t.Context(), cs[(i+1)%len(cs)])
		time.Sleep(100 * time.Millisecond) // the candidate is waiting in line
		start := time.Now()
		if err := term.Resign(t.Context()); err != nil {
			t.Fatal(err)
		}
		resign = append(resign, time.Since(start))
		r := waitResult(t, ch, 10*time.Second, "Campaign after Resign")
		if r.err != nil {
			t.Fatal(r.err)
		}
		handover = append(handover, r.at.Sub(start))
		term = r.t
	}
	_ = term.Resign(t.Context())
	slices.Sort(handover)
	slices.Sort(resign)
	return handover, resign
}

// TestMeasure_handover measures the time from a leader's Resign to the
// return of the Campaign call of the candidate waiting for it, on 3 local
// nodes.
func TestMeasure_handover(t *testing.T) {
	n := trials(t, "QUORUMLOCK_ELECTION_TRIALS")
	rc := redistest.Start(t, 3)
	ds, _ := handovers(t, []*candidate{directCandidate(t, rc, "handover", "a"), directCandidate(t, rc, "handover", "b")}, n, nil)
	t.Logf("handover after Resign, %d trials, 3 nodes: p50 %v, p99 %v, min %v, max %v",
		n, quantile(ds, 0.5), quantile(ds, 0.99), ds[0], ds[len(ds)-1])
}

// TestMeasure_handoverNodePaused is TestMeasure_handover with node 0 of 3
// paused (SIGSTOP) for the whole run, with node clients built with
// ContextTimeoutEnabled and with go-redis's defaults. It also reports how
// long Resign took: it returns after redlock's Unlock, which waits for
// every node's answer, so for the lock's node timeout (1s, TTL 30s).
func TestMeasure_handoverNodePaused(t *testing.T) {
	n := trials(t, "QUORUMLOCK_ELECTION_TRIALS")
	for _, ctxTimeout := range []bool{true, false} {
		t.Run(map[bool]string{true: "ContextTimeoutEnabled", false: "go-redis defaults"}[ctxTimeout], func(t *testing.T) {
			rc := redistest.Start(t, 3)
			cs := []*candidate{directCandidateWith(t, rc, ctxTimeout, "handover", "a"), directCandidateWith(t, rc, ctxTimeout, "handover", "b")}
			ds, rs := handovers(t, cs, n, func() {
				rc.Pause(0)
				t.Cleanup(func() { rc.Resume(0) }) // before the clients close
			})
			t.Logf("handover after Resign, %d trials, 3 nodes, node 0 paused: p50 %v, p99 %v, min %v, max %v",
				n, quantile(ds, 0.5), quantile(ds, 0.99), ds[0], ds[len(ds)-1])
			t.Logf("Resign itself (redlock's Unlock waits for the paused node): p50 %v, max %v", quantile(rs, 0.5), rs[len(rs)-1])
		})
	}
}

// TestMeasure_takeover measures the time from SIGSTOP of a leader process to
// the return of the Campaign call of the candidate waiting for it.
func TestMeasure_takeover(t *testing.T) {
	n := trials(t, "QUORUMLOCK_TAKEOVER_TRIALS")
	const ttl = 2 * time.Second
	rc := redistest.Start(t, 3)
	var ds, after []time.Duration
	for i := range n {
		name := "takeover-" + strconv.Itoa(i)
		c := newCandidate(t, rc, name, "successor", []redlock.Option{redlock.WithTTL(ttl)})
		took, afterExpiry := pausedTakeover(t, rc, c, name, ttl)
		ds, after = append(ds, took), append(after, afterExpiry)
	}
	slices.Sort(ds)
	slices.Sort(after)
	t.Logf("takeover after the leader's SIGSTOP, %d trials, TTL %v (renewed every TTL/3): p50 %v (%.2f TTL), max %v (%.2f TTL), min %v",
		n, ttl, quantile(ds, 0.5), quantile(ds, 0.5).Seconds()/ttl.Seconds(), ds[len(ds)-1], ds[len(ds)-1].Seconds()/ttl.Seconds(), ds[0])
	t.Logf("of which after the old lease ended on the nodes: p50 %v, max %v, min %v",
		quantile(after, 0.5), after[len(after)-1], after[0])
}
