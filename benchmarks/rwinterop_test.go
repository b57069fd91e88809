package benchmarks

import (
	"errors"
	"testing"
	"time"

	"github.com/go-redsync/redsync/v4"

	"github.com/quorumlock/quorumlock/internal/redistest"
	"github.com/quorumlock/quorumlock/redlock"
)

// A redsync writer on a read-write lock's key (issue 24): while redsync
// holds it, quorumlock readers and writers are refused; while quorumlock
// readers or a writer hold it, redsync is refused (the key holds the
// readers' marker or the writer's token); after our Unlock redsync gets it.
func TestInterop_redsyncWriterAndReadWriteLock(t *testing.T) {
	rc := redistest.Start(t, 3)
	q, rs := beside(t, rc)
	ctx := t.Context()
	one := func() *redsync.Mutex {
		return rs.NewMutex("doc", redsync.WithTries(1), redsync.WithExpiry(5*time.Second))
	}

	m := one()
	if err := m.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := q.TryRLock(ctx, "doc"); !errors.Is(err, redlock.ErrNotObtained) {
		t.Errorf("TryRLock beside a redsync writer = %v; want ErrNotObtained", err)
	}
	if _, err := q.TryWLock(ctx, "doc"); !errors.Is(err, redlock.ErrNotObtained) {
		t.Errorf("TryWLock beside a redsync writer = %v; want ErrNotObtained", err)
	}
	if ok, err := m.UnlockContext(ctx); !ok || err != nil {
		t.Fatalf("redsync Unlock = %v, %v", ok, err)
	}

	for _, kind := range []string{"read", "write"} {
		var l *redlock.Lock
		var err error
		if kind == "read" {
			l, err = q.RLock(ctx, "doc")
		} else {
			l, err = q.WLock(ctx, "doc")
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := one().LockContext(ctx); err == nil {
			t.Errorf("redsync Lock beside a quorumlock %s lock succeeded; want refused", kind)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		// Unlock returns at a majority; the last release may still be on
		// its way, so redsync (which needs a majority too) may retry once.
		m := rs.NewMutex("doc", redsync.WithTries(5), redsync.WithRetryDelay(20*time.Millisecond))
		if err := m.LockContext(ctx); err != nil {
			t.Errorf("redsync Lock after our %s Unlock = %v; want acquired", kind, err)
		} else {
			m.UnlockContext(ctx)
		}
	}
}
