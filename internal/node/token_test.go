package node

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/scripts"
	"github.com/quorumlock/quorumlock/quorum"
)

// TestToken_deadlineFixedAtRegistration is issue 30 item 1 at the layer
// that owns it: a round registered, then held before it is sent, keeps
// the deadline its registration fixed, and counts as unanswered on every
// node until its requests answer.
func TestToken_deadlineFixedAtRegistration(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := &Token{n: 3, own: testOwner{}, ownMu: new(sync.Mutex)}
		p, _ := g.register(false, nil)
		for i := range 3 {
			if !g.unanswered(i) {
				t.Errorf("Unanswered(%d) = false for a registered round not sent yet; want true", i)
			}
		}
		time.Sleep(400 * time.Millisecond) // the sender is descheduled
		var deadlines [3]time.Time
		r := sendTest(context.Background(), p, 3, 500*time.Millisecond, func(ctx context.Context, i int) (int, error) {
			deadlines[i], _ = ctx.Deadline()
			if i == 2 {
				<-ctx.Done() // a node that never answers
				return 0, ctx.Err()
			}
			return 1, nil
		})
		r.Wait()
		for i, d := range deadlines {
			if want := p.Start.Add(500 * time.Millisecond); !d.Equal(want) {
				t.Errorf("node %d deadline = %v after registration; want %v (fixed at registration)", i, d.Sub(p.Start), want.Sub(p.Start))
			}
		}
		for i, want := range []bool{false, false, true} {
			if got := g.unanswered(i); got != want {
				t.Errorf("Unanswered(%d) = %v after the round; want %v", i, got, want)
			}
		}
		// The node that did not answer is remembered for good, through
		// later rounds every node answered.
		q, _ := g.register(false, nil)
		settle(q, 3)
		if !g.unanswered(2) {
			t.Error("Unanswered(2) = false after a later round every node answered; want true for good")
		}
	})
}

// TestToken_callerCancelDoesNotCutRequests: a round's requests end at
// their deadline, not when the caller cancels (issue 30 item 8).
func TestToken_callerCancelDoesNotCutRequests(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := &Token{n: 1, own: testOwner{}, ownMu: new(sync.Mutex)}
		ctx, cancel := context.WithCancel(context.Background())
		var got error
		p, _ := g.register(false, nil)
		r := sendTest(ctx, p, 1, time.Second, func(ctx context.Context, _ int) (int, error) {
			select {
			case <-ctx.Done():
				got = ctx.Err()
			case <-time.After(300 * time.Millisecond): // the slow node answers
			}
			return 1, nil
		})
		cancel()
		r.Wait()
		if got != nil || errors.Is(got, context.Canceled) {
			t.Errorf("request ctx ended with %v when the caller cancelled; want it to run until its deadline", got)
		}
	})
}

// testOwner owns a Token in tests of the registry: always held.
type testOwner struct{}

func (testOwner) Open() bool                                               { return true }
func (testOwner) Usable() error                                            { return nil }
func (testOwner) Fail(_ context.Context, _ int, _ string, err error) error { return err }

// sendTest sends the registered round p to n nodes as Run does, with fn
// for each node's request.
func sendTest[T any](ctx context.Context, p *pendingRound, n int, timeout time.Duration, fn func(ctx context.Context, i int) (T, error)) *quorum.Round[T] {
	return quorum.StartAt(ctx, p.Start, n, timeout, nil, func(ctx context.Context, i int) (T, error) {
		v, err := fn(ctx, i)
		p.ended(i, err)
		return v, err
	})
}

// settle ends the requests of the registered round p on n nodes: each
// answered, but for the nodes in unanswered, whose requests timed out and
// may still land.
func settle(p *pendingRound, n int, unanswered ...int) {
	for i := range n {
		var err error
		if slices.Contains(unanswered, i) {
			err = context.DeadlineExceeded
		}
		p.ended(i, err)
	}
}

// TestToken_unansweredNodeOutlivesItsRound: once a round has settled with
// a node unanswered, the token still counts that node unanswered after a
// later round every node answered, and only that one (a Token must know
// its nodes: before it did, a Lock's registry counted none and forgot
// such a node). Moved from package redlock's rounds_test.go.
func TestToken_unansweredNodeOutlivesItsRound(t *testing.T) {
	t.Parallel()
	var clients []redis.UniversalClient
	for range 3 {
		c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
		t.Cleanup(func() { c.Close() })
		clients = append(clients, c)
	}
	s := NewSet(clients, Config{})
	g := s.Token(make([]scripts.Keys, 3), time.Second, time.Second, new(sync.Mutex), nil, testOwner{})
	p, _ := g.register(false, nil)
	settle(p, 3, 1)
	q, _ := g.register(false, nil)
	settle(q, 3)
	for i, want := range []bool{false, true, false} {
		if got := g.unanswered(i); got != want {
			t.Errorf("unanswered(%d) = %v after a later round; want %v", i, got, want)
		}
	}
}

// TestToken_waitSentWaitsForOpenRequests: Detach's wait (WaitOut) lasts
// until every request of the rounds registered has ended, and no longer
// than the latest round's deadline when one never ends.
func TestToken_waitSentWaitsForOpenRequests(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := &Token{n: 2, own: testOwner{}, ownMu: new(sync.Mutex)}
		p, _ := g.register(false, nil)
		go func() {
			time.Sleep(100 * time.Millisecond)
			p.ended(0, nil)
			time.Sleep(200 * time.Millisecond)
			p.ended(1, nil)
		}()
		start := time.Now()
		g.waitSent(time.Second)
		if got, want := time.Since(start), 300*time.Millisecond; got != want {
			t.Errorf("waitSent took %v; want %v, until the last request ended", got, want)
		}

		q, _ := g.register(false, nil)
		q.ended(0, nil) // node 1's request never ends
		g.waitSent(time.Second)
		if got, want := time.Since(q.Start), time.Second; got != want {
			t.Errorf("waitSent took %v after the round's start; want %v, its deadline", got, want)
		}
		g.waitSent(time.Second) // nothing registered since: at most until that deadline, passed
		if got, want := time.Since(q.Start), time.Second; got != want {
			t.Errorf("a second waitSent took %v more; want none", got-want)
		}
	})
}
