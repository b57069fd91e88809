package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/redlock"
)

// childEnv names what a frozen-waiter child process does: "addrs;resource;ttl".
const childEnv = "QUORUMLOCK_CHAOS_WAITER"

// RunChildIfAsked is the frozen-waiter child process (see runFrozen): when
// the environment asks for one, it waits in Lock on the resource with a
// Client of its own (the run's TTL, default options otherwise), unlocks at
// once, and exits; otherwise it returns at once. The chaos test binary and
// the chaos command call it first thing.
func RunChildIfAsked() {
	spec := os.Getenv(childEnv)
	if spec == "" {
		return
	}
	parts := strings.Split(spec, ";")
	if len(parts) != 3 {
		fmt.Fprintln(os.Stderr, "chaos child: bad", childEnv, spec)
		os.Exit(2)
	}
	ttl, err := time.ParseDuration(parts[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos child:", err)
		os.Exit(2)
	}
	var nodes []redis.UniversalClient
	for _, a := range strings.Split(parts[0], ",") {
		nodes = append(nodes, redis.NewClient(&redis.Options{Addr: a, ContextTimeoutEnabled: true}))
	}
	c, err := redlock.New(nodes, redlock.WithTTL(ttl))
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos child:", err)
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if l, err := c.Lock(ctx, parts[1]); err == nil {
		_ = l.Unlock(context.Background())
	}
	_ = c.Close()
	os.Exit(0)
}

// frozen is the frozen-waiter nemesis: one child process at a time (its
// own Client, like another host's) waits in Lock on resource r0, is frozen
// with SIGSTOP once it has had time to queue — its connections stay open,
// so the nodes count it as listening and a release hands it the key — for
// longer than the TTL, then resumed, and left to finish. The
// workers' next hold after a release must not wait for more than one
// reservation (plus a retry delay): the check is CheckOptions.WaitBound.
func (n *nemesis) frozen(ctx context.Context) {
	ttl := n.e.cfg.TTL
	res := reservation(ttl)
	exe, err := os.Executable()
	if err != nil {
		n.e.logf("chaos: frozen waiter: %v", err)
		return
	}
	addrs := make([]string, n.e.cfg.Nodes)
	for i := range addrs {
		addrs[i] = n.e.cluster.ServerAddr(i)
	}
	for sleepCtx(ctx, randDur(n.rng, res, 3*res)) {
		child := exec.Command(exe, "-test.run=^$")
		child.Env = append(os.Environ(), childEnv+"="+strings.Join(addrs, ",")+";"+resourceName(0)+";"+ttl.String())
		if err := child.Start(); err != nil {
			n.e.logf("chaos: frozen waiter: %v", err)
			return
		}
		done := make(chan struct{})
		go func() { child.Wait(); close(done) }()
		// Time to connect, subscribe and queue behind the workers.
		sleepCtx(ctx, randDur(n.rng, res/2, res))
		start := time.Now()
		if child.Process.Signal(syscall.SIGSTOP) == nil {
			// Longer than the TTL: a grantee handed the key for its TTL
			// (no reservation) would hold up the others for all of it.
			sleepCtx(ctx, randDur(n.rng, ttl+res, ttl+2*res))
			child.Process.Signal(syscall.SIGCONT)
		}
		n.e.hist.fault(Fault{Kind: KindFrozenWaiter, Client: -1, Start: start, End: time.Now()})
		select {
		case <-done:
		case <-time.After(4 * ttl):
			child.Process.Kill()
			<-done
		}
	}
}

// reservation is the library's handoff reservation for the workers'
// options (the defaults with the run's TTL; see WithWakeUp).
func reservation(ttl time.Duration) time.Duration {
	nt := nodeTimeout(ttl)
	const retryMax = 250 * time.Millisecond // redlock.DefaultRetryMax
	return min(max(2*nt, 2*retryMax+nt), ttl/2)
}

// frozenProfile is the frozen-waiter profile.
func frozenProfile() Profile {
	return Profile{
		Name: "frozen-waiter", Safe: true, Share: 0.1, MinTTLs: 4,
		About: "all clients on one resource, always someone queued; a child process waiting in Lock is frozen (SIGSTOP, connections open) for longer than the TTL, then resumed: after every release, the next hold must begin within one reservation, a retry delay and the slack",
		adjust: func(c *Config) {
			c.Fenced = true
			c.Resources = 1
			// A TTL long against the reservation (6s: reservation 1.2s),
			// so that a grantee holding the key for its TTL, as before
			// the reservation, shows as a slow handover; short holds, so
			// that the lock changes hands often.
			c.TTL = max(c.TTL, 6*time.Second)
			c.HoldMin, c.HoldMax = 0, c.TTL/20
			c.WaitBound = reservation(c.TTL) + 250*time.Millisecond + 2*nodeTimeout(c.TTL)
		},
		run: func(ctx context.Context, e *env) error {
			return runWorkers(ctx, e, func(ctx context.Context, n *nemesis) { n.frozen(ctx) })
		},
	}
}
