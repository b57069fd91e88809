package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/quorumlock/quorumlock/election"
	"github.com/quorumlock/quorumlock/redlock"
)

// dialTimeout bounds connecting to the nodes.
const dialTimeout = 10 * time.Second

// cmdRun is qlock run.
func cmdRun(args []string, stdout, stderr io.Writer) int {
	var c common
	resource, command, code, ok := c.parseCommand("run", "RESOURCE", args, stdout, stderr)
	if !ok {
		return code
	}
	if c.read {
		return runRead(&c, resource, command, stdout, stderr) // read.go
	}
	sigs := make(chan os.Signal, 8)
	notifySignals(sigs)
	defer signal.Stop(sigs)
	if c.permits > 0 {
		return runPermit(&c, resource, command, sigs, stderr) // permit.go
	}

	lockOpts := []redlock.Option{redlock.WithTTL(c.ttl), redlock.WithFencing(c.fencing)}
	if c.wait.d == 0 {
		lockOpts = append(lockOpts, redlock.WithRetryCount(1)) // one attempt, like flock -n
	}
	s := session{c: &c, name: resource, stderr: stderr, lockOpts: lockOpts}
	defer s.close()
	term, code := s.acquire(sigs, c.wait.d)
	if term == nil {
		return code
	}
	res := runChild(term, resource, command, &c, sigs, stderr)
	s.resign(term)
	return res.code
}

// parseCommand parses the flags of qlock run or elect (cmd), then NAME
// (what names the resource or election) and COMMAND after "--". When it
// returns ok false, the caller exits with code: 0 after -h, exitUsage on
// bad usage (reported on stderr).
func (c *common) parseCommand(cmd, what string, args []string, stdout, stderr io.Writer) (name string, command []string, code int, ok bool) {
	fs := c.flags(cmd, stderr, true)
	name, command, err := c.parse(fs, what, args, stdout)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return "", nil, 0, false
	case err != nil:
		return "", nil, fail(stderr, exitUsage, fmt.Errorf("%s: %w (see qlock help)", cmd, err)), false
	case len(command) == 0:
		return "", nil, fail(stderr, exitUsage, fmt.Errorf("%s: missing COMMAND after %s -- (see qlock help)", cmd, what)), false
	}
	return name, command, 0, true
}

// session is the connection and election of one qlock run or elect.
type session struct {
	c        *common
	name     string
	stderr   io.Writer
	lockOpts []redlock.Option
	elect    bool // qlock elect: leadership is what it does, so -v logs it

	client *redlock.Client
	e      *election.Election
	closer func()
}

func (s *session) close() {
	if s.closer != nil {
		s.closer()
	}
}

// acquire connects (the first time) and campaigns, for at most wait (< 0:
// until acquired). A signal from sigs ends the wait. It returns the term,
// or nil and the exit code after printing the error.
func (s *session) acquire(sigs <-chan os.Signal, wait time.Duration) (*election.Term, int) {
	var code int
	term, stopped := waitUnlessSignalled(sigs, s.stderr, s.name, "the lock",
		func(ctx context.Context) *election.Term {
			var term *election.Term
			term, code = s.campaign(ctx, wait)
			return term
		},
		func(term *election.Term) {
			if term != nil {
				s.resign(term)
			}
		})
	if stopped != 0 {
		return nil, stopped
	}
	return term, code
}

// waitUnlessSignalled runs acquire on a goroutine of its own and waits for
// it, watching sigs meanwhile. Ctrl-Z (or SIGTTIN/SIGTTOU) stops qlock
// itself: nothing runs under the lease yet, so it waits on when continued.
// Any other signal cancels acquire's ctx, gives back what acquire got
// anyway, says so on stderr ("stopped by SIG while waiting for what") and
// returns 128+N as the exit code; 0 when acquire finished first.
func waitUnlessSignalled[T any](sigs <-chan os.Signal, stderr io.Writer, resource, what string, acquire func(context.Context) T, giveBack func(T)) (T, int) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var got T
	done := make(chan struct{})
	go func() {
		defer close(done)
		got = acquire(ctx)
	}()
	for {
		select {
		case <-done:
			return got, 0
		case sig := <-sigs:
			if isJobStop(sig.(syscall.Signal)) {
				stopSelf(true)
				continue
			}
			cancel()
			<-done
			giveBack(got)
			fmt.Fprintf(stderr, "qlock: %s: stopped by %v while waiting for %s\n", resource, sig, what)
			var zero T
			return zero, 128 + int(sig.(syscall.Signal))
		}
	}
}

func (s *session) campaign(ctx context.Context, wait time.Duration) (*election.Term, int) {
	if s.e == nil {
		dctx, cancel := context.WithTimeout(ctx, dialTimeout)
		client, nodes, err := s.c.connect(dctx, s.stderr)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil, 0
			}
			return nil, fail(s.stderr, exitFor(err), fmt.Errorf("connecting: %w", err))
		}
		s.closer = func() {
			client.Close()
			closeNodes(nodes)
		}
		opts := []election.Option{election.WithIdentity(s.c.identity), election.WithKeyPrefix(s.c.prefix),
			election.WithLockOptions(s.lockOpts...)}
		// A plain run logs its lock through redlock.WithLogger (connect);
		// "leadership acquired/resigned" would only confuse it.
		if l := s.c.logger(s.stderr); l != nil && s.elect {
			opts = append(opts, election.WithLogger(l))
		}
		s.client = client
		if s.e, err = election.New(client, s.name, opts...); err != nil {
			return nil, fail(s.stderr, exitUsage, err)
		}
	}
	if wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, wait)
		defer cancel()
	}
	var bo *backoff.ExponentialBackOff
	for {
		term, err := s.e.Campaign(ctx)
		switch {
		case err == nil:
			return term, 0
		case errors.Is(err, context.Canceled):
			return nil, 0 // a signal; acquire reports it
		case wait == 0 || ctx.Err() != nil || !errors.Is(err, redlock.ErrNoQuorum):
			return nil, fail(s.stderr, exitFor(err), fmt.Errorf("%s: %w", s.name, err))
		}
		// Too few nodes answered (a node restarting, a network blip):
		// a standby must not die of it; campaign again, backing off.
		if bo == nil {
			bo = campaignBackoff()
		}
		d := bo.NextBackOff()
		fail(s.stderr, 0, fmt.Errorf("%s: %w; campaigning again in %v", s.name, err, d.Round(time.Millisecond)))
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			if errors.Is(ctx.Err(), context.Canceled) {
				return nil, 0
			}
			return nil, fail(s.stderr, exitFor(err), fmt.Errorf("%s: %w", s.name, err))
		}
	}
}

// Campaign retries after too few nodes answered: exponential from
// retryInitial to retryMax, jittered by half, for as long as the wait lasts.
const (
	retryInitial = 100 * time.Millisecond
	retryMax     = 5 * time.Second
)

func campaignBackoff() *backoff.ExponentialBackOff {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval, bo.MaxInterval, bo.Multiplier, bo.RandomizationFactor = retryInitial, retryMax, 2, 0.5
	bo.MaxElapsedTime = 0 // the caller's wait bounds it
	bo.Reset()
	return bo
}

// resign releases the term, bounded so that qlock never hangs on exit.
func (s *session) resign(term *election.Term) {
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	defer cancel()
	if err := term.Resign(ctx); err != nil && !errors.Is(err, election.ErrNotLeader) {
		fail(s.stderr, 0, fmt.Errorf("%s: release: %w", s.name, err))
	}
}
