package node

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// TestLedger_deadlineFixedAtRegistration is issue 30 item 1 at the layer
// that owns it: a round registered, then held before it is sent, keeps
// the deadline its registration fixed, and counts as unanswered on every
// node until its requests answer.
func TestLedger_deadlineFixedAtRegistration(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewLedger(3)
		p := g.Register()
		for i := range 3 {
			if !g.Unanswered(i) {
				t.Errorf("Unanswered(%d) = false for a registered round not sent yet; want true", i)
			}
		}
		time.Sleep(400 * time.Millisecond) // the sender is descheduled
		var deadlines [3]time.Time
		r := Send(context.Background(), p, 3, 500*time.Millisecond, nil, func(ctx context.Context, i int) (int, error) {
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
			if got := g.Unanswered(i); got != want {
				t.Errorf("Unanswered(%d) = %v after the round; want %v", i, got, want)
			}
		}
		// Settled rounds leave the list; the node that did not answer is
		// remembered for good.
		g.Track(RoundOf(r))
		if !g.Unanswered(2) {
			t.Error("Unanswered(2) = false once the round was dropped; want true for good")
		}
	})
}

// TestLedger_callerCancelDoesNotCutRequests: a round's requests end at
// their deadline, not when the caller cancels (issue 30 item 8).
func TestLedger_callerCancelDoesNotCutRequests(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewLedger(1)
		ctx, cancel := context.WithCancel(context.Background())
		var got error
		r := Send(ctx, g.Register(), 1, time.Second, nil, func(ctx context.Context, _ int) (int, error) {
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
