package node

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/scripts"
	"github.com/quorumlock/quorumlock/quorum"
)

// TestRelease_guardOnlyWhereUnanswered: a release leaves its guard only
// on a node where a request of the token went unanswered, and a cleanup
// (vote set) skips a node that refused only where none did; each release
// is registered for the Client's next acquire to follow while it runs.
func TestRelease_guardOnlyWhereUnanswered(t *testing.T) {
	t.Parallel()
	var clients []redis.UniversalClient
	for range 3 {
		m := miniredis.RunT(t)
		c := redis.NewClient(&redis.Options{Addr: m.Addr()})
		t.Cleanup(func() { c.Close() })
		clients = append(clients, c)
	}
	s := NewSet(clients, Config{Timeout: time.Second})
	keys := make([]scripts.Keys, 3)
	for i := range keys {
		keys[i] = scripts.Keys{Lock: "lock:x"}
	}
	g := s.Token(keys, time.Second, time.Second, new(sync.Mutex), nil, testOwner{})
	p, _ := g.register(false, nil)
	settle(p, 3, 1) // node 1's request may still land

	type sent struct {
		guard     time.Duration
		following bool // an acquire registered now would follow this release
	}
	release := func(vote func(int, bool) quorum.Vote) map[int]sent {
		var mu sync.Mutex
		got := make(map[int]sent)
		r := Release(context.Background(), g, vote, func(_ context.Context, i int, _ redis.Scripter, guard time.Duration) (bool, error) {
			before := s.releasesBefore(keys)
			mu.Lock()
			got[i] = sent{guard, before != nil && len(before[i]) > 0}
			mu.Unlock()
			return true, nil
		}, nil)
		if r != nil {
			r.Wait()
		}
		return got
	}

	got := release(nil)
	for i := range 3 {
		e, ok := got[i]
		switch {
		case !ok:
			t.Errorf("Release: node %d not sent; want every node", i)
		case (e.guard > 0) != (i == 1):
			t.Errorf("Release: node %d guard %v; want one only on node 1, whose request may still land", i, e.guard)
		case !e.following:
			t.Errorf("Release: node %d's release not registered while it ran", i)
		}
	}
	if s.releasesBefore(keys) != nil {
		t.Error("a release is still registered after the round ended")
	}

	got = release(func(int, bool) quorum.Vote { return quorum.No })
	if _, ok := got[1]; !ok || len(got) != 1 {
		t.Errorf("cleanup with every node refused: sent to %v; want node 1 only (its request may still land)", got)
	}
	h := s.Token(keys, time.Second, time.Second, new(sync.Mutex), nil, testOwner{}) // a token whose requests all answered
	p2, _ := h.register(false, nil)
	settle(p2, 3)
	if r := Release(context.Background(), h, func(int, bool) quorum.Vote { return quorum.No }, nil, nil); r != nil || s.releasesBefore(keys) != nil {
		t.Errorf("cleanup refused everywhere, every request answered: round %v; want none sent, nothing registered", r)
	}
}
