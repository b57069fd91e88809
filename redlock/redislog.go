package redlock

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// RedisLogger passes go-redis's log lines to a slog.Logger, each distinct
// line at most once per interval. Install it with redis.SetLogger: go-redis
// has one logger per process, so a library cannot set it for you. While a
// node is down, go-redis logs each failed dial ("connection pool: failed to
// dial after 1 attempts: … connection refused"), a few times a second for
// one dead node under a Client's probes and renewals; through a
// RedisLogger that is one line per interval, with the number of repeats
// dropped since the last one written (TestRedisLogger_ratePerLine).
//
// A RedisLogger is safe for concurrent use. Make one with NewRedisLogger.
type RedisLogger struct {
	l     *slog.Logger
	every time.Duration

	mu   sync.Mutex           // protects seen
	seen map[string]*repeated // per line: when it was last written, and the repeats since
}

type repeated struct {
	at      time.Time
	dropped int
}

// maxRedisLines bounds the lines a RedisLogger remembers; past it, it
// forgets them all (and may write each once more).
const maxRedisLines = 1024

// NewRedisLogger returns a RedisLogger that writes to l at level Warn,
// each distinct line at most once per every (a minute if every ≤ 0). A nil
// l is slog.Default().
//
//	redis.SetLogger(redlock.NewRedisLogger(logger, time.Minute))
func NewRedisLogger(l *slog.Logger, every time.Duration) *RedisLogger {
	if l == nil {
		l = slog.Default()
	}
	if every <= 0 {
		every = time.Minute
	}
	return &RedisLogger{l: l, every: every, seen: make(map[string]*repeated)}
}

// Printf is go-redis's logging call (the Logging interface of
// redis.SetLogger).
func (r *RedisLogger) Printf(ctx context.Context, format string, v ...any) {
	line := fmt.Sprintf(format, v...)
	now := time.Now()
	r.mu.Lock()
	s := r.seen[line]
	if s != nil && now.Sub(s.at) < r.every {
		s.dropped++
		r.mu.Unlock()
		return
	}
	dropped := 0
	if s != nil {
		dropped = s.dropped
	}
	if len(r.seen) >= maxRedisLines {
		clear(r.seen)
	}
	r.seen[line] = &repeated{at: now}
	r.mu.Unlock()
	if dropped > 0 {
		r.l.WarnContext(ctx, "go-redis: "+line, "repeated", dropped)
		return
	}
	r.l.WarnContext(ctx, "go-redis: "+line)
}
