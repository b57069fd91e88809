package election_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/election"
	"github.com/quorumlock/quorumlock/internal/redistest"
	"github.com/quorumlock/quorumlock/redlock"
)

// candidate is one candidate with a redlock Client of its own, as a process
// of its own would have.
type candidate struct {
	client *redlock.Client
	e      *election.Election
}

// newCandidate returns a candidate for election name on rc's nodes. The
// client is closed by t.Cleanup.
func newCandidate(t testing.TB, rc *redistest.Cluster, name, id string, lockOpts []redlock.Option, opts ...election.Option) *candidate {
	t.Helper()
	nodes := rc.Clients()
	// A node timeout of 600ms, the most a 2s TTL allows (its renew
	// interval is 667ms): the derived 200ms was missed by a majority of a
	// Leader() read in the full suite beside stress-ng (load 13-15).
	client, err := redlock.New(nodes, redlock.WithTTL(2*time.Second), redlock.WithNodeTimeout(600*time.Millisecond))
	if err != nil {
		t.Fatalf("redlock.New: %v", err)
	}
	t.Cleanup(func() { client.Close() })
	opts = append([]election.Option{election.WithIdentity(id), election.WithLockOptions(lockOpts...)}, opts...)
	e, err := election.New(client, name, opts...)
	if err != nil {
		t.Fatalf("election.New: %v", err)
	}
	return &candidate{client: client, e: e}
}

// campaign runs Campaign on a goroutine and returns a channel that gets its
// result.
type result struct {
	t   *election.Term
	err error
	at  time.Time
}

func campaign(ctx context.Context, c *candidate) <-chan result {
	ch := make(chan result, 1)
	go func() {
		t, err := c.e.Campaign(ctx)
		ch <- result{t, err, time.Now()}
	}()
	return ch
}

func waitResult(t *testing.T, ch <-chan result, d time.Duration, what string) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(d):
		t.Fatalf("%s: no result within %v", what, d)
	}
	return result{}
}

// eventually polls cond every 10ms until it holds or d has passed.
func eventually(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func leaderIs(t *testing.T, e *election.Election, want string) {
	t.Helper()
	got, err := e.Leader(context.Background())
	if err != nil || got.Identity != want {
		t.Fatalf("Leader() = %+v, %v; want identity %q", got, err, want)
	}
}

func TestNew_invalid(t *testing.T) {
	t.Parallel()
	nodes := []redis.UniversalClient{redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})}
	other := []redis.UniversalClient{redis.NewClient(&redis.Options{Addr: "127.0.0.1:2"})}
	t.Cleanup(func() { nodes[0].Close(); other[0].Close() })
	client, err := redlock.New(nodes)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	cases := []struct {
		name   string
		client *redlock.Client
		elect  string
		opts   []election.Option
	}{
		{"nil client", nil, "x", nil},
		{"client not made by redlock.New", &redlock.Client{}, "x", nil},
		{"empty name", client, "", nil},
		{"reserved suffix", client, "x" + election.LeaderSuffix, nil},
		{"empty identity", client, "x", []election.Option{election.WithIdentity("")}},
		{"empty prefix", client, "x", []election.Option{election.WithKeyPrefix("")}},
		{"zero node timeout", client, "x", []election.Option{election.WithNodeTimeout(0)}},
		{"negative poll", client, "x", []election.Option{election.WithPollInterval(-time.Second)}},
		{"zero retry delay", client, "x", []election.Option{election.WithRetryDelay(0)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e, err := election.New(tc.client, tc.elect, tc.opts...)
			if e != nil || !errors.Is(err, redlock.ErrInvalidArgument) {
				t.Errorf("New() = %v, %v; want nil, ErrInvalidArgument", e, err)
			}
		})
	}
	// The deprecated constructor refuses nodes that are not the Client's.
	withNodes := []struct {
		name  string
		nodes []redis.UniversalClient
	}{
		{"no nodes", nil},
		{"nil node", []redis.UniversalClient{nil}},
		{"typed nil node", []redis.UniversalClient{(*redis.Client)(nil)}},
		{"another node", other},
		{"one node too many", append(nodes[:1:1], other...)},
	}
	for _, tc := range withNodes {
		t.Run("NewWithNodes/"+tc.name, func(t *testing.T) {
			t.Parallel()
			e, err := election.NewWithNodes(client, tc.nodes, "x")
			if e != nil || !errors.Is(err, redlock.ErrInvalidArgument) {
				t.Errorf("NewWithNodes() = %v, %v; want nil, ErrInvalidArgument", e, err)
			}
		})
	}
	for _, c := range []*redlock.Client{nil, {}} {
		if _, err := election.NewWithNodes(c, nodes, "x"); !errors.Is(err, redlock.ErrInvalidArgument) {
			t.Errorf("NewWithNodes(%p) = %v; want ErrInvalidArgument", c, err)
		}
	}
	// Clients of their own, on the Client's nodes, are accepted.
	own := []redis.UniversalClient{redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})}
	t.Cleanup(func() { own[0].Close() })
	if _, err := election.NewWithNodes(client, own, "x"); err != nil {
		t.Errorf("NewWithNodes(clients of the Client's nodes) = %v; want nil", err)
	}
}

func TestTerm_nil(t *testing.T) {
	t.Parallel()
	var term *election.Term
	if err := term.Resign(context.Background()); !errors.Is(err, election.ErrNotLeader) {
		t.Errorf("Resign() = %v; want ErrNotLeader", err)
	}
	select {
	case <-term.Lost():
	default:
		t.Error("Lost() is not closed")
	}
	if term.Context().Err() == nil {
		t.Error("Context() is not cancelled")
	}
	if got := term.Fence(); got != 0 {
		t.Errorf("Fence() = %d; want 0", got)
	}
}

func TestElection_twoCandidates(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	a := newCandidate(t, rc, "two", "a", nil)
	b := newCandidate(t, rc, "two", "b", nil)

	// A read in which a majority did not answer within the node timeout
	// (a new Client's first requests beside stress-ng --cpu 2 at load
	// 10-17, twice at 200ms) proves nothing, and is made again.
	for try := 1; ; try++ {
		_, err := a.e.Leader(t.Context())
		if errors.Is(err, election.ErrNoLeader) {
			break
		}
		if !errors.Is(err, election.ErrNoQuorum) || try == 5 {
			t.Fatalf("Leader() before any campaign: %v (try %d); want ErrNoLeader", err, try)
		}
		t.Logf("try %d: a majority did not answer in time: %v", try, err)
	}
	ta, err := a.e.Campaign(t.Context())
	if err != nil {
		t.Fatalf("a.Campaign: %v", err)
	}
	leaderIs(t, a.e, "a")
	leaderIs(t, b.e, "a")

	// b waits in line while a leads.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	bch := campaign(ctx, b)
	select {
	case r := <-bch:
		t.Fatalf("b.Campaign returned while a leads: %v, %v", r.t, r.err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := ta.Resign(t.Context()); err != nil {
		t.Fatalf("a.Resign: %v", err)
	}
	if cause := context.Cause(ta.Context()); !errors.Is(cause, redlock.ErrUnlocked) {
		t.Errorf("cause of a's term after Resign = %v; want ErrUnlocked", cause)
	}
	r := waitResult(t, bch, 10*time.Second, "b.Campaign after a resigned")
	if r.err != nil {
		t.Fatalf("b.Campaign: %v", r.err)
	}
	leaderIs(t, a.e, "b")
	if err := ta.Resign(t.Context()); err != nil {
		t.Errorf("second Resign = %v; want the first result, nil", err)
	}
	if err := r.t.Resign(t.Context()); err != nil {
		t.Fatalf("b.Resign: %v", err)
	}
	if _, err := a.e.Leader(t.Context()); !errors.Is(err, election.ErrNoLeader) {
		t.Errorf("Leader() after both resigned: %v; want ErrNoLeader", err)
	}
}

// TestElection_resignWakesWaiter checks that Resign hands over through the
// lock's wake-up message, not a poll: the waiting candidate's retry delay
// is 30s, far longer than the bound.
func TestElection_resignWakesWaiter(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	slow := []redlock.Option{redlock.WithRetryDelay(30*time.Second, 30*time.Second)}
	a := newCandidate(t, rc, "wake", "a", slow)
	b := newCandidate(t, rc, "wake", "b", slow)
	ta, err := a.e.Campaign(t.Context())
	if err != nil {
		t.Fatalf("a.Campaign: %v", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	bch := campaign(ctx, b)
	// Let b make its first attempt and subscribe.
	time.Sleep(500 * time.Millisecond)
	start := time.Now()
	if err := ta.Resign(t.Context()); err != nil {
		t.Fatalf("a.Resign: %v", err)
	}
	// A handover takes milliseconds; 5s is far below the 30s retry delay
	// and far above a loaded machine's round trips.
	r := waitResult(t, bch, 5*time.Second, "b.Campaign after a resigned (wake-up)")
	if r.err != nil {
		t.Fatalf("b.Campaign: %v", r.err)
	}
	t.Logf("handover after Resign: %v", r.at.Sub(start))
	leaderIs(t, a.e, "b")
	_ = r.t.Resign(t.Context())
}

func TestElection_threeCandidates(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var (
		inside atomic.Int32
		terms  atomic.Int32
		mu     sync.Mutex
		led    = map[string]int{}
		errs   = make(chan error, 3)
	)
	const wantTerms = 9
	for _, id := range []string{"a", "b", "c"} {
		c := newCandidate(t, rc, "three", id, nil)
		go func() {
			errs <- c.e.Run(ctx, func(ctx context.Context, term *election.Term) error {
				if n := inside.Add(1); n != 1 {
					t.Errorf("%s: %d leaders at once", id, n)
				}
				mu.Lock()
				led[id]++
				mu.Unlock()
				l, err := c.e.Leader(ctx)
				if err != nil || l.Identity != id || l.Term != term.Leader().Term {
					t.Errorf("%s leads, Leader() = %+v, %v", id, l, err)
				}
				time.Sleep(20 * time.Millisecond)
				inside.Add(-1)
				if terms.Add(1) >= wantTerms {
					cancel()
				}
				// Hand over and campaign again.
				return term.Resign(ctx)
			})
		}()
	}
	for range 3 {
		select {
		case err := <-errs:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Run() = %v; want context.Canceled", err)
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("three candidates: %d terms in 60s, want %d", terms.Load(), wantTerms)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("terms per candidate: %v", led)
	if len(led) < 2 {
		t.Errorf("only %v led; want turns between candidates", led)
	}
}

func TestElection_majorityDown(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	a := newCandidate(t, rc, "down", "a", nil)
	b := newCandidate(t, rc, "down", "b", nil)
	ta, err := a.e.Campaign(t.Context())
	if err != nil {
		t.Fatalf("a.Campaign: %v", err)
	}
	validUntil := ta.ValidUntil()
	rc.Kill(1)
	rc.Kill(2)
	// The renewals fail: a's term ends at its validity at the latest (plus
	// scheduling slack).
	select {
	case <-ta.Context().Done():
	case <-time.After(time.Until(validUntil) + 5*time.Second):
		t.Fatalf("a's term not ended %v after its ValidUntil", 5*time.Second)
	}
	if ended := time.Now(); ended.After(validUntil.Add(time.Second)) {
		t.Errorf("a's term ended %v after its ValidUntil", ended.Sub(validUntil))
	}
	if cause := context.Cause(ta.Context()); !errors.Is(cause, redlock.ErrLockLost) {
		t.Errorf("cause = %v; want ErrLockLost", cause)
	}
	if _, err := b.e.Leader(t.Context()); !errors.Is(err, election.ErrNoQuorum) {
		t.Errorf("Leader() with a majority down: %v; want ErrNoQuorum", err)
	}
	var ne *redlock.NodeError
	if _, err := b.e.Leader(t.Context()); !errors.As(err, &ne) {
		t.Errorf("Leader() error %v carries no *redlock.NodeError", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	if tb, err := b.e.Campaign(ctx); err == nil {
		t.Errorf("b.Campaign with a majority down = %+v; want an error", tb.Leader())
	}
	if err := ta.Resign(t.Context()); !errors.Is(err, election.ErrNotLeader) || !errors.Is(err, redlock.ErrLockLost) {
		t.Errorf("Resign after loss = %v; want ErrNotLeader and ErrLockLost", err)
	}
	rc.Restart(1)
	rc.Restart(2)
	ctx2, cancel2 := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel2()
	tb, err := b.e.Campaign(ctx2)
	if err != nil {
		t.Fatalf("b.Campaign after the nodes came back: %v", err)
	}
	leaderIs(t, a.e, "b")
	_ = tb.Resign(t.Context())
}

func TestElection_Observe(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	// No polling: only announcements can make the observer see changes in time.
	a := newCandidate(t, rc, "obs", "a", nil, election.WithPollInterval(time.Hour))
	b := newCandidate(t, rc, "obs", "b", nil)
	ctx, cancel := context.WithCancel(t.Context())
	ch := a.e.Observe(ctx)
	next := func(want string) {
		t.Helper()
		deadline := time.After(5 * time.Second)
		for {
			select {
			case l, ok := <-ch:
				if !ok {
					t.Fatalf("Observe channel closed, want %q", want)
				}
				if l.Identity == want {
					return
				}
			case <-deadline:
				t.Fatalf("Observe: %q not seen within 5s", want)
			}
		}
	}
	next("") // nobody leads yet
	ta, err := a.e.Campaign(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	next("a")
	bch := campaign(t.Context(), b)
	if err := ta.Resign(t.Context()); err != nil {
		t.Fatal(err)
	}
	next("b")
	r := waitResult(t, bch, 5*time.Second, "b.Campaign")
	if r.err != nil {
		t.Fatal(r.err)
	}
	if err := r.t.Resign(t.Context()); err != nil {
		t.Fatal(err)
	}
	next("")
	cancel()
	select {
	case _, ok := <-ch:
		for ok {
			_, ok = <-ch
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Observe channel not closed after ctx was cancelled")
	}
}

type recordHooks struct {
	mu     sync.Mutex
	events []election.LeadershipInfo
}

func (h *recordHooks) Leadership(_ context.Context, i election.LeadershipInfo) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.events = append(h.events, i)
}

func (h *recordHooks) got() []election.Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []election.Event
	for _, e := range h.events {
		out = append(out, e.Event)
	}
	return out
}

func TestElection_hooks(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	h := &recordHooks{}
	a := newCandidate(t, rc, "hooks", "a", []redlock.Option{redlock.WithFencing(true)}, election.WithHooks(h))
	ta, err := a.e.Campaign(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if ta.Fence() <= 0 {
		t.Errorf("Fence() = %d with fencing; want > 0", ta.Fence())
	}
	if err := ta.Resign(t.Context()); err != nil {
		t.Fatal(err)
	}
	// A loss: the majority is cut off.
	tb, err := a.e.Campaign(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if tb.Fence() <= ta.Fence() {
		t.Errorf("second term's fence %d ≤ first's %d", tb.Fence(), ta.Fence())
	}
	rc.Cut(0)
	rc.Cut(1)
	select {
	case <-tb.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("term not lost 10s after a majority was cut off")
	}
	_ = tb.Resign(t.Context()) // waits for the term's goroutine, which reports
	rc.Heal(0)
	rc.Heal(1)
	got := h.got()
	want := []election.Event{election.EventAcquired, election.EventResigned, election.EventAcquired, election.EventLost}
	if len(got) != len(want) {
		t.Fatalf("events = %v; want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("events = %v; want %v", got, want)
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if lost := h.events[3]; !errors.Is(lost.Err, redlock.ErrLockLost) || lost.Held <= 0 || lost.Fence != tb.Fence() {
		t.Errorf("lost event = %+v; want Err ErrLockLost, Held > 0, Fence %d", lost, tb.Fence())
	}
}

func TestElection_Run(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	a := newCandidate(t, rc, "run", "a", nil)
	t.Run("fn error is returned, leadership resigned", func(t *testing.T) {
		boom := errors.New("boom")
		err := a.e.Run(t.Context(), func(ctx context.Context, term *election.Term) error { return boom })
		if !errors.Is(err, boom) {
			t.Errorf("Run() = %v; want boom", err)
		}
		if _, err := a.e.Leader(t.Context()); !errors.Is(err, election.ErrNoLeader) {
			t.Errorf("Leader() after Run returned: %v; want ErrNoLeader", err)
		}
	})
	t.Run("ctx cancelled stops fn and Run", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		err := a.e.Run(ctx, func(ctx context.Context, term *election.Term) error {
			cancel()
			<-ctx.Done()
			return ctx.Err()
		})
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Run() = %v; want context.Canceled", err)
		}
	})
}

// attempts counts the Client's acquisition rounds and its local handoffs.
type attempts struct {
	redlock.NoHooks
	rounds, local atomic.Int64
}

func (h *attempts) Attempt(context.Context, redlock.AttemptInfo) { h.rounds.Add(1) }
func (h *attempts) Acquire(_ context.Context, i redlock.AcquireInfo) {
	if i.Local {
		h.local.Add(1)
	}
}

// Two Elections of one Client on one name: the second candidate queues on
// the nodes, and the first's Resign hands it the term through them, never
// by redlock's local handoff (a term is taken on the nodes).
func TestElection_twoCandidatesOfOneClientTakeTermsOnTheNodes(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	h := &attempts{}
	c, err := redlock.New(rc.Clients(), redlock.WithTTL(5*time.Second), redlock.WithHooks(h))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	a, err := election.New(c, "one-client", election.WithIdentity("a"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := election.New(c, "one-client", election.WithIdentity("b"))
	if err != nil {
		t.Fatal(err)
	}
	ta, err := a.Campaign(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	before := h.rounds.Load()
	won := make(chan error, 1)
	go func() {
		tb, err := b.Campaign(t.Context())
		if err == nil {
			defer func() { _ = tb.Resign(context.Background()) }()
		}
		won <- err
	}()
	// b's first round on the nodes is refused (a holds): it contends there
	// rather than waiting in the Client's own line for a's lease.
	deadline := time.Now().Add(10 * time.Second)
	for h.rounds.Load() == before {
		if time.Now().After(deadline) {
			t.Fatal("b made no round on the nodes within 10s of its Campaign: it waits for a's lease in the Client's line")
		}
		time.Sleep(time.Millisecond)
	}
	if err := ta.Resign(t.Context()); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-won:
		if err != nil {
			t.Fatalf("b's Campaign = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("b not leader 10s after a resigned")
	}
	if n := h.local.Load(); n != 0 {
		t.Errorf("%d acquisitions by local handoff; want 0", n)
	}
}
