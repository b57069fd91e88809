package election_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/election"
	"github.com/quorumlock/quorumlock/internal/redistest"
	"github.com/quorumlock/quorumlock/redlock"
)

// candidateOn is a candidate for election name on nodes, with a redlock
// Client of its own built with clientOpts. The client is closed by
// t.Cleanup.
func candidateOn(t *testing.T, nodes []redis.UniversalClient, name, id string, clientOpts []redlock.Option, opts ...election.Option) *candidate {
	t.Helper()
	client, err := redlock.New(nodes, clientOpts...)
	if err != nil {
		t.Fatalf("redlock.New: %v", err)
	}
	t.Cleanup(func() { client.Close() })
	e, err := election.New(client, name, append([]election.Option{election.WithIdentity(id)}, opts...)...)
	if err != nil {
		t.Fatalf("election.New: %v", err)
	}
	return &candidate{client: client, e: e}
}

// defaultClients returns clients of rc's nodes with go-redis's default
// options: no ContextTimeoutEnabled (a ctx deadline does not end a blocked
// read; the 3s read timeout does), retries on.
func defaultClients(t *testing.T, rc *redistest.Cluster) []redis.UniversalClient {
	t.Helper()
	var nodes []redis.UniversalClient
	for i := range rc.N() {
		n := redis.NewClient(&redis.Options{Addr: rc.Addr(i)})
		t.Cleanup(func() { n.Close() })
		nodes = append(nodes, n)
	}
	return nodes
}

// TestElection_handoverNodePaused checks that every election step decides at
// a majority (issue 22, item 6): with one of three nodes paused, the
// candidate waiting in Campaign takes office, and Leader answers, without
// waiting for the paused node — neither for the node timeout (2s here) nor,
// with go-redis's default options, for its 3s read timeout. Resign itself
// returns after redlock's Unlock, which waits for every node's answer (or
// the node timeout), and adds no wait of its own to it.
func TestElection_handoverNodePaused(t *testing.T) {
	t.Parallel()
	// The lock's node timeout, which the election takes by default: a step
	// that waited for the paused node would take at least this long.
	const nodeTimeout = 2 * time.Second
	// Measured: handover 3–35ms under -race on a loaded 2-core machine
	// (load 10), Leader a few ms — and 618ms once beside stress-ng --cpu 6
	// at load 17 (issue 44; a read of two live nodes, not a wait for the
	// paused one). The bounds catch any wait for the paused node (the node
	// timeout, 2s), with room for a whole retry delay (250ms at most) in
	// the handover. (A handover of 2.09s in the full suite was such a wait:
	// a liveness defect, TestElection_handoverSplitRoundNodePaused.)
	const stepBound, handoverBound = nodeTimeout / 2, time.Second
	// Resign: Unlock's wait for the paused node, plus election steps.
	const resignBound = nodeTimeout + stepBound
	for _, tc := range []struct {
		name  string
		nodes func(*testing.T, *redistest.Cluster) []redis.UniversalClient
	}{
		{"ContextTimeoutEnabled", func(_ *testing.T, rc *redistest.Cluster) []redis.UniversalClient { return rc.Clients() }},
		{"go-redis defaults", defaultClients},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := redistest.Start(t, 3)
			nodes := tc.nodes(t, rc)
			opts := []redlock.Option{redlock.WithNodeTimeout(nodeTimeout)}
			a := candidateOn(t, nodes, "paused-node", "a", opts)
			bHooks := &nodeErrorLog{}
			b := candidateOn(t, nodes, "paused-node", "b", append(opts, redlock.WithHooks(bHooks)))
			ta, err := a.e.Campaign(t.Context())
			if err != nil {
				t.Fatalf("a.Campaign: %v", err)
			}
			// a's token: the lock key's value on a majority. a holds on a
			// majority, not always on every node: its request to the last
			// node may land late and change nothing (beside stress-ng, b
			// then took that free node and gave it back, attempt after
			// attempt, and was never queued there).
			aToken := majorityValue(t, rc, "lock:paused-node")
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			bch := campaign(ctx, b)
			// b waits in line on every node where a holds before node 0
			// pauses: a fixed 300ms was not always enough at load 15 under
			// -race, and b, not queued on a node, waited the node timeout
			// there.
			if !eventually(10*time.Second, func() bool {
				for i := range rc.N() {
					if v, _ := rc.Admin(i).Get(ctx, "lock:paused-node").Result(); v != aToken {
						continue // a does not hold here: nothing to wait behind
					}
					if n, err := rc.Admin(i).ZCard(ctx, "lock:paused-node:queue").Result(); err != nil || n == 0 {
						return false
					}
				}
				return true
			}) {
				var cards []string
				for i := range rc.N() {
					n, err := rc.Admin(i).ZCard(t.Context(), "lock:paused-node:queue").Result()
					v, _ := rc.Admin(i).Get(t.Context(), "lock:paused-node").Result()
					cards = append(cards, fmt.Sprintf("node %d: %d (%v), a holds %v", i, n, err, v == aToken))
				}
				select {
				case r := <-bch:
					t.Fatalf("b is not queued on every node 10s after its Campaign began: its Campaign returned %v; queue entries %s", r.err, strings.Join(cards, ", "))
				default:
				}
				t.Fatalf("b is not queued on every node 10s after its Campaign began (it still waits); queue entries %s; b's node errors: %s", strings.Join(cards, ", "), bHooks.String())
			}
			rc.Pause(0)
			// Before the clients close: their stragglers then end at once.
			t.Cleanup(func() { rc.Resume(0) })

			start := time.Now()
			if err := ta.Resign(t.Context()); err != nil {
				t.Fatalf("a.Resign: %v", err)
			}
			resigned := time.Since(start)
			r := waitResult(t, bch, 10*time.Second, "b.Campaign after a resigned")
			if r.err != nil {
				t.Fatalf("b.Campaign: %v", r.err)
			}
			handover := r.at.Sub(start)
			t.Logf("node 0 paused: Resign %v, Resign → b's Campaign returned %v", resigned, handover)
			if resigned > resignBound {
				t.Errorf("Resign took %v with 1 of 3 nodes paused; want ≤ %v", resigned, resignBound)
			}
			if handover > handoverBound {
				t.Errorf("handover took %v with 1 of 3 nodes paused; want ≤ %v", handover, handoverBound)
			}
			begin := time.Now()
			leaderIs(t, a.e, "b")
			if took := time.Since(begin); took > stepBound {
				t.Errorf("Leader() took %v with 1 of 3 nodes paused; want ≤ %v", took, stepBound)
			}
			begin = time.Now()
			if err := r.t.Resign(t.Context()); err != nil {
				t.Fatalf("b.Resign: %v", err)
			}
			if took := time.Since(begin); took > resignBound {
				t.Errorf("b.Resign took %v with 1 of 3 nodes paused; want ≤ %v", took, resignBound)
			}
		})
	}
}

// TestElection_slowNodes checks that the election's requests take the
// lock's node timeout and cost the lock no pooled connection (issue 22,
// item 7): with two of three nodes at a 1.1s round trip, below the lock's
// 2s node timeout (and far above the election's former 500ms), a Campaign
// succeeds, and a single lock attempt after it still finds a live
// connection on a slow node (a fresh one needs HELLO before the script: two
// round trips, past the node timeout). The margins (0.9s either way of a
// round trip) hold beside busy loops under -race.
func TestElection_slowNodes(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	nodes := rc.Clients()
	c := candidateOn(t, nodes, "slow", "a", []redlock.Option{redlock.WithNodeTimeout(2 * time.Second)})
	// Load the scripts and fill each pool while the nodes are fast.
	term, err := c.e.Campaign(t.Context())
	if err != nil {
		t.Fatalf("Campaign with fast nodes: %v", err)
	}
	if err := term.Resign(t.Context()); err != nil {
		t.Fatalf("Resign: %v", err)
	}
	l, err := c.client.TryLock(t.Context(), "other")
	if err != nil {
		t.Fatalf("TryLock with fast nodes: %v", err)
	}
	if err := l.Unlock(t.Context()); err != nil {
		t.Fatalf("Unlock: %v", err)
	}

	const latency = 550 * time.Millisecond // each way
	rc.SetLatency(1, latency)
	rc.SetLatency(2, latency)
	pools := func() (dialed, open uint32) {
		for _, i := range []int{1, 2} {
			st := nodes[i].(*redis.Client).PoolStats()
			dialed, open = dialed+st.Misses, open+st.TotalConns
		}
		return dialed, open
	}
	dialedBefore, openBefore := pools()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	start := time.Now()
	term, err = c.e.Campaign(ctx)
	if err != nil {
		t.Fatalf("Campaign with 2 of 3 nodes at a %v round trip (lock node timeout 2s): %v", 2*latency, err)
	}
	t.Logf("Campaign at a %v round trip: %v", 2*latency, time.Since(start))
	if err := term.Resign(ctx); err != nil {
		t.Fatalf("Resign: %v", err)
	}
	l, err = c.client.TryLock(ctx, "other")
	if err != nil {
		t.Fatalf("TryLock after the election's steps, 2 of 3 nodes at a %v round trip: %v", 2*latency, err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Errorf("Unlock: %v", err)
	}
	dialed, open := pools()
	t.Logf("slow nodes, over Campaign, Resign, TryLock, Unlock: %d connections dialed; open before %d, after %d",
		dialed-dialedBefore, openBefore, open)
}

// TestTerm_identityFollowsRenewals checks that the leader's identity never
// lapses while its term is valid (issue 22, item 8): with TTL 2s and a
// renewal every 1.8s, the lock key's TTL is short just before each renewal,
// and an identity refreshed on a fixed period copied it too early.
func TestTerm_identityFollowsRenewals(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	// Node timeout 100ms: interval + node timeout stays below TTL − drift.
	lockOpts := []redlock.Option{redlock.WithTTL(2 * time.Second), redlock.WithRenewInterval(1800 * time.Millisecond),
		redlock.WithNodeTimeout(100 * time.Millisecond)}
	leader := newCandidate(t, rc, "lapse", "a", lockOpts)
	obs := newCandidate(t, rc, "lapse", "observer", nil)
	// A campaign whose identity writes missed the 100ms node timeout (at
	// load 15 under -race) fails with ErrNoQuorum and is retried, as Run
	// does.
	campaign := func() *election.Term {
		for try := 0; ; try++ {
			term, err := leader.e.Campaign(t.Context())
			if err == nil {
				return term
			}
			if !errors.Is(err, redlock.ErrNoQuorum) || try == 9 {
				t.Fatalf("Campaign: %v", err)
			}
			t.Logf("Campaign = %v; again", err)
		}
	}
	term := campaign()
	defer func() { term.Resign(context.Background()) }()
	// A term whose renewal missed the 100ms node timeout (in the full
	// suite beside stress-ng, load 8-11) ends: not what this test is
	// about. It campaigns again, up to 5 times, and polls 6s of valid
	// terms in all.
	var polls, lapses, ended int
	for left := 6 * time.Second; left > 0; time.Sleep(20 * time.Millisecond) {
		start := time.Now()
		l, err := obs.e.Leader(t.Context())
		if term.Context().Err() != nil || !time.Now().Before(term.ValidUntil()) {
			if ended++; ended > 5 {
				t.Fatalf("the term ended %d times (last: %v): renewals failed, not the identity", ended, context.Cause(term.Context()))
			}
			t.Logf("after %d polls the term ended (%v): a renewal failed; campaigning again", polls, context.Cause(term.Context()))
			term.Resign(context.Background())
			term = campaign()
			continue
		}
		left -= time.Since(start) + 20*time.Millisecond
		polls++
		switch {
		case errors.Is(err, election.ErrNoLeader):
			lapses++
		case err != nil:
			t.Fatalf("Leader(): %v", err)
		case l.Term != term.Leader().Term:
			t.Fatalf("Leader() = %+v; want the term %+v", l, term.Leader())
		}
	}
	if lapses > 0 {
		t.Errorf("%d of %d Leader() polls over 6s answered ErrNoLeader while the term was valid; want 0", lapses, polls)
	}
}

// TestElection_afterClose checks that the election's steps send nothing
// once the redlock Client is closed: their requests run on the Client's
// goroutines, which it no longer starts.
func TestElection_afterClose(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	n := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { n.Close() })
	c := candidateOn(t, []redis.UniversalClient{n}, "closed", "a", nil)
	if err := c.client.Close(); err != nil {
		t.Fatal(err)
	}
	_, err := c.e.Leader(t.Context())
	if !errors.Is(err, election.ErrNoQuorum) || !errors.Is(err, redlock.ErrClosed) {
		t.Errorf("Leader() after Close = %v; want ErrNoQuorum and redlock.ErrClosed", err)
	}
	var ne *redlock.NodeError
	if !errors.As(err, &ne) {
		t.Errorf("Leader() after Close = %v; want a *redlock.NodeError", err)
	}
	if _, err := c.e.Campaign(t.Context()); !errors.Is(err, redlock.ErrClosed) {
		t.Errorf("Campaign() after Close = %v; want redlock.ErrClosed", err)
	}
	if got := m.CommandCount(); got != 0 {
		t.Errorf("%d commands reached the node after Close; want 0", got)
	}
}

// majorityValue returns the value key holds on a majority of rc's nodes,
// and fails the test if none does.
func majorityValue(t *testing.T, rc *redistest.Cluster, key string) string {
	t.Helper()
	count := make(map[string]int)
	for i := range rc.N() {
		if v, err := rc.Admin(i).Get(t.Context(), key).Result(); err == nil {
			if count[v]++; count[v] > rc.N()/2 {
				return v
			}
		}
	}
	t.Fatalf("%s holds no value on a majority of nodes: %v", key, count)
	return ""
}

// nodeErrorLog is a redlock.Hooks that keeps the node errors and the
// attempts' outcomes it sees, for a failure's message.
type nodeErrorLog struct {
	redlock.NoHooks
	mu       sync.Mutex
	errs     map[string]int // "node i op kind: err" → how many
	attempts map[string]int // outcome and granted → how many
}

func (l *nodeErrorLog) NodeError(_ context.Context, info redlock.NodeErrorInfo) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.errs == nil {
		l.errs = make(map[string]int)
	}
	l.errs[fmt.Sprintf("node %d %s %s: %v", info.Node, info.Op, info.Kind, info.Err)]++
}

func (l *nodeErrorLog) Attempt(_ context.Context, info redlock.AttemptInfo) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.attempts == nil {
		l.attempts = make(map[string]int)
	}
	l.attempts[fmt.Sprintf("%s, %d granted", info.Outcome, info.Granted)]++
}

func (l *nodeErrorLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return fmt.Sprintf("%v; attempts: %v", l.errs, l.attempts)
}
