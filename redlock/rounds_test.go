package redlock

import (
	"testing"
	"time"
)

// settledUnanswered is a round that has ended without node 1's answer: its
// request there timed out and may still land.
type settledUnanswered struct{}

func (settledUnanswered) Answered(i int) bool { return i != 1 }
func (settledUnanswered) Settled() bool       { return true }

// allAnswered is a round every node answered.
type allAnswered struct{}

func (allAnswered) Answered(int) bool { return true }
func (allAnswered) Settled() bool     { return true }

// TestRounds_unansweredNodeOutlivesItsRound: once a round has settled with
// a node unanswered and a later round drops it from the registry, the
// lock's release still leaves the guard on that node, and only there (a
// Lock's registry must know its nodes: before the registry knew its nodes, a Lock's registry
// counted none and forgot such a node).
func TestRounds_unansweredNodeOutlivesItsRound(t *testing.T) {
	t.Parallel()
	_, nodes := miniNodes(t, 3)
	c := newClient(t, nodes, WithTTL(2*time.Second), WithNodeTimeout(600*time.Millisecond))
	l, err := c.newLock("rounds", c.cfg)
	if err != nil {
		t.Fatal(err)
	}
	p, err := l.register(false)
	if err != nil {
		t.Fatal(err)
	}
	p.Attach(settledUnanswered{})
	q, err := l.register(false) // drops the settled round from the list
	if err != nil {
		t.Fatal(err)
	}
	q.Attach(allAnswered{})
	for i, want := range []bool{false, true, false} {
		if got := l.tok.Guard(i) > 0; got != want {
			t.Errorf("Guard(%d) > 0 = %v after the round was dropped; want %v", i, got, want)
		}
	}
}
