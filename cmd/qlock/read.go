package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"

	"github.com/quorumlock/quorumlock/election"
	"github.com/quorumlock/quorumlock/redlock"
)

// lease is what runChild needs of what the command runs under: an
// election's term (qlock run, elect), a read lock (qlock run -read) or a
// permit (qlock run -n, permit.go).
type lease interface {
	Fence() int64
	ValidUntil() time.Time
	Context() context.Context
	Leader() election.Leader
}

var _ lease = (*election.Term)(nil)

// readLease is a read lock as a lease: readers write no identity on the
// nodes, so Leader is this process's own.
type readLease struct {
	*redlock.Lock
	identity string
}

func (r readLease) Leader() election.Leader { return election.Leader{Identity: r.identity} }

// unlockIfHeld gives back a lock a signalled wait got anyway.
func unlockIfHeld(l *redlock.Lock) {
	if l != nil {
		l.Unlock(context.Background())
	}
}

// runRead is qlock run -read: the command runs under a read lock of
// resource, shared with other readers and excluded by writers (a plain
// qlock run of the same resource holds its lock key, so it is a writer
// to them). Waiting, renewal, loss and release are as for qlock run.
func runRead(c *common, resource string, command []string, stdout, stderr io.Writer) int {
	sigs := make(chan os.Signal, 8)
	notifySignals(sigs)
	defer signal.Stop(sigs)

	dctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	client, nodes, err := c.connect(dctx, stderr)
	cancel()
	if err != nil {
		return fail(stderr, exitFor(err), fmt.Errorf("connecting: %w", err))
	}
	defer closeNodes(nodes)
	defer client.Close()

	l, stopped := waitUnlessSignalled(sigs, stderr, resource, "the read lock",
		func(ctx context.Context) *redlock.Lock {
			var l *redlock.Lock
			if c.wait.d == 0 {
				l, err = client.TryRLock(ctx, resource, redlock.WithTTL(c.ttl)) // one attempt, like flock -n
				return l
			}
			if c.wait.d > 0 { // < 0: -wait forever
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, c.wait.d)
				defer cancel()
			}
			l, err = client.RLock(ctx, resource, redlock.WithTTL(c.ttl))
			return l
		}, unlockIfHeld)
	if stopped != 0 {
		return stopped
	}
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, redlock.ErrNoQuorum) {
			err = errors.Join(redlock.ErrNotObtained, err)
		}
		return fail(stderr, exitFor(err), fmt.Errorf("%s: read lock: %w", resource, err))
	}
	res := runChild(readLease{l, c.identity}, resource, command, c, sigs, stderr)
	uctx, ucancel := context.WithTimeout(context.Background(), dialTimeout)
	defer ucancel()
	if err := l.Unlock(uctx); err != nil && !errors.Is(err, redlock.ErrNotHeld) {
		fail(stderr, 0, fmt.Errorf("%s: release: %w", resource, err))
	}
	return res.code
}
