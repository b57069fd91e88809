package node

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// TestToken_deadlineFixedAtRegistration is issue 30 item 1 at the layer
// that owns it: a round registered, then held before it is sent, keeps
// the deadline its registration fixed, and counts as unanswered on every
// node until its requests answer.
func TestToken_deadlineFixedAtRegistration(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := &Token{n: 3}
		p, _ := g.Register(new(sync.Mutex), nil)
		for i := range 3 {
			if !g.unanswered(i) {
				t.Errorf("Unanswered(%d) = false for a registered round not sent yet; want true", i)
			}
		}
		time.Sleep(400 * time.Millisecond) // the sender is descheduled
		var deadlines [3]time.Time
		r := Send(context.Background(), g, p, 500*time.Millisecond, nil, func(ctx context.Context, i int) (int, error) {
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
		// Settled rounds leave the list; the node that did not answer is
		// remembered for good.
		g.Track(RoundOf(r))
		if !g.unanswered(2) {
			t.Error("Unanswered(2) = false once the round was dropped; want true for good")
		}
	})
}

// TestToken_callerCancelDoesNotCutRequests: a round's requests end at
// their deadline, not when the caller cancels (issue 30 item 8).
func TestToken_callerCancelDoesNotCutRequests(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := &Token{n: 1}
		ctx, cancel := context.WithCancel(context.Background())
		var got error
		p, _ := g.Register(new(sync.Mutex), nil)
		r := Send(ctx, g, p, time.Second, nil, func(ctx context.Context, _ int) (int, error) {
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
