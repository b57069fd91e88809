package redlock

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/internal/redistest"
	"github.com/quorumlock/quorumlock/internal/testhooks"
)

// Issue 44 item 5, on real nodes: Resume never re-creates a key that
// expired between its read round and its re-arm round. The key is deleted
// right after the read answered (testhooks.ResumeRead): on every node, the
// lock is gone and Resume must fail with ErrNotHeld, writing nothing (it
// once re-created the key on the nodes: Resume = <nil>, PTTLs [29.999s
// 29.999s 0s]); on one node only, a majority still holds the token in the
// re-arm round, Resume succeeds, and that node gets the key again only
// from the lock's first renewal, after the majority confirmed.
// Not parallel: the seam is process-wide (it filters by resource anyway).
func TestReal_resumeNeverRevivesAKeyGoneAfterItsRead(t *testing.T) {
	rc := redistest.Start(t, 3)
	holder := newClient(t, rc.Clients(), WithTTL(30*time.Second))
	resumer := newClient(t, rc.Clients(), WithTTL(30*time.Second))
	gone := map[string][]int{"resume-all-gone": {0, 1, 2}, "resume-one-gone": {2}}
	f := func(resource string) {
		for _, i := range gone[resource] {
			if err := rc.Admin(i).Del(context.Background(), "lock:"+resource).Err(); err != nil {
				t.Errorf("DEL on node %d: %v", i, err)
			}
		}
	}
	testhooks.ResumeRead.Store(&f)
	t.Cleanup(func() { testhooks.ResumeRead.Store(nil) })
	detached := func(resource string) *Lock {
		t.Helper()
		l := lockedEverywhere(t, rc, holder, resource)
		if err := l.Detach(); err != nil {
			t.Fatal(err)
		}
		return l
	}

	l := detached("resume-all-gone")
	r, err := resumer.Resume(t.Context(), l.Resource(), l.Token())
	if err == nil {
		var pttl []time.Duration
		for i := range rc.N() {
			pttl = append(pttl, rc.Admin(i).PTTL(context.Background(), "lock:resume-all-gone").Val())
		}
		r.Unlock(context.Background())
		t.Fatalf("Resume of a lock gone after its read = <nil>, Valid=%v; PTTLs %v; want ErrNotHeld, no key", r.Valid(), pttl)
	}
	if !errors.Is(err, ErrNotHeld) {
		t.Errorf("Resume of a lock gone after its read = %v; want ErrNotHeld", err)
	}
	// Nothing was written: no node holds the key now, nor a moment later
	// (Resume's cleanup only deletes the token).
	deadline := time.Now().Add(200 * time.Millisecond)
	for time.Now().Before(deadline) {
		if n := holders(t, rc, "lock:resume-all-gone", l.Token()); n > 0 {
			t.Fatalf("%d nodes hold the token after the refused Resume; want none", n)
		}
		time.Sleep(10 * time.Millisecond)
	}

	l = detached("resume-one-gone")
	r, err = resumer.Resume(t.Context(), l.Resource(), l.Token())
	if err != nil {
		t.Fatalf("Resume with the key gone from one node of three = %v; want the lock (a majority holds it)", err)
	}
	defer r.Unlock(context.Background())
	// Healed by the first renewal, scheduled at once since a node did not
	// confirm: well before the renew interval (10s).
	if !eventually(5*time.Second, func() bool { return keyOn(t, rc, 2, "lock:resume-one-gone") == l.Token() }) {
		t.Errorf("node 2 does not hold the resumed token 5s after Resume; want it healed by the first renewal")
	}
}

// A re-arm round that fails for want of answers (ErrNoQuorum) leaves the
// keys alone, so that the Resume may be retried: it once released the
// token everywhere (abandon), so that 0 of 3 nodes held it and the retry
// got ErrNotHeld (issue 44 review D4). Nodes 1 and 2 are paused right
// after the read round, so the re-arm round gets one answer of three.
// Not parallel: the seam is process-wide.
func TestReal_resumeNoQuorumInReArmLeavesTheKeys(t *testing.T) {
	rc := redistest.Start(t, 3)
	holder := bystander(t, rc.Clients())
	// The short node timeout is the failing Resume's alone (a per-call
	// option): the retry and its Unlock, the same Client's, have a
	// bystander's, so that a loaded machine's stall does not fail them.
	resumer := bystander(t, rc.Clients())
	const resource = "resume-rearm-no-quorum"
	var paused atomic.Bool
	f := func(r string) {
		if r == resource && paused.CompareAndSwap(false, true) {
			rc.Pause(1)
			rc.Pause(2)
		}
	}
	testhooks.ResumeRead.Store(&f)
	t.Cleanup(func() { testhooks.ResumeRead.Store(nil) })
	t.Cleanup(func() { rc.Resume(1); rc.Resume(2) })
	l := lockedEverywhere(t, rc, holder, resource)
	if err := l.Detach(); err != nil {
		t.Fatal(err)
	}
	_, err := resumer.Resume(t.Context(), resource, l.Token(), WithNodeTimeout(300*time.Millisecond))
	if !errors.Is(err, ErrNoQuorum) || errors.Is(err, ErrNotHeld) {
		t.Fatalf("Resume with 2 of 3 nodes paused after its read = %v; want ErrNoQuorum", err)
	}
	rc.Resume(1)
	rc.Resume(2)
	// Nothing releases the token: every node keeps it, for ten node
	// timeouts after the call.
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if n := holders(t, rc, "lock:"+resource, l.Token()); n != 3 {
			t.Fatalf("%d of 3 nodes hold the token after a Resume that failed for want of answers; want 3 (keys left alone)", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	r, err := resumer.Resume(t.Context(), resource, l.Token())
	if err != nil {
		t.Fatalf("retried Resume = %v; want the lock", err)
	}
	if err := r.Unlock(context.Background()); err != nil {
		t.Errorf("Unlock of the resumed lock: %v", err)
	}
}
