package chaos

import (
	"context"
	"testing"

	"github.com/quorumlock/quorumlock/internal/redistest"
	"github.com/quorumlock/quorumlock/redlock"
)

// TestOutcome_alreadyHeld: a Lock under the ctx of a lock its caller holds
// returns ErrAlreadyHeld, which also matches ErrNotObtained; the report
// counts it apart (it was "not_obtained", a contention no fault explains
// here), and the outcome is unexpected, so that a worker logs it and Run
// reports it as a harness error.
func TestOutcome_alreadyHeld(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	c, err := redlock.New(rc.Clients())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.Lock(t.Context(), "nested")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock(context.Background())
	_, err = c.Lock(l.Context(), "nested")
	if got := outcome(err); got != outcomeAlreadyHeld || !unexpected(got) {
		t.Errorf("outcome(%v) = %q (unexpected %v); want %q, unexpected", err, got, unexpected(got), outcomeAlreadyHeld)
	}
	for _, o := range []string{"not_obtained", "no_quorum", "closed", "canceled"} {
		if unexpected(o) {
			t.Errorf("unexpected(%q) = true; want false (a fault explains it)", o)
		}
	}
}
