package redistest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"net"
	"os"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// shortCtx bounds a command that is expected to fail, so that a fault which
// makes it hang instead still ends the test quickly.
func shortCtx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

func mustPing(t *testing.T, cl *redis.Client) {
	t.Helper()
	if err := cl.Ping(shortCtx(t, 2*time.Second)).Err(); err != nil {
		t.Fatalf("Ping() = %v; want nil", err)
	}
}

func TestCluster_SetGet(t *testing.T) {
	t.Parallel()
	c := Start(t, 3)

	if got, want := c.N(), 3; got != want {
		t.Errorf("N() = %d; want %d", got, want)
	}
	for i := range c.N() {
		if c.Addr(i) == c.ServerAddr(i) {
			t.Errorf("Addr(%d) = ServerAddr(%d) = %s; want the proxy in front", i, i, c.Addr(i))
		}
	}
	for i, cl := range c.Clients() {
		ctx := t.Context()
		val := "v" + strconv.Itoa(i)
		if err := cl.Set(ctx, "k", val, 0).Err(); err != nil {
			t.Fatalf("node %d: Set() = %v; want nil", i, err)
		}
		if got, err := cl.Get(ctx, "k").Result(); err != nil || got != val {
			t.Errorf("node %d: Get() = %q, %v; want %q, nil", i, got, err, val)
		}
		// Each node is its own server: Admin sees what went through the
		// proxy, and only this node's value.
		if got, err := c.Admin(i).Get(ctx, "k").Result(); err != nil || got != val {
			t.Errorf("node %d: Admin().Get() = %q, %v; want %q, nil", i, got, err, val)
		}
	}
	if first, second := c.Admin(0), c.Admin(0); first != second {
		t.Errorf("Admin(0) returned two clients; want one cached client")
	}
}

func TestCluster_KillRestart(t *testing.T) {
	t.Parallel()
	c := Start(t, 3)
	cl := c.Client(0)
	if err := cl.Set(t.Context(), "k", "v", 0).Err(); err != nil {
		t.Fatalf("Set() = %v; want nil", err)
	}
	addr := c.ServerAddr(0)

	c.Kill(0)
	if err := cl.Ping(shortCtx(t, time.Second)).Err(); err == nil {
		t.Errorf("after Kill: Ping() = nil; want an error")
	}
	if err := c.Admin(0).Ping(shortCtx(t, time.Second)).Err(); err == nil {
		t.Errorf("after Kill: Admin().Ping() = nil; want an error")
	}
	c.Kill(0) // killing a dead node is a no-op
	mustPing(t, c.Client(1))
	// The dead server's address refuses dials, and nobody else can take
	// it: another test's server drawing the port would answer for it.
	if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		conn.Close()
		t.Errorf("after Kill: a dial to the server's address %s succeeded; want it refused", addr)
	} else if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("after Kill: a dial to %s = %v; want ECONNREFUSED", addr, err)
	}
	if ln, err := net.Listen("tcp", addr); err == nil {
		ln.Close()
		t.Errorf("after Kill: %s could be bound by another server; want it reserved until Restart", addr)
	}

	c.Restart(0)
	mustPing(t, cl)
	if got := c.ServerAddr(0); got != addr {
		t.Errorf("after Restart: ServerAddr(0) = %s; want %s, the port reserved since Kill", got, addr)
	}
	if err := cl.Get(t.Context(), "k").Err(); !errors.Is(err, redis.Nil) {
		t.Errorf("after Restart: Get() = %v; want redis.Nil (restarted empty)", err)
	}
	mustPing(t, c.Admin(0))
}

func TestCluster_PauseResume(t *testing.T) {
	t.Parallel()
	c := Start(t, 3)
	cl := c.Client(1)
	mustPing(t, cl)

	c.Pause(1)
	start := time.Now()
	err := cl.Ping(shortCtx(t, 200*time.Millisecond)).Err()
	if err == nil {
		t.Errorf("while paused: Ping() = nil; want an error")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("while paused: Ping() took %v; want it bounded by its 200ms context", d)
	}
	mustPing(t, c.Client(0)) // other nodes are unaffected

	c.Resume(1)
	mustPing(t, cl)
}

func TestCluster_SetLatency(t *testing.T) {
	t.Parallel()
	c := Start(t, 1)
	cl := c.Client(0)
	// Warm the pool first: latency must apply to existing connections, and
	// a new connection would add the HELLO round trip to the measurement.
	mustPing(t, cl)

	const d = 100 * time.Millisecond
	c.SetLatency(0, d)
	if got := minPing(t, cl); got < 2*d || got >= 2*time.Second {
		t.Errorf("with latency %v: Ping() took %v; want [%v, 2s)", d, got, 2*d)
	}

	// Fast again: below the 2*d that any latency left over would add. A
	// tighter bound flakes when many -race tests share the CPUs.
	c.SetLatency(0, 0)
	if got := minPing(t, cl); got >= 2*d {
		t.Errorf("with latency 0: Ping() took %v; want < %v", got, 2*d)
	}
}

// minPing returns the fastest of a few round trips: a lower bound is what
// latency sets, and the minimum filters out scheduling noise when many
// tests share the CPUs.
func minPing(t *testing.T, cl *redis.Client) time.Duration {
	t.Helper()
	fastest := time.Duration(math.MaxInt64)
	for range 3 {
		start := time.Now()
		mustPing(t, cl)
		fastest = min(fastest, time.Since(start))
	}
	return fastest
}

func TestCluster_CutHeal(t *testing.T) {
	t.Parallel()
	c := Start(t, 3)
	cl := c.Client(2)
	mustPing(t, cl) // an existing connection, which Cut must reset

	c.Cut(2)
	if err := cl.Ping(shortCtx(t, time.Second)).Err(); err == nil {
		t.Errorf("after Cut: Ping() = nil; want an error")
	}
	if err := c.Client(2).Ping(shortCtx(t, time.Second)).Err(); err == nil {
		t.Errorf("after Cut: Ping() on a new client = nil; want an error")
	}
	// The server itself is fine: only the path through the proxy is cut.
	mustPing(t, c.Admin(2))

	c.Heal(2)
	mustPing(t, cl)
}

func TestCluster_RestartPortTaken(t *testing.T) {
	t.Parallel()
	c := Start(t, 1)
	cl := c.Client(0)
	mustPing(t, cl)
	old := c.ServerAddr(0)

	c.Kill(0)
	// Another program binds the dead server's port, and accepts.
	ln, err := net.Listen("tcp", old)
	if err != nil {
		t.Skipf("cannot bind %s for the test: %v", old, err)
	}
	defer ln.Close()
	// The proxy must not forward to the stranger: the node is down.
	if err := cl.Ping(shortCtx(t, time.Second)).Err(); err == nil {
		t.Errorf("after Kill, port taken: Ping() = nil; want an error")
	}

	c.Restart(0)
	if got := c.ServerAddr(0); got == old {
		t.Errorf("after Restart: ServerAddr(0) = %s; want a new port, the old one is taken", got)
	}
	mustPing(t, cl)
	mustPing(t, c.Admin(0))
}

func TestCluster_WithArgs(t *testing.T) {
	t.Parallel()
	c := Start(t, 1, WithArgs("--maxmemory", "12345678", "--appendonly", "yes"), WithLogf(t.Logf))
	ctx := t.Context()
	got, err := c.Admin(0).ConfigGet(ctx, "maxmemory").Result()
	if err != nil || got["maxmemory"] != "12345678" {
		t.Errorf("CONFIG GET maxmemory = %v, %v; want 12345678, nil", got, err)
	}
	if err := c.Client(0).Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("Set() = %v; want nil", err)
	}
	// Even with the AOF on, Restart starts empty.
	c.Restart(0)
	if err := c.Client(0).Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
		t.Errorf("after Restart with appendonly: Get() = %v; want redis.Nil", err)
	}
}

func TestStartCluster_Close(t *testing.T) {
	t.Parallel()
	c, err := StartCluster(2)
	if errors.Is(err, ErrNoRedisServer) && os.Getenv("CI") == "" {
		t.Skip(err) // as Start does
	}
	if err != nil {
		t.Fatalf("StartCluster(2) = %v; want nil", err)
	}
	cl := c.Client(0)
	mustPing(t, cl)
	pids := c.pids()
	if got, want := len(pids), 2; got != want {
		t.Fatalf("running servers = %d; want %d", got, want)
	}

	// Failures are recorded, not fatal.
	c.Pause(5)
	c.Kill(1)
	c.Resume(1)
	if err := c.Err(); err == nil {
		t.Errorf("Err() after Pause(5) and Resume of a killed node = nil; want an error")
	}

	// A paused server must not survive Close, nor stay stopped.
	c.Pause(0)
	if err := c.Close(); err != nil {
		t.Errorf("Close() = %v; want nil", err)
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("after Close: kill(%d, 0) = %v; want ESRCH (process gone)", pid, err)
		}
	}
	if _, err := os.Stat(c.dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after Close: Stat(%s) = %v; want ErrNotExist", c.dir, err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close() = %v; want nil", err)
	}
	if err := cl.Ping(t.Context()).Err(); !errors.Is(err, redis.ErrClosed) {
		t.Errorf("after Close: Ping() = %v; want redis.ErrClosed", err)
	}
	if err := c.Client(0).Ping(t.Context()).Err(); !errors.Is(err, redis.ErrClosed) {
		t.Errorf("Client after Close: Ping() = %v; want redis.ErrClosed", err)
	}
}

// echoServer accepts connections and echoes them until the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				io.Copy(c, c)
			})
		}
	})
	return ln.Addr().String()
}

func newTestProxy(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := NewProxy(target)
	if err != nil {
		t.Fatalf("NewProxy() = %v; want nil", err)
	}
	// Close the proxy before the echo server's Cleanup waits for its
	// connections: Cleanups run last-in first-out.
	t.Cleanup(func() { p.Close() })
	return p
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(5 * time.Second))
	return c
}

func TestProxy_Latency(t *testing.T) {
	t.Parallel()
	p := newTestProxy(t, echoServer(t))
	const d = 50 * time.Millisecond
	p.SetLatency(d)
	c := dial(t, p.Addr())

	// Many small writes in a row: each chunk is delayed by d once, on its
	// way there and back. Were the delay applied by sleeping before each
	// write, chunk k would arrive only after k*d, and the last one about
	// n*d after it was sent.
	const n = 40
	var want bytes.Buffer
	start := time.Now()
	for i := range n {
		msg := []byte("chunk " + strconv.Itoa(i) + ";")
		want.Write(msg)
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond) // keep the chunks apart
	}
	lastWrite := time.Now()
	got := make([]byte, want.Len())
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want.Bytes()) {
		t.Errorf("echo = %q; want %q (in order)", got, want.Bytes())
	}
	if elapsed := time.Since(start); elapsed < 2*d {
		t.Errorf("%d chunks took %v; want at least %v", n, elapsed, 2*d)
	}
	if tail := time.Since(lastWrite); tail >= n*d/2 {
		t.Errorf("last chunk came back %v after it was sent; want < %v (latency must not add up per chunk)", tail, n*d/2)
	}
}

func TestProxy_CutHeal(t *testing.T) {
	t.Parallel()
	p := newTestProxy(t, echoServer(t))
	c := dial(t, p.Addr())
	echo := func(c net.Conn) error {
		if _, err := c.Write([]byte("x")); err != nil {
			return err
		}
		_, err := io.ReadFull(c, make([]byte, 1))
		return err
	}
	if err := echo(c); err != nil {
		t.Fatalf("echo before Cut = %v; want nil", err)
	}

	p.Cut()
	if err := echo(c); err == nil {
		t.Errorf("echo on an existing connection after Cut = nil; want an error")
	}
	// A new connection may fail as early as the dial: the reset can arrive
	// before connect(2) reports success.
	if c2, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		defer c2.Close()
		c2.SetDeadline(time.Now().Add(5 * time.Second))
		if err := echo(c2); err == nil {
			t.Errorf("echo on a new connection after Cut = nil; want an error")
		}
	}

	p.Heal()
	if err := echo(dial(t, p.Addr())); err != nil {
		t.Errorf("echo after Heal = %v; want nil", err)
	}
}

func TestProxy_Close(t *testing.T) {
	t.Parallel()
	p := newTestProxy(t, echoServer(t))
	c := dial(t, p.Addr())
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Errorf("Close() = %v; want nil", err)
	}
	// Close has closed the connection and waited for its goroutines.
	if _, err := io.ReadAll(c); err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("read after Close = %v; want EOF or a reset", err)
	}
	if err := p.Close(); err != nil {
		t.Errorf("second Close() = %v; want nil", err)
	}
}
