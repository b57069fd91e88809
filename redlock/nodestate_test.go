package redlock

import (
	"bytes"
	"context"
	"errors"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/redistest"
)

// defaultClients returns clients for rc's nodes built as a new user builds
// them: go-redis's defaults (ContextTimeoutEnabled false, a 3s read
// timeout, retries).
func defaultClients(t *testing.T, rc *redistest.Cluster) []redis.UniversalClient {
	t.Helper()
	var out []redis.UniversalClient
	for i := range rc.N() {
		cl := redis.NewClient(&redis.Options{Addr: rc.Addr(i)})
		t.Cleanup(func() { cl.Close() })
		out = append(out, cl)
	}
	return out
}

// Issue 21 item 2: with clients that ignore ctx on socket reads, a call to
// a Client with two of three nodes paused answers within its ctx plus the
// node timeout, call after call: no call waits behind the requests an
// earlier call left in a paused node's socket.
func TestReal_pausedNodesIgnoringCtxCostOneNodeTimeout(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	const nodeTimeout, ctxTimeout = 50 * time.Millisecond, 70 * time.Millisecond
	c := newClient(t, defaultClients(t, rc), WithNodeTimeout(nodeTimeout))
	for _, i := range []int{1, 2} {
		rc.Pause(i)
		t.Cleanup(func() { rc.Resume(i) })
	}
	// Measured ≤ 75ms a call; a bound of 5x the ctx + node timeout still
	// tells a call that waits for go-redis's 3s read timeout.
	const bound = 5 * (ctxTimeout + nodeTimeout)
	for call := range 3 {
		ctx, cancel := context.WithTimeout(t.Context(), ctxTimeout)
		start := time.Now()
		_, err := c.TryLock(ctx, "paused")
		took := time.Since(start)
		cancel()
		t.Logf("call %d: %v: %v", call, took, err)
		if !errors.Is(err, ErrNoQuorum) {
			t.Errorf("call %d: TryLock with 2 of 3 paused = %v; want ErrNoQuorum", call, err)
		}
		if took > bound {
			t.Errorf("call %d: TryLock with 2 of 3 paused took %v; want ≤ %v", call, took, bound)
		}
	}
}

// Issue 21 item 5: a node whose port is closed, and one whose name does not
// resolve, fail with Kind "connection" and the dialer's own message — the
// message qlock status prints for them (it shows go-redis's error of a
// GET) — on the first call and, at once, on the next ones.
func TestReal_downNodesSayWhy(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 2)
	closed := rc.ServerAddr(1)
	rc.Kill(1) // its port is closed now: dials are refused
	addrs := []string{rc.Addr(0), closed, "quorumlock-no-such-host.invalid:6379"}
	var nodes []redis.UniversalClient
	for _, a := range addrs {
		cl := redis.NewClient(&redis.Options{Addr: a}) // go-redis defaults
		t.Cleanup(func() { cl.Close() })
		nodes = append(nodes, cl)
	}
	// What qlock status prints for each down node (readNode's GET).
	status := make([]string, 3)
	for i := 1; i < 3; i++ {
		st := redis.NewClient(&redis.Options{Addr: addrs[i]})
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		err := st.Get(ctx, "lock:down").Err()
		cancel()
		st.Close()
		if err == nil {
			t.Fatalf("GET on %s succeeded", addrs[i])
		}
		status[i] = err.Error()
	}
	const nodeTimeout = time.Second
	c := newClient(t, nodes, WithNodeTimeout(nodeTimeout))
	for call := range 3 {
		start := time.Now()
		// A resource per call: a failed call's release of node 0 finishes
		// in the background, and until it lands, node 0 refuses the next
		// call's request for the same resource, which decides that call
		// before the node that did not resolve answers (beside the soak).
		_, err := c.TryLock(t.Context(), "down"+strconv.Itoa(call))
		took := time.Since(start)
		t.Logf("call %d: %v: %v", call, took, err)
		if !errors.Is(err, ErrNoQuorum) {
			t.Fatalf("call %d: TryLock = %v; want ErrNoQuorum", call, err)
		}
		for i := 1; i < 3; i++ {
			ne := nodeErrorOf(err, i)
			if ne == nil {
				t.Fatalf("call %d: TryLock = %v; want a *NodeError for node %d", call, err, i)
			}
			if got, want := ne.Kind(), "connection"; got != want {
				t.Errorf("call %d: node %d (%s): Kind() = %q; want %q (%v)", call, i, addrs[i], got, want, ne)
			}
			if !strings.Contains(ne.Error(), status[i]) {
				t.Errorf("call %d: node %d: %q does not contain what qlock status says, %q", call, i, ne.Error(), status[i])
			}
		}
		// Once known down, a node is answered at once: measured 1–5ms
		// idle, 124ms beside the whole package's tests; a call that waits
		// for the node timeout takes 1s.
		if call > 0 && took > nodeTimeout/2 {
			t.Errorf("call %d took %v; want the down nodes answered at once (≤ %v)", call, took, nodeTimeout/2)
		}
	}
}

// nodeErrorOf returns the *NodeError of node i in err, or nil.
func nodeErrorOf(err error, i int) *NodeError {
	var walk func(error) *NodeError
	walk = func(e error) *NodeError {
		if ne, ok := e.(*NodeError); ok && ne.Node == i {
			return ne
		}
		switch u := e.(type) {
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if ne := walk(e); ne != nil {
					return ne
				}
			}
		case interface{ Unwrap() error }:
			if e := u.Unwrap(); e != nil {
				return walk(e)
			}
		}
		return nil
	}
	return walk(err)
}

// Issue 21 item 6: a permanent error reply on every node (a list where the
// lock key should be) ends Lock at once, however long its ctx.
func TestReal_permanentReplyEndsLock(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	for i := range 3 {
		if err := rc.Admin(i).RPush(t.Context(), "lock:wrongtype", "x").Err(); err != nil {
			t.Fatal(err)
		}
	}
	// Measured 17–67ms, 469ms beside busy tests: a bound of 2 node timeouts
	// of 1s keeps the slack, and a Lock that retries never ends.
	const nodeTimeout = time.Second
	c := newClient(t, rc.Clients(), WithNodeTimeout(nodeTimeout))
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := c.Lock(context.Background(), "wrongtype")
		done <- err
	}()
	var err error
	select {
	case err = <-done:
	case <-time.After(20 * nodeTimeout):
		t.Fatal("Lock with WRONGTYPE on every node is still retrying after 20 node timeouts")
	}
	took := time.Since(start)
	t.Logf("%v: %v", took, err)
	if !errors.Is(err, ErrNoQuorum) || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Errorf("Lock = %v; want ErrNoQuorum with the WRONGTYPE replies", err)
	}
	if took > 2*nodeTimeout {
		t.Errorf("Lock took %v; want ≤ 2 node timeouts (%v)", took, 2*nodeTimeout)
	}
}

// Issue 21 item 8: two names of one server in New (127.0.0.1:P and
// localhost:P) with the third node down never make a grant; every call
// says which nodes reach one server.
func TestReal_oneServerTwoNamesNeverGrants(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 2)
	_, port, _ := net.SplitHostPort(rc.Addr(0))
	down := rc.ServerAddr(1)
	rc.Kill(1)
	var nodes []redis.UniversalClient
	for _, a := range []string{"127.0.0.1:" + port, "localhost:" + port, down} {
		cl := redis.NewClient(&redis.Options{Addr: a, ContextTimeoutEnabled: true})
		t.Cleanup(func() { cl.Close() })
		nodes = append(nodes, cl)
	}
	c := newClient(t, nodes, WithNodeTimeout(time.Second))
	for call := range 3 {
		l, err := c.TryLock(t.Context(), "twice")
		if err == nil {
			l.Unlock(context.Background())
			t.Fatalf("call %d: TryLock granted with one live server counted twice", call)
		}
		// The first round identifies the nodes and says so, unless the
		// machine is so busy that their first requests time out (then the
		// round is ErrNoQuorum, and the next one says it).
		if call == 0 && !errors.Is(err, ErrInvalidArgument) && errors.Is(err, ErrNoQuorum) && errors.Is(err, context.DeadlineExceeded) {
			t.Logf("call 0 timed out before the nodes were identified: %v", err)
			continue
		}
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "nodes[0]") || !strings.Contains(err.Error(), "nodes[1]") {
			t.Errorf("call %d: TryLock = %v; want ErrInvalidArgument naming nodes[0] and nodes[1]", call, err)
		}
		if ok, err := c.IsLocked(t.Context(), "twice"); ok || !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("call %d: IsLocked = %v, %v; want ErrInvalidArgument", call, ok, err)
		}
	}
	if _, err := c.Lock(t.Context(), "twice"); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Lock = %v; want ErrInvalidArgument at once", err)
	}
}

// Issue 21 item 7, for Dial: a cancelled ctx is context.Canceled, not
// ErrNoQuorum.
func TestDial_cancelledCtxIsCanceled(t *testing.T) {
	t.Parallel()
	var urls []string
	for range 3 {
		urls = append(urls, "redis://"+miniredis.RunT(t).Addr())
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	c, err := Dial(ctx, urls)
	if err == nil {
		c.Close()
	}
	if !errors.Is(err, context.Canceled) || errors.Is(err, ErrNoQuorum) {
		t.Errorf("Dial(cancelled ctx) = %v; want context.Canceled, not ErrNoQuorum", err)
	}
}

// Issue 21 item 7: a call whose ctx was cancelled before it began is
// context.Canceled, not an outage (ErrNoQuorum), and its hooks say
// "canceled".
func TestClient_cancelledCtxIsCanceled(t *testing.T) {
	t.Parallel()
	_, nodes := miniNodes(t, 3)
	rec := &recorder{}
	c := newClient(t, nodes, WithHooks(rec))
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	for name, try := range map[string]func() error{
		"Lock":     func() error { _, err := c.Lock(ctx, "cancelled"); return err },
		"TryLock":  func() error { _, err := c.TryLock(ctx, "cancelled"); return err },
		"IsLocked": func() error { _, err := c.IsLocked(ctx, "cancelled"); return err },
		"Do": func() error {
			return c.Do(ctx, "cancelled", func(context.Context) error { return nil })
		},
	} {
		err := try()
		if !errors.Is(err, context.Canceled) || errors.Is(err, ErrNoQuorum) {
			t.Errorf("%s(cancelled ctx) = %v; want context.Canceled, not ErrNoQuorum", name, err)
		}
	}
	rec.mu.Lock()
	// A ctx done before the call sends nothing (issue 44 item 3): no round,
	// so no Attempt hook; the calls end canceled.
	if len(rec.attempts) != 0 {
		t.Errorf("%d Attempt hooks (%+v); want none: no round was sent", len(rec.attempts), rec.attempts[0])
	}
	if got, want := len(rec.acquires), 3; got != want {
		t.Errorf("Acquire hooks: %d; want %d", got, want)
	}
	for _, a := range rec.acquires {
		if a.Outcome != OutcomeCanceled {
			t.Errorf("Acquire hook: outcome %q; want %q (%v)", a.Outcome, OutcomeCanceled, a.Err)
		}
	}
	rec.mu.Unlock()

	// Extend of a held lock: the lock stays held, and the call says why it
	// did nothing.
	l, err := c.Lock(t.Context(), "held")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Extend(ctx); !errors.Is(err, context.Canceled) || errors.Is(err, ErrNoQuorum) || errors.Is(err, ErrLockLost) {
		t.Errorf("Extend(cancelled ctx) = %v; want context.Canceled, not ErrNoQuorum or ErrLockLost", err)
	}
	if !l.Valid() {
		t.Error("the lock is no longer valid after an Extend with a cancelled ctx")
	}
	if err := l.Unlock(t.Context()); err != nil {
		t.Errorf("Unlock = %v", err)
	}
}

// A node that comes back after an outage is used again within one probe
// interval (probeEvery), and within go-redis's second more when its pool
// had stopped dialing it (PoolSize failed dials: the pool then returns the
// last dial's error and dials once a second itself). Two of three nodes
// are down for 3s, so a TryLock succeeds only once the Client uses the
// restarted one again.
func TestReal_nodeBackIsUsedAgain(t *testing.T) {
	t.Parallel()
	const nodeTimeout = 250 * time.Millisecond // probeEvery: 250ms
	for _, tc := range []struct {
		name     string
		poolSize int  // 2: stops dialing within the outage; 100: never does
		stopped  bool // whether go-redis's pool stopped dialing the node
		// Measured (-race included, idle, beside the simulator and
		// stress-ng --cpu 2): stopped 0.71–0.90s in 40 runs, still
		// dialing 2–47ms in 15. The bounds: a probe interval and a node
		// timeout, and go-redis's second for a pool that stopped, with
		// 5x slack.
		bound time.Duration
	}{
		{"pool still dialing", 100, false, 5 * 2 * nodeTimeout},
		{"pool stopped dialing", 2, true, 5 * (time.Second + 2*nodeTimeout)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rc := redistest.Start(t, 3)
			addrs := []string{rc.ServerAddr(0), rc.ServerAddr(1), rc.ServerAddr(2)}
			rc.Kill(1)
			rc.Kill(2)
			// Registered first, so it runs after the clients' Close:
			// go-redis's dial loop of the node that stays down sleeps a
			// second between dials and sees the Close only then.
			t.Cleanup(func() { waitGoroutinesGone(t, "(*ConnPool).tryDial", 5*time.Second) })
			var nodes []redis.UniversalClient
			var dials2 atomic.Int64 // dials of node 2
			for i, a := range addrs {
				var d net.Dialer
				dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
					if i == 2 {
						dials2.Add(1)
					}
					return d.DialContext(ctx, network, addr)
				}
				cl := redis.NewClient(&redis.Options{Addr: a, PoolSize: tc.poolSize, ContextTimeoutEnabled: true, Dialer: dial})
				t.Cleanup(func() { cl.Close() })
				nodes = append(nodes, cl)
			}
			c := newClient(t, nodes, WithNodeTimeout(nodeTimeout))
			// 3s of outage: our probe's dials (one every 250ms, each cut
			// at the node timeout) are well over a PoolSize of 2.
			for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
				if _, err := c.TryLock(t.Context(), "back"); !errors.Is(err, ErrNoQuorum) {
					t.Fatalf("TryLock with 2 of 3 down = %v; want ErrNoQuorum", err)
				}
				time.Sleep(50 * time.Millisecond)
			}
			// A pool that stopped dialing fails a Ping with the last
			// dial's error, dialing only in its own loop, once a second
			// (1 dial in a 153ms Ping, measured); one that dials dials
			// for each of the Ping's 4 tries at least (65 measured).
			// Counted, not timed: at load 19 a stopped pool's Ping took
			// 532ms, more than the 300ms that used to tell them apart.
			before := dials2.Load()
			start := time.Now()
			err := nodes[2].Ping(t.Context()).Err()
			if n := dials2.Load() - before; err == nil || (n < 4) != tc.stopped {
				t.Fatalf("Ping of the dead node 2 dialed it %d times in %v (%v); want the pool to have stopped dialing: %v (without that the test measures something else)", n, time.Since(start), err, tc.stopped)
			}
			rc.Restart(2)
			if got := rc.ServerAddr(2); got != addrs[2] {
				t.Skipf("node 2 restarted on %s, not %s (another program took its port)", got, addrs[2])
			}
			back := time.Now()
			for call := 0; ; call++ {
				l, err := c.TryLock(t.Context(), "back"+strconv.Itoa(call))
				if err == nil {
					t.Logf("the restarted node was used again %v after it answered (call %d)", time.Since(back), call)
					_ = l.Unlock(t.Context())
					return
				}
				if !errors.Is(err, ErrNoQuorum) {
					t.Fatalf("TryLock = %v; want ErrNoQuorum until node 2 is used again", err)
				}
				if took := time.Since(back); took > tc.bound {
					t.Fatalf("node 2 was not used again %v after it answered; want ≤ %v: %v", took, tc.bound, err)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

// waitGoroutinesGone waits up to limit until no goroutine runs fn (a part
// of its stack), and logs if one still does.
func waitGoroutinesGone(t *testing.T, fn string, limit time.Duration) {
	buf := make([]byte, 1<<20)
	running := func() bool { return bytes.Contains(buf[:runtime.Stack(buf, true)], []byte(fn)) }
	if !eventually(limit, func() bool { return !running() }) {
		t.Logf("a goroutine still runs %s after %v", fn, limit)
	}
}
