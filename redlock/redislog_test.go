package redlock

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"
)

// A line go-redis repeats is written once per interval, with the count of
// repeats dropped meanwhile; another line is not held back by it.
func TestRedisLogger_ratePerLine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		r := NewRedisLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{ReplaceAttr: dropTime})), time.Second)
		ctx := context.Background()
		const dial = "redis: connection pool: failed to dial after %d attempts: %v"
		for range 5 { // 5 a second for 2s, as go-redis did with a dead node
			for range 5 {
				r.Printf(ctx, dial, 1, "dial tcp 127.0.0.1:7001: connect: connection refused")
				time.Sleep(200 * time.Millisecond)
			}
		}
		r.Printf(ctx, dial, 1, "dial tcp 127.0.0.1:7002: connect: connection refused")
		lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
		want := []string{
			`level=WARN msg="go-redis: redis: connection pool: failed to dial after 1 attempts: dial tcp 127.0.0.1:7001: connect: connection refused"`,
			`level=WARN msg="go-redis: redis: connection pool: failed to dial after 1 attempts: dial tcp 127.0.0.1:7001: connect: connection refused" repeated=4`,
			`level=WARN msg="go-redis: redis: connection pool: failed to dial after 1 attempts: dial tcp 127.0.0.1:7001: connect: connection refused" repeated=4`,
			`level=WARN msg="go-redis: redis: connection pool: failed to dial after 1 attempts: dial tcp 127.0.0.1:7001: connect: connection refused" repeated=4`,
			`level=WARN msg="go-redis: redis: connection pool: failed to dial after 1 attempts: dial tcp 127.0.0.1:7001: connect: connection refused" repeated=4`,
			`level=WARN msg="go-redis: redis: connection pool: failed to dial after 1 attempts: dial tcp 127.0.0.1:7002: connect: connection refused"`,
		}
		if strings.Join(lines, "\n") != strings.Join(want, "\n") {
			t.Errorf("25 lines in 5s, 1 per second allowed, then another line:\n%s\nwant\n%s", buf.String(), strings.Join(want, "\n"))
		}
	})
}

// A RedisLogger is what redis.SetLogger takes (checked when compiling; not
// run, as go-redis's logger is process-wide).
var _ = func() { redis.SetLogger(NewRedisLogger(nil, 0)) }

func dropTime(_ []string, a slog.Attr) slog.Attr {
	if a.Key == slog.TimeKey {
		return slog.Attr{}
	}
	return a
}
