package redlock

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/internal/redistest"
)

// uptime returns node i's uptime as it reports it, in whole seconds.
func uptime(t *testing.T, rc *redistest.Cluster, i int) time.Duration {
	t.Helper()
	info, err := rc.Admin(i).Info(context.Background(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "uptime_in_seconds:"); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatal(err)
			}
			return time.Duration(n) * time.Second
		}
	}
	t.Fatalf("node %d: no uptime_in_seconds in INFO server", i)
	return 0
}

func TestRestartGuard_options(t *testing.T) {
	t.Parallel()
	_, nodes := miniNodes(t, 1)
	cases := []struct {
		name string
		opts []Option
		ok   bool
	}{
		{"off", []Option{WithRestartGuard(0)}, true},
		{"at the TTL", []Option{WithTTL(10 * time.Second), WithRestartGuard(10 * time.Second)}, true},
		{"negative", []Option{WithRestartGuard(-time.Second)}, false},
		{"below the TTL", []Option{WithTTL(10 * time.Second), WithRestartGuard(5 * time.Second)}, false},
	}
	for _, tc := range cases {
		c, err := New(nodes, tc.opts...)
		if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ErrInvalidArgument)) {
			t.Errorf("%s: New = %v; want ok %v, else ErrInvalidArgument", tc.name, err, tc.ok)
		}
		if c != nil {
			c.Close()
		}
	}
	// Per call, the guard is checked against that call's TTL.
	c := newClient(t, nodes, WithRestartGuard(DefaultTTL))
	if _, err := c.TryLock(t.Context(), "r", WithTTL(time.Minute)); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("TryLock with a TTL above the guard = %v; want ErrInvalidArgument", err)
	}
}

func TestRestartGuard_needsINFO(t *testing.T) {
	t.Parallel()
	_, nodes := miniNodes(t, 3) // miniredis has no INFO
	c := newClient(t, nodes, WithRestartGuard(DefaultTTL))
	_, err := c.TryLock(t.Context(), "r")
	var ne *NodeError
	if !errors.Is(err, ErrNoQuorum) || !errors.As(err, &ne) || errors.Is(err, ErrNodeRestarted) {
		t.Errorf("TryLock with the guard on miniredis = %v; want ErrNoQuorum with node errors (no INFO)", err)
	}
}

// TestRestartGuard_restartedNodeCannotCompleteAMajority is the Redlock
// restart hazard. A holds "r" on exactly 3 of 5 nodes (2 were cut off while
// it acquired); node 2 restarts empty. With the guard, B cannot use node 2
// to make a majority while node 2 has been up for less than the longest
// TTL; without it, C can, and two clients hold "r" at once. A renewal still
// heals node 2: after it, even a client without the guard is refused.
func TestRestartGuard_restartedNodeCannotCompleteAMajority(t *testing.T) {
	t.Parallel()
	// TTL 8s and a node timeout of 2.5s for every Client: the steps from
	// node 2's restart to C's grant must fit in A's lease, and each new
	// Client's first requests (dial, HELLO, INFO, scripts) missed the
	// TTL/10 of a 4s TTL, 400ms, on all 5 nodes beside stress-ng --cpu 2
	// at load 10-16. The slowest reply of this test measured at load 17-20
	// was 204ms: 2.5s is 12× that, and stays under the renew interval
	// (2.7s).
	const ttl = 8 * time.Second
	nodeTimeout := WithNodeTimeout(2500 * time.Millisecond)
	rc := redistest.Start(t, 5)
	ctx := t.Context()
	// The guard needs the other nodes to report more uptime than the guard.
	if !eventually(ttl+3*time.Second, func() bool {
		for i := range rc.N() {
			if uptime(t, rc, i) <= ttl {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("nodes not up for more than %v after %v", ttl, ttl+3*time.Second)
	}

	// A: fixed leases, so that nothing heals node 2 behind the test's back.
	// r2 is held twice as long: it is used last, to show the heal.
	a := newClient(t, rc.Clients(), WithTTL(ttl), WithAutoRenew(false), nodeTimeout)
	rc.Cut(3)
	rc.Cut(4)
	// Lock, not TryLock: all three live nodes must grant, and at load 10
	// under -race one of them missed a 400ms node timeout once.
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	r, err := a.Lock(lctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	r2, err := a.Lock(lctx, "r2", WithTTL(2*ttl))
	if err != nil {
		t.Fatal(err)
	}
	rc.Heal(3)
	rc.Heal(4)
	if n := holders(t, rc, "lock:r", r.Token()); n != 3 {
		t.Fatalf("A holds r on %d nodes; want exactly 3", n)
	}
	rc.Restart(2)

	b := newClient(t, rc.Clients(), WithTTL(ttl), WithRestartGuard(ttl), nodeTimeout)
	_, err = b.TryLock(ctx, "r")
	var ne *NodeError
	if !errors.Is(err, ErrNoQuorum) || !errors.Is(err, ErrNodeRestarted) || !errors.As(err, &ne) || ne.Node != 2 {
		t.Fatalf("guarded TryLock through the restarted node = %v; want ErrNoQuorum with node 2's ErrNodeRestarted", err)
	}
	t.Logf("guarded client refused: %v", ne)
	if v := keyOn(t, rc, 2, "lock:r"); v != "" {
		t.Errorf("the guarded attempt wrote %q on the restarted node; want nothing", v)
	}

	// The guarded attempt's grants on nodes 3 and 4 are released in the
	// background (the Client owns a failed attempt's cleanup, step 4).
	if !eventually(5*time.Second, func() bool { return keyOn(t, rc, 3, "lock:r") == "" && keyOn(t, rc, 4, "lock:r") == "" }) {
		t.Fatalf("the guarded attempt's grants on nodes 3 and 4 were not released")
	}
	// The hazard: without the guard, the restarted node completes a
	// majority for C while A's lease on r is still valid.
	c := newClient(t, rc.Clients(), WithTTL(ttl), nodeTimeout) // no guard
	lc, err := c.TryLock(ctx, "r")
	if err != nil {
		t.Fatalf("unguarded TryLock through the restarted node = %v; want it granted (the known hazard)", err)
	}
	defer lc.Unlock(context.Background())
	if !r.Valid() {
		t.Fatalf("A's lease ran out before the check; the test is too slow to show the hazard")
	}
	t.Logf("without the guard, two clients hold r: A (valid %v more) and C", time.Until(r.ValidUntil()).Round(time.Millisecond))

	// A majority of nodes that are not young is still enough.
	if l, err := b.TryLock(ctx, "free"); err != nil {
		t.Errorf("guarded TryLock of a free resource = %v; want it granted by the 4 other nodes", err)
	} else {
		l.Unlock(ctx)
	}

	// Renewal heals: A's Extend sets its key again on node 2 (and on 3 and
	// 4, where it was never set).
	if err := r2.Extend(ctx); err != nil {
		t.Fatalf("Extend of r2 after the restart = %v", err)
	}
	// Extend returns once a majority confirmed; the rest follow, each
	// within the node timeout.
	if !eventually(2*2500*time.Millisecond, func() bool { return holders(t, rc, "lock:r2", r2.Token()) == 5 }) {
		t.Errorf("A holds r2 on %d nodes after Extend; want 5 (healed)", holders(t, rc, "lock:r2", r2.Token()))
	}
	if _, err := c.TryLock(ctx, "r2"); !errors.Is(err, ErrNotObtained) {
		t.Errorf("unguarded TryLock of the healed r2 = %v; want ErrNotObtained", err)
	}
}

// TestRestartGuard_nodeCountsOnceUpLongEnough: a node just started refuses
// until its reported uptime exceeds the guard (rounded up to whole
// seconds), then grants; Lock waits for it through its retries.
func TestRestartGuard_nodeCountsOnceUpLongEnough(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 1)
	// A node timeout above the derived 100ms: the fresh node answers slowly under -race.
	c := newClient(t, rc.Clients(), WithTTL(time.Second), WithNodeTimeout(250*time.Millisecond), WithRestartGuard(time.Second))
	ctx := t.Context()
	// A TryLock whose request missed the node timeout (load 15 under
	// -race) proves nothing either way: tried again while the node is
	// young.
	for {
		_, err := c.TryLock(ctx, "r")
		if errors.Is(err, ErrNodeRestarted) {
			break
		}
		up := uptime(t, rc, 0)
		if up > time.Second {
			break // too late to tell: the Lock below still checks the grant
		}
		if !errors.Is(err, ErrNoQuorum) {
			t.Fatalf("TryLock on a node up %v, guard 1s = %v; want ErrNodeRestarted", up, err)
		}
	}
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	l, err := c.Lock(lctx, "r", WithRetryDelay(100*time.Millisecond, 200*time.Millisecond))
	if err != nil {
		t.Fatalf("Lock with the guard = %v; want it granted once the node is up 1s", err)
	}
	if up := uptime(t, rc, 0); up <= time.Second {
		t.Errorf("granted on a node reporting %v up; want more than 1s", up)
	}
	l.Unlock(ctx)
}
