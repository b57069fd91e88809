package node

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/redistest"
)

// Close's ForgetIdentity leaves no identity key behind, whatever the
// identity checks of the Client's stragglers are doing: one in progress
// when Close begins is waited for and its key deleted after it wrote it;
// one that starts after sends nothing. Before, a straggler that had not
// yet sent its check when Close looked wrote its key after (kept for
// identifyTTL, an hour: TestClient_Close in the full suite beside
// stress-ng). The mutants forget-without-turn and identify-after-close
// fail it.
func TestIdentity_closeLeavesNoKey(t *testing.T) {
	s, closing := identitySet(t)
	ctx := t.Context()
	key := func(i int) string { return s.idKeys()[i] }
	exists := func(i int) bool {
		n, err := s.Nodes[i].C.Exists(ctx, key(i)).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	if err := s.identify(ctx, 0); err != nil || !exists(0) {
		t.Fatalf("identify(0) = %v, key there %v; want nil, true", err, exists(0))
	}

	// Node 1: an identify in progress holds the turn and has not sent its
	// script yet when Close begins; it sends it (writes its key) while
	// ForgetIdentity waits, then lets go. (The pause only gives a
	// ForgetIdentity that does not wait the time to look too early: the
	// mutant forget-without-turn; the code passes whatever the timing.)
	n1 := &s.Nodes[1]
	n1.id.idTurn <- struct{}{}
	close(closing)
	var wg sync.WaitGroup
	s.ForgetIdentity(5*time.Second, wg.Go)
	time.Sleep(20 * time.Millisecond)
	n1.id.idSent.Store(true)
	if err := n1.C.Set(ctx, key(1), "1", identifyTTL).Err(); err != nil {
		t.Fatal(err)
	}
	<-n1.id.idTurn
	wg.Wait()
	for i := range 2 {
		if exists(i) {
			t.Errorf("node %d keeps its identity key after ForgetIdentity", i)
		}
	}

	// Node 2: a check that starts after Close began writes nothing.
	if err := s.identify(ctx, 2); err == nil || exists(2) {
		t.Errorf("identify(2) after Close began = %v, key there %v; want an error and no key", err, exists(2))
	}
}

// An identity check whose caller stopped waiting (its script delayed on
// the way by proxy latency, against a 300ms deadline) leaves no key once
// Close's ForgetIdentity has run, wherever it lands:
//   - past its not-after bound (1s of latency): it writes nothing, as the
//     lock scripts do. Before, it wrote the key after the DEL, kept for
//     identifyTTL (an hour). The mutant identify-unbounded fails it.
//   - after its caller's deadline but before its bound (600ms of latency,
//     the clock estimate's error widened to 500ms, so the bound is about
//     800ms): it writes the key, and the DEL must come after it.
//     ForgetIdentity waits for the bound to pass first; the mutant
//     forget-before-bound (no wait) fails it.
func TestIdentity_lateCheckLeavesNoKey(t *testing.T) {
	for _, tc := range []struct {
		name     string
		latency  time.Duration // node 1's, each way
		estimate time.Duration // the clock estimate's error beyond half the round trip
	}{
		{"lands past its bound", time.Second, time.Millisecond},
		{"lands before its bound", 600 * time.Millisecond, 500 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := redistest.Start(t, 3)
			closing := make(chan struct{})
			var wg sync.WaitGroup
			s := NewSet(rc.Clients(), Config{Timeout: 2 * time.Second, Drift: 0.01, KeyPrefix: "lock:", ID: "late",
				Closing: closing, Go: func(f func()) error { wg.Go(f); return nil },
				Invalid: func(format string, args ...any) error { return fmt.Errorf(format, args...) }})
			defer wg.Wait()
			ctx := t.Context()
			key := s.idKeys()[1]
			// Node 1's clock known and a connection pooled before the
			// latency, without the background probes notAfter starts (they
			// would take the pooled connection, and the check would wait for
			// a dial instead).
			if err := s.Nodes[1].C.Ping(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			send := time.Now()
			now, err := rc.Admin(1).Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			half := time.Since(send) / 2
			s.Nodes[1].clock.est.Store(&clockEstimate{at: send.Add(half), nodeUS: now.UnixMicro(), err: half + tc.estimate})
			rc.SetLatency(1, tc.latency)
			short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			err = s.identify(short, 1)
			cancel()
			if err == nil {
				t.Fatalf("identify through %v of latency with 300ms = nil; want a timeout", tc.latency)
			}
			// A PING read by the proxy now lands after the script (each
			// chunk keeps the delay it was read with): its reply says the
			// script ran.
			landed := make(chan error, 1)
			go func() { landed <- rc.Client(1).Ping(ctx).Err() }()
			// Read by the proxy before the latency goes, on a machine not
			// too busy: if not, the PING comes back early and the check
			// below may miss a late key (a pass, never a false failure).
			time.Sleep(50 * time.Millisecond)
			rc.SetLatency(1, 0)
			close(closing)
			s.ForgetIdentity(5*time.Second, wg.Go)
			wg.Wait()
			if err := <-landed; err != nil {
				t.Fatal(err)
			}
			if n, err := rc.Admin(1).Exists(ctx, key).Result(); err != nil || n != 0 {
				t.Errorf("node 1 keeps the identity key after the late check landed (exists %d, %v); want none", n, err)
			}
		})
	}
}

// identitySet is testSet with its Closing channel in the test's hands.
func identitySet(t *testing.T) (*Set, chan struct{}) {
	t.Helper()
	base := testSet(t, 3, time.Second, 0.01)
	clients := make([]redis.UniversalClient, len(base.Nodes))
	for i, n := range base.Nodes {
		clients[i] = n.C
	}
	closing := make(chan struct{})
	cfg := base.cfg
	cfg.Closing = closing
	return NewSet(clients, cfg), closing
}
