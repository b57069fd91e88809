package election_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/internal/redistest"
	"github.com/quorumlock/quorumlock/internal/testhooks"
	"github.com/quorumlock/quorumlock/redlock"
)

// TestElection_handoverSplitRoundNodePaused reproduces, without load, the
// 2.09s handover TestElection_handoverNodePaused saw in the full suite
// (issue 44): the leader a holds 2 of 3 nodes (its request to the third
// landed late and changed nothing, which load makes likelier), so the
// waiter b's attempts take the free node and are refused by the other
// two. With one of those paused, b's next attempt is split — the free
// node grants, the other refuses — and waits for the paused one until
// the node timeout. a resigns meanwhile and its release hands b the key
// on the node that refused, so b holds a majority. Before the attempt in
// flight counted that handoff (redlock's inFlight), b's Campaign returned
// only when the attempt gave up on the paused node: 1.80-1.91s of the 2s
// node timeout in 6 of 7 runs (1.80s in both subtests with inFlight
// disabled). Since, 6-75ms in 10 of 10 runs beside stress-ng --cpu 2
// (load ~5, -race):
//
//	go test -count=1 -v -run TestElection_handoverSplitRoundNodePaused ./election
//
// The bound, 500ms, is over 5x that and a quarter of the node timeout.
func TestElection_handoverSplitRoundNodePaused(t *testing.T) {
	// a's requests all land; the set-up frees node 2.
	t.Run("a on every node", func(t *testing.T) { handoverSplitRound(t, -1) })
	// a's Campaign returns on two grants and its request to node 0 lands
	// after its bound (load makes it likelier). The set-up freed node 2
	// regardless, which left a one node: b won at once and the set-up
	// waited in vain for it to queue ("b is not queued on nodes 0 and 1
	// 10s after its Campaign began", 1 of 10 beside two busy loops). It
	// now reads where a holds.
	t.Run("a's request to node 0 late", func(t *testing.T) { handoverSplitRound(t, 0) })
}

// handoverSplitRound runs the test, with a's first request to node late
// (-1: none) held past the node timeout before it is sent.
func handoverSplitRound(t *testing.T, late int) {
	const nodeTimeout = 2 * time.Second
	const key = "lock:split"
	rc := redistest.Start(t, 3)
	var lateOnce, watching atomic.Bool
	var watched atomic.Int32
	inFlight := make(chan struct{}, 1)
	hook := func(k string, node int) {
		if k != key {
			return
		}
		if node == late && lateOnce.CompareAndSwap(false, true) {
			time.Sleep(nodeTimeout + nodeTimeout/4)
		}
		if watching.Load() && node == int(watched.Load()) {
			select {
			case inFlight <- struct{}{}:
			default:
			}
		}
	}
	testhooks.AcquirePause.Store(&hook)
	defer testhooks.AcquirePause.Store(nil)
	nodes := rc.Clients()
	opts := []redlock.Option{redlock.WithNodeTimeout(nodeTimeout)}
	a := candidateOn(t, nodes, "split", "a", opts)
	bh := &grantedAttempts{start: time.Now()}
	b := candidateOn(t, nodes, "split", "b", append(opts[:len(opts):len(opts)], redlock.WithHooks(bh)))
	aStart := time.Now()
	ta, err := a.e.Campaign(t.Context())
	if err != nil {
		t.Fatalf("a.Campaign: %v", err)
	}
	aToken := majorityValue(t, rc, key)
	held := holding(t, rc, key, aToken)
	if len(held) < rc.N() {
		// a's request to the third node may still land: it changes
		// nothing once the node's clock passed its bound, the node
		// timeout from the round's start (give or take the clock
		// estimate's error, a few ms; half a node timeout spare).
		time.Sleep(time.Until(aStart.Add(nodeTimeout + nodeTimeout/2)))
		held = holding(t, rc, key, aToken)
	}
	// a holds two nodes, one of them to be paused and the other to hand
	// b the key; the third is free for b.
	free := 2
	switch len(held) {
	case 3:
		// The state load makes: a's request to node 2 landed late.
		if err := rc.Admin(free).Del(t.Context(), key).Err(); err != nil {
			t.Fatal(err)
		}
		held = held[:2]
	case 2:
		free = 3 - held[0] - held[1]
	default:
		t.Fatalf("a holds %s on nodes %v only", key, held)
	}
	paused, handing := held[0], held[1]
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	bch := campaign(ctx, b)
	if !eventually(10*time.Second, func() bool {
		for _, i := range held {
			if v, _ := rc.Admin(i).Get(ctx, key).Result(); v != aToken {
				return false
			}
			if n, err := rc.Admin(i).ZCard(ctx, key+":queue").Result(); err != nil || n == 0 {
				return false
			}
		}
		return true
	}) {
		ended := "still running"
		select {
		case r := <-bch:
			ended = fmt.Sprintf("returned %v at %v", r.err, r.at.Sub(bh.start))
		default:
		}
		t.Fatalf("b is not queued on nodes %v 10s after its Campaign began (b's Campaign %s)\nnodes: %s\nb's attempts and node errors:\n%s",
			held, ended, nodeState(rc, key), bh)
	}
	rc.Pause(paused)
	t.Cleanup(func() { rc.Resume(paused) })
	// b's next attempt (one retry delay, 250ms at most) is split: granted
	// by the free node, refused by the handing one, waiting for the
	// paused one, which holds it up to the node timeout. Its request to
	// the paused node is on its way; 200ms more, a tenth of that wait,
	// for the other two to answer (should they answer later, a's release
	// makes the handing node grant: b wins by grants, and the test
	// passes without the in-flight handoff it is about).
	watched.Store(int32(paused))
	watching.Store(true)
	select {
	case <-inFlight:
	case <-time.After(10 * time.Second):
		t.Fatalf("no attempt of b's was sent to the paused node %d within 10s", paused)
	}
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	if err := ta.Resign(t.Context()); err != nil {
		t.Fatalf("a.Resign: %v", err)
	}
	r := waitResult(t, bch, 10*time.Second, "b.Campaign after a resigned")
	if r.err != nil {
		t.Fatalf("b.Campaign: %v", r.err)
	}
	handover := r.at.Sub(start)
	t.Logf("node %d paused, node %d handing over, node %d free: Resign → b's Campaign returned %v", paused, handing, free, handover)
	if handover > 500*time.Millisecond {
		t.Errorf("handover took %v with b's attempt split and node %d paused; want ≤ 500ms (b held a majority after the release)", handover, paused)
	}
	// The attempt that won counts the node handed to it as granted: hooks
	// and metrics never see a success with fewer grants than the quorum.
	if got := bh.last(); got.Granted < got.Quorum || got.Granted+got.Pending-got.Quorum < 0 {
		t.Errorf("b's successful attempt reported Granted %d, Pending %d, Quorum %d; want Granted >= Quorum and a margin >= 0", got.Granted, got.Pending, got.Quorum)
	}
	_ = r.t.Resign(context.Background())
}

// holding returns the nodes of rc where key holds value.
func holding(t *testing.T, rc *redistest.Cluster, key, value string) []int {
	t.Helper()
	var on []int
	for i := range rc.N() {
		if v, _ := rc.Admin(i).Get(t.Context(), key).Result(); v == value {
			on = append(on, i)
		}
	}
	return on
}

// grantedAttempts records the last successful attempt a Client reported,
// and every attempt and node error, for a failure's message.
type grantedAttempts struct {
	redlock.NoHooks
	start time.Time
	mu    sync.Mutex // protects the fields below
	info  redlock.AttemptInfo
	log   []string
}

func (g *grantedAttempts) Attempt(_ context.Context, info redlock.AttemptInfo) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if info.Err == nil {
		g.info = info
	}
	g.log = append(g.log, fmt.Sprintf("%v: attempt %s, granted %d, pending %d, %v (%v)",
		time.Since(g.start).Round(time.Millisecond), info.Outcome, info.Granted, info.Pending, info.Latency.Round(time.Millisecond), info.Err))
}

func (g *grantedAttempts) NodeError(_ context.Context, info redlock.NodeErrorInfo) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.log = append(g.log, fmt.Sprintf("%v: node %d %s %s: %v", time.Since(g.start).Round(time.Millisecond), info.Node, info.Op, info.Kind, info.Err))
}

func (g *grantedAttempts) String() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return strings.Join(g.log, "\n")
}

// nodeState describes key and its queue on every node of rc.
func nodeState(rc *redistest.Cluster, key string) string {
	var b strings.Builder
	for i := range rc.N() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		v, verr := rc.Admin(i).Get(ctx, key).Result()
		pttl, _ := rc.Admin(i).PTTL(ctx, key).Result()
		q, qerr := rc.Admin(i).ZRangeWithScores(ctx, key+":queue", 0, -1).Result()
		cancel()
		fmt.Fprintf(&b, "\n  node %d: %q (%v, PTTL %v), queue %v (%v)", i, v, verr, pttl, q, qerr)
	}
	return b.String()
}

func (g *grantedAttempts) last() redlock.AttemptInfo {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.info
}
