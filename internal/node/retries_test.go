package node

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// A request that go-redis could not get a connection for was never written
// only when go-redis does not retry it: NewClient turns MaxRetries -1 into
// 0 and 0 into its default, 3, so the stored 0 is "no retries" (retriesOff
// looked for a negative value that Options never holds, and the path was
// dead: issue 44). The node refuses connections here: nothing listens on
// its port.
func TestDo_refusedDialIsUnsentOnlyWithoutRetries(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	for _, tc := range []struct {
		name       string
		maxRetries int
		unsent     bool
	}{
		{"MaxRetries -1 (no retries)", -1, true},
		{"MaxRetries 0 (go-redis's default, 3)", 0, false},
		{"MaxRetries 2", 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: tc.maxRetries, DialerRetries: 1,
				MinRetryBackoff: time.Millisecond, MaxRetryBackoff: time.Millisecond})
			t.Cleanup(func() { c.Close() })
			s := NewSet([]redis.UniversalClient{c}, Config{Timeout: time.Second, Go: func(func()) error { return errors.New("closed") }})
			n := &s.Nodes[0]
			if n.noRetries != tc.unsent {
				t.Errorf("newNode(client with MaxRetries %d).noRetries = %v; want %v (Options().MaxRetries is %d)", tc.maxRetries, n.noRetries, tc.unsent, c.Options().MaxRetries)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			_, err := do(ctx, s, 0, n, false, 5*time.Second, func(ctx context.Context, s redis.Scripter) (string, error) {
				return c.Ping(ctx).Result()
			})
			if err == nil || unsent(err) != tc.unsent {
				t.Errorf("PING to a refusing node with MaxRetries %d = %v, Unsent %v; want an error, Unsent %v", tc.maxRetries, err, unsent(err), tc.unsent)
			}
		})
	}
}
