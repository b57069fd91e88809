package redlock

import (
	"errors"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/node"
)

func TestClient_Link(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	n := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { n.Close() })
	c, err := New([]redis.UniversalClient{n}, WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	cases := []struct {
		name string
		opts []Option
		want time.Duration
	}{
		{"client default: TTL/10", nil, 500 * time.Millisecond},
		{"per-call TTL", []Option{WithTTL(2 * time.Second)}, 200 * time.Millisecond},
		{"capped", []Option{WithTTL(time.Hour)}, MaxNodeTimeout},
		{"per-call node timeout", []Option{WithNodeTimeout(300 * time.Millisecond)}, 300 * time.Millisecond},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lk, err := node.LinkOf(c, tc.opts...)
			if err != nil || lk.LockTimeout() != tc.want || lk.Set != c.set {
				t.Errorf("LinkOf() = %v, %v; want LockTimeout %v, the Client's nodes, nil", lk.LockTimeout(), err, tc.want)
			}
		})
	}
	for _, opts := range [][]Option{{WithKeyPrefix("x:")}, {WithRenewBatch(2)}, {WithTTL(-time.Second)}} {
		if lk, err := node.LinkOf(c, opts...); !errors.Is(err, ErrInvalidArgument) || lk.Set != nil {
			t.Errorf("LinkOf(invalid) = %v, %v; want no Set, ErrInvalidArgument", lk.Set, err)
		}
	}
	// A Client New did not make, or none, is an error, not a panic.
	for _, c := range []*Client{nil, {}} {
		if lk, err := node.LinkOf(c); err == nil || lk.Set != nil {
			t.Errorf("LinkOf(%p) = %v, %v; want no Set, an error", c, lk.Set, err)
		}
	}
}

func TestClient_goOwned(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	n := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { n.Close() })
	c, err := New([]redis.UniversalClient{n}, WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	// Close waits for f, up to the timeout given (longer than the
	// Client's own 100ms node timeout).
	const run = 400 * time.Millisecond
	done := make(chan struct{})
	if err := c.goOwned(2*time.Second, func() { time.Sleep(run); close(done) }); err != nil {
		t.Fatalf("goOwned() = %v; want nil", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	default:
		t.Errorf("Close returned before the function given to goOwned")
	}
	if err := c.goOwned(time.Second, func() { t.Error("f ran after Close") }); !errors.Is(err, ErrClosed) {
		t.Errorf("goOwned() after Close = %v; want ErrClosed", err)
	}
}
