package redlock

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/redistest"
)

// A node that did not answer PING before the deadline is a deadline error,
// whichever of go-redis's two reports of it came first: ctx's error, or
// the socket's "i/o timeout", armed for the same instant (under load the
// latter came first, and TestDial_pingBoundedByCtx got an error that did
// not match context.DeadlineExceeded: issue 44).
func TestDial_silentNodeIsDeadlineWhateverGoRedisSays(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), time.Millisecond)
	defer cancel()
	<-ctx.Done()
	start := time.Now().Add(-time.Millisecond)
	sockets := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
	err := silentUntil(ctx, ctx, start, sockets)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "caller's deadline") {
		t.Errorf("silentUntil(i/o timeout after the caller's deadline) = %v; want a deadline error naming the caller's deadline", err)
	}
	// Before the deadline an i/o timeout is go-redis's own (a read_timeout
	// shorter than the node timeout), and a refusal is a refusal.
	live, cancelLive := context.WithTimeout(t.Context(), time.Hour)
	defer cancelLive()
	if err := silentUntil(live, live, start, sockets); err != sockets {
		t.Errorf("silentUntil(i/o timeout before the deadline) = %v; want it unchanged", err)
	}
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	if err := silentUntil(ctx, ctx, start, refused); err != refused {
		t.Errorf("silentUntil(refused) = %v; want it unchanged", err)
	}
}

// Nodes that refuse connections are reported as refusing them, at once:
// go-redis's default of 5 dial attempts 100ms apart, in each of its 4
// tries, made Dial wait out the whole node timeout and report "context
// deadline exceeded" (issue 44). Dial now builds clients that dial once.
func TestDial_refusedNodesReportedAtOnce(t *testing.T) {
	t.Parallel()
	const nodeTimeout = 3 * time.Second
	urls := []string{"redis://" + deadAddr(t), "redis://" + deadAddr(t), "redis://" + deadAddr(t)}
	start := time.Now()
	_, err := Dial(t.Context(), urls, WithTTL(time.Minute), WithNodeTimeout(nodeTimeout))
	took := time.Since(start)
	if !errors.Is(err, ErrNoQuorum) || !errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Dial to refusing nodes = %v; want ErrNoQuorum with the refusals, no deadline", err)
	}
	// 0.1s here (go-redis's own retries of the dial, 8-512ms apart); 1.7s
	// before with this node timeout (the whole node timeout with the
	// default 1s).
	if took >= time.Second {
		t.Errorf("Dial to refusing nodes took %v; want less than 1s", took)
	}
}

// A node that refuses the client's credentials is reported as such in a
// lock's node errors, not as a failure to learn its clock: TIME is the
// first request on a connection, and its handshake is what failed
// (issue 44). Real nodes, with requirepass set after they started.
func TestNew_wrongPasswordNamedInNodeErrors(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	for i := range rc.N() {
		if err := rc.Admin(i).ConfigSet(t.Context(), "requirepass", "s3cret").Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct{ name, password, reply string }{
		{"wrong password", "wrong", "WRONGPASS"},
		{"no password", "", "NOAUTH"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var nodes []redis.UniversalClient
			for i := range rc.N() {
				cl := redis.NewClient(&redis.Options{Addr: rc.Addr(i), Password: tc.password, ContextTimeoutEnabled: true, MaxRetries: -1})
				t.Cleanup(func() { cl.Close() })
				nodes = append(nodes, cl)
			}
			c, err := New(nodes)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			_, err = c.TryLock(t.Context(), "auth")
			var ne *NodeError
			if !errors.As(err, &ne) || !redis.HasErrorPrefix(ne.Err, tc.reply) {
				t.Fatalf("TryLock = %v; want a *NodeError with the node's %s reply", err, tc.reply)
			}
			if msg := err.Error(); !strings.Contains(msg, "authentication refused") || strings.Contains(msg, "clock") || strings.Contains(msg, "TIME") {
				t.Errorf("TryLock = %q; want the node errors to name authentication, not the clock", msg)
			}
		})
	}
}

// A node that rejects the client's credentials is not said to have
// "refused the connection", which is what a closed port says (and what
// TestDial_refusedNodesReportedAtOnce sees): qlock printed both alike.
func TestDial_rejectedCredentialsNotCalledRefused(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 1)
	if err := rc.Admin(0).ConfigSet(t.Context(), "requirepass", "s3cret").Err(); err != nil {
		t.Fatal(err)
	}
	_, err := Dial(t.Context(), []string{"redis://:wrong@" + rc.Addr(0)})
	if err == nil || strings.Contains(err.Error(), "refused") || !strings.Contains(err.Error(), "credentials") || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Errorf("Dial with a wrong password = %v; want it to name the credentials and WRONGPASS, not a refusal", err)
	}
}
