package redlock

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

func TestNew_invalid(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	good := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { good.Close() })
	var typedNil *redis.Client
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": m.Addr()}})
	t.Cleanup(func() { ring.Close() })

	cases := []struct {
		name  string
		nodes []redis.UniversalClient
		opts  []Option
	}{
		{"no nodes", nil, nil},
		{"nil node", []redis.UniversalClient{good, nil}, nil},
		{"typed nil node", []redis.UniversalClient{typedNil}, nil},
		{"ring", []redis.UniversalClient{ring}, nil},
		{"zero ttl", []redis.UniversalClient{good}, []Option{WithTTL(0)}},
		{"negative ttl", []redis.UniversalClient{good}, []Option{WithTTL(-time.Second)}},
		{"ttl within drift allowance", []redis.UniversalClient{good}, []Option{WithTTL(2 * time.Millisecond), WithRenewInterval(time.Millisecond), WithNodeTimeout(time.Microsecond)}},
		{"drift negative", []redis.UniversalClient{good}, []Option{WithDriftFactor(-0.1)}},
		{"drift one", []redis.UniversalClient{good}, []Option{WithDriftFactor(1)}},
		{"retry count negative", []redis.UniversalClient{good}, []Option{WithRetryCount(-1)}},
		{"retry min above max", []redis.UniversalClient{good}, []Option{WithRetryDelay(time.Second, time.Millisecond)}},
		{"retry min negative", []redis.UniversalClient{good}, []Option{WithRetryDelay(-time.Second, time.Millisecond)}},
		{"node timeout negative", []redis.UniversalClient{good}, []Option{WithNodeTimeout(-time.Second)}},
		{"node timeout not below interval", []redis.UniversalClient{good}, []Option{WithNodeTimeout(10 * time.Second)}},
		{"interval not below ttl", []redis.UniversalClient{good}, []Option{WithRenewInterval(30 * time.Second)}},
		{"interval negative", []redis.UniversalClient{good}, []Option{WithRenewInterval(-time.Second)}},
		// 0 is not "derived": these options must be positive.
		{"node timeout zero", []redis.UniversalClient{good}, []Option{WithNodeTimeout(0)}},
		{"interval zero", []redis.UniversalClient{good}, []Option{WithRenewInterval(0)}},
		// TTL·drift + 2ms overflows a Duration: still within the allowance.
		{"largest ttl within drift allowance", []redis.UniversalClient{good}, []Option{WithTTL(math.MaxInt64), WithDriftFactor(0.9999999999999999)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := New(tc.nodes, tc.opts...)
			if !errors.Is(err, ErrInvalidArgument) || c != nil {
				t.Errorf("New(%s) = %v, %v; want nil, ErrInvalidArgument", tc.name, c, err)
			}
		})
	}
}

func TestLock_invalidPerCall(t *testing.T) {
	t.Parallel()
	nodes, counter := countingNodes(t, 3)
	c, err := New(nodes)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	cases := []struct {
		name     string
		resource string
		opts     []Option
	}{
		{"empty resource", "", nil},
		{"key prefix per call", "r", []Option{WithKeyPrefix("other:")}},
		{"interval above short ttl", "r", []Option{WithTTL(time.Second), WithRenewInterval(2 * time.Second)}},
		{"node timeout above derived interval", "r", []Option{WithTTL(time.Second), WithNodeTimeout(500 * time.Millisecond)}},
		{"negative retries", "r", []Option{WithRetryCount(-3)}},
		{"nil onlost is fine but bad ttl is not", "r", []Option{WithOnLost(nil), WithTTL(-1)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			before := counter.n.Load()
			if l, err := c.Lock(ctx, tc.resource, tc.opts...); !errors.Is(err, ErrInvalidArgument) || l != nil {
				t.Errorf("Lock = %v, %v; want nil, ErrInvalidArgument", l, err)
			}
			if l, err := c.TryLock(ctx, tc.resource, tc.opts...); !errors.Is(err, ErrInvalidArgument) || l != nil {
				t.Errorf("TryLock = %v, %v; want nil, ErrInvalidArgument", l, err)
			}
			if err := c.Do(ctx, tc.resource, func(context.Context) error { return nil }, tc.opts...); !errors.Is(err, ErrInvalidArgument) {
				t.Errorf("Do = %v; want ErrInvalidArgument", err)
			}
			if got := counter.n.Load(); got != before {
				t.Errorf("%d commands sent for invalid input; want no I/O", got-before)
			}
		})
	}
	if _, err := c.IsLocked(t.Context(), ""); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("IsLocked(\"\") = %v; want ErrInvalidArgument", err)
	}
	if err := c.Do(t.Context(), "r", nil); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Do(nil fn) = %v; want ErrInvalidArgument", err)
	}
}

func TestConfig_derivedDefaults(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name                   string
		client, call           []Option
		wantInterval, wantTime time.Duration
	}{
		{"defaults", nil, nil, 10 * time.Second, time.Second},
		{"short ttl per call", nil, []Option{WithTTL(3 * time.Second)}, time.Second, 300 * time.Millisecond},
		{"ttl on client", []Option{WithTTL(600 * time.Millisecond)}, nil, 200 * time.Millisecond, 60 * time.Millisecond},
		{"explicit interval kept", []Option{WithRenewInterval(5 * time.Second)}, []Option{WithTTL(20 * time.Second)}, 5 * time.Second, time.Second},
		{"explicit timeout kept", nil, []Option{WithNodeTimeout(50 * time.Millisecond)}, 10 * time.Second, 50 * time.Millisecond},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			base, err := buildConfig(defaultConfig(), tc.client, false)
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := buildConfig(base, tc.call, true)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.renewInterval != tc.wantInterval || cfg.nodeTimeout != tc.wantTime {
				t.Errorf("interval, timeout = %v, %v; want %v, %v", cfg.renewInterval, cfg.nodeTimeout, tc.wantInterval, tc.wantTime)
			}
		})
	}
}
