package redlock

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/internal/redistest"
	"github.com/quorumlock/quorumlock/renew"
)

// Errors say what happened once, and what to do.

func TestErrors_lostNotHeldHasOnePrefix(t *testing.T) {
	t.Parallel()
	ms, nodes := miniNodes(t, 3)
	c := newClient(t, nodes)
	l, err := c.Lock(t.Context(), "gone")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		m.Set("lock:gone", "thief")
	}
	err = l.Extend(t.Context())
	if !errors.Is(err, ErrLockLost) || !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Extend after a takeover = %v; want ErrLockLost and ErrNotHeld", err)
	}
	head, _, _ := strings.Cut(err.Error(), "\n")
	if strings.Count(head, "redlock:") != 1 || !strings.Contains(head, "another owner's key there, or no key") {
		t.Errorf("Extend error = %q; want one prefix and what the nodes hold", head)
	}
}

func TestErrors_fixedLeaseRanOut(t *testing.T) {
	t.Parallel()
	_, nodes := miniNodes(t, 3)
	c := newClient(t, nodes)
	l, err := c.Lock(t.Context(), "fixed", WithTTL(300*time.Millisecond), WithNodeTimeout(50*time.Millisecond), WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	<-l.Lost()
	cause := context.Cause(l.Context())
	if !errors.Is(cause, ErrLockLost) || !errors.Is(cause, renew.ErrExpired) {
		t.Fatalf("cause = %v; want ErrLockLost and renew.ErrExpired", cause)
	}
	if msg := cause.Error(); !strings.Contains(msg, "lease ran out") || strings.Contains(msg, "renewal") && !strings.Contains(msg, "WithAutoRenew(false)") {
		t.Errorf("cause = %q; want it to say the fixed lease ran out", msg)
	}
	l.Unlock(t.Context())
}

func TestErrors_tryLockHeldByThisClient(t *testing.T) {
	t.Parallel()
	_, nodes := miniNodes(t, 3)
	c := newClient(t, nodes)
	l, err := c.Lock(t.Context(), "mine")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock(t.Context())
	_, err = c.TryLock(t.Context(), "mine")
	if !errors.Is(err, ErrNotObtained) || !strings.Contains(err.Error(), "this Client holds a lock on the resource already") {
		t.Errorf("TryLock of a resource this Client holds = %v; want ErrNotObtained saying this Client holds it", err)
	}
	other := newClient(t, nodes)
	if _, err := other.TryLock(t.Context(), "mine"); strings.Contains(err.Error(), "this Client") {
		t.Errorf("TryLock by another Client = %v; want \"another owner\"", err)
	}
}

// A node that runs a request past its not-after bound changes nothing and
// says so; the client reads that as the timeout it stands for, never as a
// key held by another owner (the error an uncontended TryLock once gave on
// a loaded machine, whose timer fired after the late replies were in). A
// step of every node's clock ahead of the Client's estimate makes every
// request late, as promptly as it is answered.
func TestErrors_lateRepliesAreNoRefusal(t *testing.T) {
	t.Parallel()
	ms, nodes := miniNodes(t, 3)
	c := newClient(t, nodes, WithAutoRenew(false), WithTTL(time.Minute))
	ctx := t.Context()
	l, err := c.TryLock(ctx, "held") // learns the nodes' clocks
	if err != nil {
		t.Fatal(err)
	}
	step := time.Now().Add(10 * time.Minute)
	for _, m := range ms {
		m.SetTime(step)
	}
	_, err = c.TryLock(ctx, "free")
	if !errors.Is(err, ErrNoQuorum) || errors.Is(err, ErrNotObtained) || strings.Contains(err.Error(), "another owner") ||
		!strings.Contains(err.Error(), "after its deadline") || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("TryLock with every reply late = %v; want ErrNoQuorum saying the requests came after their deadline, matching context.DeadlineExceeded", err)
	}
	err = l.Extend(ctx)
	if errors.Is(err, ErrLockLost) || strings.Contains(err.Error(), "another owner") || !strings.Contains(err.Error(), "after its deadline") {
		t.Errorf("Extend with every reply late = %v; want a failed extension saying the requests came after their deadline, the lock not lost", err)
	}
	if !l.Valid() {
		t.Errorf("Valid() = false after late extensions, %v before ValidUntil; want true: nothing changed on the nodes", time.Until(l.ValidUntil()).Round(time.Second))
	}
}

func TestReal_errorsOneTimeoutWording(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	c := newClient(t, rc.Clients(), WithNodeTimeout(200*time.Millisecond), WithTTL(3*time.Second))
	rc.Pause(2)
	t.Cleanup(func() { rc.Resume(2) })
	rc.Pause(1)
	t.Cleanup(func() { rc.Resume(1) })
	_, err := c.TryLock(t.Context(), "slow")
	var ne *NodeError
	if !errors.As(err, &ne) || !errors.Is(ne, context.DeadlineExceeded) || !strings.Contains(ne.Error(), "no reply within 200ms") {
		t.Errorf("TryLock with 2 of 3 nodes paused = %v; want node errors saying \"no reply within 200ms\"", err)
	}
	if strings.Contains(err.Error(), "i/o timeout") || strings.Contains(err.Error(), "context deadline exceeded") {
		t.Errorf("TryLock = %v; want one wording for a node timeout", err)
	}
}

func TestErrors_dialBareAddressSuggestsAURL(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{"127.0.0.1:7601", "localhost:7601"} {
		_, err := Dial(t.Context(), []string{raw})
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "did you mean redis://"+raw) {
			t.Errorf("Dial(%q) = %v; want ErrInvalidArgument suggesting redis://%s", raw, err, raw)
		}
	}
}
