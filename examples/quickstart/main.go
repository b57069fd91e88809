// Command quickstart tells the story this library comes from: a job that
// runs longer than its lock's TTL. The watchdog renews the lease on every
// node each TTL/3, so the job keeps the lock; a second worker is refused
// meanwhile; two nodes fail and the lock holds on the other three; a third
// fails, and the job is told it lost the lock — through its context, with
// the cause — before its validity ran out; when the nodes are back, the
// second worker takes over.
//
// By default it runs on 5 embedded in-process Redis nodes (miniredis, TTLs
// in real time). With -addrs it uses your Redis nodes instead; node failures
// are then simulated by cutting connections through a local proxy.
//
//	go run ./examples/quickstart
//	go run ./examples/quickstart -addrs 127.0.0.1:6379,127.0.0.1:6380,127.0.0.1:6381,127.0.0.1:6382,127.0.0.1:6383
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/redistest"
	"github.com/quorumlock/quorumlock/redlock"
)

func main() {
	addrs := flag.String("addrs", "", "comma-separated Redis addresses (default: 5 embedded nodes)")
	ttl := flag.Duration("ttl", 3*time.Second, "lock TTL")
	flag.Parse()
	if err := run(*addrs, *ttl); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

var start = time.Now()

func say(format string, args ...any) {
	fmt.Printf("[%5.2fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
}

// cluster is the nodes behind proxies that can cut them off, as if they died.
type cluster struct {
	servers []*miniredis.Miniredis
	proxies []*redistest.Proxy
	clients []redis.UniversalClient
}

func newCluster(addrs string) (*cluster, error) {
	var targets []string
	c := &cluster{}
	if addrs == "" {
		for range 5 {
			m := miniredis.NewMiniRedis()
			m.ClockTTL(true) // keys expire in real time, as on Redis
			if err := m.Start(); err != nil {
				c.close()
				return nil, err
			}
			c.servers = append(c.servers, m)
			targets = append(targets, m.Addr())
		}
	} else {
		targets = strings.Split(addrs, ",")
	}
	for _, t := range targets {
		p, err := redistest.NewProxy(strings.TrimSpace(t))
		if err != nil {
			c.close()
			return nil, err
		}
		c.proxies = append(c.proxies, p)
		c.clients = append(c.clients, redis.NewClient(&redis.Options{
			Addr:                  p.Addr(),
			ContextTimeoutEnabled: true, // a node timeout also frees the connection
			MaxRetries:            -1,
			DialTimeout:           200 * time.Millisecond,
		}))
	}
	return c, nil
}

func (c *cluster) close() {
	for _, cl := range c.clients {
		cl.Close()
	}
	for _, p := range c.proxies {
		p.Close()
	}
	for _, m := range c.servers {
		m.Close()
	}
}

// holders counts the nodes holding token under key (read through the
// proxies, so nodes that are cut count as not holding).
func (c *cluster) holders(key, token string) int {
	n := 0
	for _, cl := range c.clients {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		if v, err := cl.Get(ctx, key).Result(); err == nil && v == token {
			n++
		}
		cancel()
	}
	return n
}

func run(addrs string, ttl time.Duration) error {
	redis.SetLogger(quiet{}) // cut nodes would fill the screen with dial errors
	c, err := newCluster(addrs)
	if err != nil {
		return err
	}
	defer c.close()
	where := "5 embedded nodes (miniredis)"
	if addrs != "" {
		where = fmt.Sprintf("%d nodes at %s", len(c.clients), addrs)
	}

	workerA, err := redlock.New(c.clients, redlock.WithTTL(ttl))
	if err != nil {
		return err
	}
	defer workerA.Close()
	workerB, err := redlock.New(c.clients, redlock.WithTTL(ttl))
	if err != nil {
		return err
	}
	defer workerB.Close()

	ctx := context.Background()
	const resource = "order:1234"
	key := redlock.DefaultKeyPrefix + resource

	say("worker A locks %q on %s, TTL %v, renewed every %v", resource, where, ttl, ttl/3)
	lock, err := workerA.Lock(ctx, resource)
	if err != nil {
		return fmt.Errorf("worker A: %w", err)
	}
	time.Sleep(50 * time.Millisecond) // the slowest node answers in the background
	say("worker A holds it on %d of %d nodes; valid for %v", c.holders(key, lock.Token()), len(c.clients), time.Until(lock.ValidUntil()).Round(time.Millisecond))

	// The job: it would take 4 TTLs, far longer than one lease.
	job := make(chan error, 1)
	go func() {
		job <- work(lock.Context(), 4*ttl)
	}()

	step := func(d time.Duration) {
		time.Sleep(d)
		say("job running; lease renewed, valid for %v more; lock valid: %v",
			time.Until(lock.ValidUntil()).Round(100*time.Millisecond), lock.Valid())
	}
	step(ttl / 2)
	_, err = workerB.TryLock(ctx, resource)
	say("worker B tries the same lock: %v", describe(err))
	step(ttl)
	say("past the first TTL (%v): still held, because the watchdog renews it", ttl)

	c.proxies[0].Cut()
	c.proxies[1].Cut()
	say("nodes 0 and 1 go down")
	step(ttl / 2)
	say("renewals are confirmed by %d of 5 nodes, a majority: the lock holds", c.holders(key, lock.Token()))
	step(ttl / 2)

	lastValid := lock.ValidUntil()
	c.proxies[2].Cut()
	downAt := time.Now()
	say("node 2 goes down: only 2 of 5 nodes remain")
	select {
	case <-lock.Lost():
	case <-time.After(2 * ttl):
		return errors.New("the lock was not reported lost")
	}
	say("LOST %v after the majority went down, at the lease's validity deadline (%+dms), before its keys can expire on the nodes",
		time.Since(downAt).Round(time.Millisecond), time.Since(lastValid).Milliseconds())
	err = <-job
	cause := strings.ReplaceAll(context.Cause(lock.Context()).Error(), "\n", "\n          ")
	say("job stopped: %v; cause:\n          %s", err, cause)

	for _, p := range c.proxies[:3] {
		p.Heal()
	}
	say("nodes 0, 1 and 2 are back; worker B waits for the old lease to expire")
	lockB, err := workerB.Lock(ctx, resource, redlock.WithRetryDelay(50*time.Millisecond, 150*time.Millisecond))
	if err != nil {
		return fmt.Errorf("worker B: %w", err)
	}
	say("worker B takes over (valid: %v)", lockB.Valid())
	err = lock.Unlock(ctx)
	say("worker A's late Unlock: %s — it deletes only what is left of its own keys; B still holds the lock on %d nodes",
		describe(err), c.holders(key, lockB.Token()))
	if err := lockB.Unlock(ctx); err != nil {
		return fmt.Errorf("worker B unlock: %w", err)
	}
	say("worker B unlocks; nodes holding the key: %d", c.holders(key, lockB.Token()))
	return nil
}

// work pretends to process an order for d, in steps, and stops as soon as
// ctx is done: the lock's context, cancelled when the lock is lost.
func work(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func describe(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, redlock.ErrNotObtained):
		return "refused (ErrNotObtained: another owner holds it)"
	case errors.Is(err, redlock.ErrNotHeld):
		return "ErrNotHeld (no node holds its token)"
	}
	return err.Error()
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}
