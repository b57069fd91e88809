package node

import (
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Close's ForgetIdentity leaves no identity key behind, whatever the
// identity checks of the Client's stragglers are doing: one in progress
// when Close begins is waited for and its key deleted after it wrote it;
// one that starts after sends nothing. Before, a straggler that had not
// yet sent its check when Close looked wrote its key after (kept for
// IdentifyTTL, an hour: TestClient_Close in the full suite beside
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
	if err := n1.C.Set(ctx, key(1), "1", IdentifyTTL).Err(); err != nil {
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
