package redlock_test

import (
	"context"
	"log/slog"
	"os"
	"time"

	"github.com/quorumlock/quorumlock/redlock"
)

// go-redis's log lines to a slog.Logger, each distinct line at most once
// a minute. A program installs it with redis.SetLogger (process-wide); here
// go-redis's calls are made by hand, three of one line and one of another.
func ExampleNewRedisLogger() {
	noTime := func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{ReplaceAttr: noTime}))
	r := redlock.NewRedisLogger(logger, time.Minute)
	// redis.SetLogger(r)
	ctx := context.Background()
	for range 3 {
		r.Printf(ctx, "redis: connection pool: failed to dial after %d attempts: %v", 1, "connection refused")
	}
	r.Printf(ctx, "redis: connection pool: failed to dial after %d attempts: %v", 1, "i/o timeout")
	// Output:
	// level=WARN msg="go-redis: redis: connection pool: failed to dial after 1 attempts: connection refused"
	// level=WARN msg="go-redis: redis: connection pool: failed to dial after 1 attempts: i/o timeout"
}
