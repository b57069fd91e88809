package redlock

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/redistest"
)

// One killed node of three costs Close little when its clients dial once:
// Dial's clients do, and so do clients built with DialerRetries 1 (the
// README's advice). With go-redis's default of 5 dials 100ms apart in each
// of its tries, a refusing node looks silent, and Close waits for it the
// bound its doc names: the node timeout and 250ms (984-998ms at the
// default 1s in issue 44).
// Real nodes; node 2 is killed before the Client starts, so its port
// refuses connections.
func TestClose_killedNodeCostsLittle(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	rc.Kill(2)
	var urls []string
	for i := range rc.N() {
		urls = append(urls, "redis://"+rc.ServerAddr(i))
	}
	newClient := func(t *testing.T, dialerRetries, maxRetries int) *Client {
		var nodes []redis.UniversalClient
		for i := range rc.N() {
			cl := redis.NewClient(&redis.Options{Addr: rc.ServerAddr(i), ContextTimeoutEnabled: true, DialerRetries: dialerRetries, MaxRetries: maxRetries})
			t.Cleanup(func() { cl.Close() })
			nodes = append(nodes, cl)
		}
		c, err := New(nodes)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	for _, tc := range []struct {
		name string
		make func(t *testing.T) *Client
		// bound is what Close may take: well below the node timeout
		// (1s) when the dead node is known at once; with go-redis's
		// defaults, the bound Close's doc names (the node timeout and
		// 250ms), with room for a loaded machine.
		bound time.Duration
	}{
		{"Dial", func(t *testing.T) *Client { return dialT(t, urls) }, 500 * time.Millisecond},
		{"New, DialerRetries 1, MaxRetries -1", func(t *testing.T) *Client { return newClient(t, 1, -1) }, 500 * time.Millisecond},
		{"New, go-redis defaults", func(t *testing.T) *Client { return newClient(t, 0, 0) }, 3 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.make(t)
			if _, err := c.Lock(t.Context(), "dead-node"); err != nil {
				t.Fatalf("Lock with 2 of 3 nodes up: %v", err)
			}
			start := time.Now()
			if err := c.Close(); err != nil {
				t.Errorf("Close = %v", err)
			}
			took := time.Since(start)
			t.Logf("Close with a lock held and node 2 killed: %v", took)
			// Measured: 2-5ms when the dead node is known at once; 1.0s
			// with go-redis's defaults.
			if took >= tc.bound {
				t.Errorf("Close with node 2 killed took %v; want less than %v", took, tc.bound)
			}
		})
	}
}

// A Client of 1 or 2 nodes is accepted (no error, no warning), and
// tolerates no node failure: a majority of 1 is 1 and of 2 is 2, as New's
// doc and the README say. Real nodes, one of them killed.
func TestNew_oneAndTwoNodesTolerateNoFailure(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 2} {
		t.Run(fmt.Sprintf("nodes=%d", n), func(t *testing.T) {
			rc := redistest.Start(t, n)
			c, err := New(rc.Clients())
			if err != nil {
				t.Fatalf("New(%d nodes) = %v; want a Client", n, err)
			}
			t.Cleanup(func() { c.Close() })
			l, err := c.TryLock(t.Context(), "small")
			if err != nil {
				t.Fatalf("TryLock on %d nodes, all up = %v", n, err)
			}
			if err := l.Unlock(t.Context()); err != nil {
				t.Fatalf("Unlock = %v", err)
			}
			rc.Kill(n - 1)
			if _, err := c.TryLock(t.Context(), "small"); !errors.Is(err, ErrNoQuorum) {
				t.Errorf("TryLock on %d nodes, one killed = %v; want ErrNoQuorum", n, err)
			}
		})
	}
}
