// Command quickstart tells the story this library comes from: a job that
// runs longer than its lock's TTL. The watchdog renews the lease on every
// node each TTL/3, so the job keeps the lock; a second worker is refused
// meanwhile; two nodes fail and the lock holds on the other three; a third
// fails, and the job is told it lost the lock — through its context, with
// the cause — before its validity ran out; when the nodes are back, the
// second worker takes over.
//
// By default it runs on 5 embedded in-process Redis nodes (miniredis, TTLs
// in real time). With -addrs it uses your Redis nodes instead. Either way
// the clients reach each node through a small TCP proxy of this program's
// own (proxy.go), which cuts the connections to simulate a node failure.
// It imports nothing from this repository but the public redlock package,
// so it builds in any module.
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
	"slices"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/logging"

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
	proxies []*proxy
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
		p, err := newProxy(strings.TrimSpace(t))
		if err != nil {
			c.close()
			return nil, err
		}
		c.proxies = append(c.proxies, p)
		c.clients = append(c.clients, redis.NewClient(&redis.Options{
			Addr:                  p.Addr(),
			ContextTimeoutEnabled: true, // a node timeout also frees the connection
			// No go-redis retries: a refused dial then proves that the
			// request was never sent, so nothing of it can land later
			// (internal/node TestDo_refusedDialIsUnsentOnlyWithoutRetries).
			MaxRetries:  -1,
			DialTimeout: 200 * time.Millisecond,
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

// holding lists the nodes holding token under key (read through the
// proxies, so nodes that are cut count as not holding).
func (c *cluster) holding(key, token string) []int {
	var nodes []int
	for i, cl := range c.clients {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		if v, err := cl.Get(ctx, key).Result(); err == nil && v == token {
			nodes = append(nodes, i)
		}
		cancel()
	}
	return nodes
}

func (c *cluster) holders(key, token string) int { return len(c.holding(key, token)) }

// up lists the nodes that answer PING (through the proxies).
func (c *cluster) up() []int {
	var nodes []int
	for i, cl := range c.clients {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		if cl.Ping(ctx).Err() == nil {
			nodes = append(nodes, i)
		}
		cancel()
	}
	return nodes
}

// values reads key on every node: its value, or "" when absent or when the
// node does not answer.
func (c *cluster) values(key string) []string {
	vals := make([]string, len(c.clients))
	for i, cl := range c.clients {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		vals[i], _ = cl.Get(ctx, key).Result()
		cancel()
	}
	return vals
}

// settled reads key on every node until done holds for what it read, for
// at most a second, and returns the last read: Unlock returns once a
// majority answered, and its other releases land just after, in the
// background.
func (c *cluster) settled(key string, done func(vals []string) bool) []string {
	deadline := time.Now().Add(time.Second)
	for {
		vals := c.values(key)
		if done(vals) || time.Now().After(deadline) {
			return vals
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// whose splits the nodes by what vals says they hold: b's token, a's, or
// neither.
func whose(vals []string, b, a string) (heldB, heldA, neither []int) {
	for i, v := range vals {
		switch v {
		case b:
			heldB = append(heldB, i)
		case a:
			heldA = append(heldA, i)
		default:
			neither = append(neither, i)
		}
	}
	return heldB, heldA, neither
}

// note prints an explanation under the line before it.
func note(format string, args ...any) {
	text := fmt.Sprintf(format, args...)
	fmt.Println("          " + strings.ReplaceAll(text, "\n", "\n          "))
}

func run(addrs string, ttl time.Duration) error {
	// A cut node makes go-redis log every failed dial; this program prints
	// what matters itself.
	redis.SetLogger(&logging.VoidLogger{})
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

	// Every call that can wait is bounded: Lock retries until its ctx is
	// done (by default it never gives up on its own).
	ctx, cancel := context.WithTimeout(context.Background(), 30*ttl)
	defer cancel()
	const resource = "order:1234"
	key := redlock.DefaultKeyPrefix + resource
	n := len(c.clients)

	say("worker A locks %q on %s, TTL %v, renewed every %v", resource, where, ttl, ttl/3)
	var proxies []string
	for i, p := range c.proxies {
		proxies = append(proxies, fmt.Sprintf("node %d = %s", i, p.Addr()))
	}
	note("%s\n(each address is a local proxy in front of a node, not the node itself: the\nproxy can cut the node off as if it died; errors below name these addresses)",
		strings.Join(proxies, ", "))
	sent := time.Now()
	lock, err := workerA.Lock(ctx, resource)
	if err != nil {
		return fmt.Errorf("worker A: %w", err)
	}
	round := time.Since(sent)
	time.Sleep(50 * time.Millisecond) // the slowest node answers in the background
	left := time.Until(lock.ValidUntil())
	drift := time.Duration(float64(ttl)*redlock.DefaultDriftFactor) + 2*time.Millisecond
	say("worker A holds it on %d of %d nodes; valid for %v", c.holders(key, lock.Token()), n, left.Round(time.Millisecond))
	note("why not %v: validity = TTL %v − drift allowance %v (TTL × %v + 2ms, for clocks that run at\n"+
		"slightly different rates) − %v elapsed since A sent its first request (the acquire round\n"+
		"took %v; the rest passed before this line). The end of it is the validity deadline,\n"+
		"lock.ValidUntil(): a local clock reading before which no other client can hold the lock,\n"+
		"because no key of A's can have expired on any node before then.",
		ttl, ttl, drift, redlock.DefaultDriftFactor, (ttl - drift - left).Round(time.Millisecond), round.Round(100*time.Microsecond))

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
	note("each renewal re-arms the key on every node and moves the validity deadline to\n" +
		"its own start + TTL − drift allowance")

	c.proxies[0].Cut()
	c.proxies[1].Cut()
	say("nodes 0 and 1 go down")
	step(ttl / 2)
	say("renewals are confirmed by %d of %d nodes, a majority: the lock holds", c.holders(key, lock.Token()), n)
	step(ttl / 2)

	lastValid := lock.ValidUntil()
	c.proxies[2].Cut()
	downAt := time.Now()
	say("node 2 goes down: only %d of %d nodes remain", n-3, n)
	select {
	case <-lock.Lost():
	case <-time.After(2 * ttl):
		return errors.New("the lock was not reported lost")
	}
	say("LOST %v after the majority went down, at the lease's validity deadline (%+dms)",
		time.Since(downAt).Round(time.Millisecond), time.Since(lastValid).Milliseconds())
	note("no renewal reached a majority, so the deadline set by the last one that did was not\n"+
		"moved: A is told then, %v (the drift allowance) before its keys can expire on the nodes\n"+
		"and another client can take the lock", drift)
	err = <-job
	cause := strings.ReplaceAll(context.Cause(lock.Context()).Error(), "\n", "\n          ")
	say("job stopped: %v; cause:\n          %s", err, cause)
	note("\"confirmed\" counts the answers that came in before that round was decided: once 3\n"+
		"nodes had failed, no majority was possible, so it stopped waiting for the others\n"+
		"(\"not waited for\"). Nodes up now (they answer PING): %v", c.up())

	for _, p := range c.proxies[:3] {
		p.Heal()
	}
	say("nodes 0, 1 and 2 are back; worker B waits for the old lease to expire")
	lockB, err := workerB.Lock(ctx, resource, redlock.WithRetryDelay(50*time.Millisecond, 150*time.Millisecond))
	if err != nil {
		return fmt.Errorf("worker B: %w", err)
	}
	// One read of every node, so that what the notes say of B's and A's
	// keys is true of one moment.
	vals := c.values(key)
	heldB, heldA, neither := whose(vals, lockB.Token(), lock.Token())
	say("worker B takes over (valid: %v) on nodes %v", lockB.Valid(), heldB)
	if len(heldB) < n {
		note("%d of %d is a majority, which is all B needs: the nodes where A's key had expired\n"+
			"granted B's request.", len(heldB), n)
		if len(heldA) > 0 {
			note("nodes %v still carry A's key, renewed there until the loss: they refused B,\n"+
				"and B's request waited in line there.", heldA)
		}
		if len(neither) > 0 {
			note("nodes %v hold neither key just now (A's expired there after B's request was refused,\n"+
				"or B's request has not been answered there yet); B's watchdog sets its key there.", neither)
		}
	}
	err = lock.Unlock(ctx)
	vals = c.settled(key, func(vals []string) bool { return !slices.Contains(vals, lock.Token()) })
	_, leftA, _ := whose(vals, lockB.Token(), lock.Token())
	say("worker A's late Unlock: %s — it releases only what is left of its own keys; A's keys left on the nodes: %d", describe(err), len(leftA))
	if len(heldA) > 0 {
		note("where A's key was, the release hands the key to B if B's entry is still in line there,\n" +
			"and deletes it otherwise; it never touches B's key. Either way, B's watchdog sets B's key\n" +
			"on every node at its next renewal.")
	}
	time.Sleep(ttl/3 + ttl/10)
	say("after B's next renewal: B holds it on %d of %d nodes", c.holders(key, lockB.Token()), n)
	if err := lockB.Unlock(ctx); err != nil {
		return fmt.Errorf("worker B unlock: %w", err)
	}
	vals = c.settled(key, func(vals []string) bool { return !slices.Contains(vals, lockB.Token()) })
	heldB, _, _ = whose(vals, lockB.Token(), lock.Token())
	say("worker B unlocks; nodes holding the key: %d", len(heldB))
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
