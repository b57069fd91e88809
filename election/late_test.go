package election_test

import (
	"bufio"
	"context"
	"errors"
	"net"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/election"
	"github.com/quorumlock/quorumlock/internal/redistest"
	"github.com/quorumlock/quorumlock/internal/testhooks"
	"github.com/quorumlock/quorumlock/redlock"
)

// monitorLog is what a server ran, as MONITOR reports it, one line per
// command, read directly from the server (not through the proxy).
type monitorLog struct {
	conn net.Conn
	done chan struct{} // closed when the reader has returned

	mu    sync.Mutex // protects lines
	lines []string
}

// startMonitor starts a MONITOR on the server at addr; t.Cleanup stops it
// and waits for its reader.
func startMonitor(t *testing.T, addr string) *monitorLog {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("MONITOR %s: %v", addr, err)
	}
	m := &monitorLog{conn: conn, done: make(chan struct{})}
	t.Cleanup(func() { conn.Close(); <-m.done })
	rd := bufio.NewReader(conn)
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte("MONITOR\r\n")); err != nil {
		close(m.done)
		t.Fatalf("MONITOR %s: %v", addr, err)
	}
	if ok, err := rd.ReadString('\n'); err != nil || ok != "+OK\r\n" {
		close(m.done)
		t.Fatalf("MONITOR %s = %q, %v; want +OK", addr, ok, err)
	}
	_ = conn.SetDeadline(time.Time{}) // Cleanup's Close ends the reader
	go func() {
		defer close(m.done)
		for {
			line, err := rd.ReadString('\n')
			if err != nil {
				return
			}
			m.mu.Lock()
			m.lines = append(m.lines, line)
			m.mu.Unlock()
		}
	}()
	return m
}

// find returns the indexes of the lines matching re that contain s.
func (m *monitorLog) find(re *regexp.Regexp, s string) []int {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []int
	for i, l := range m.lines {
		if re.MatchString(l) && strings.Contains(l, s) {
			out = append(out, i)
		}
	}
	return out
}

// TestTerm_resignAfterLateProclaim checks that an identity write of the
// term's refresh that lands after Resign's withdraw writes nothing. The
// refresh decides at a majority and leaves its slow write running; that
// write used to land between the withdraw and the release (the lock key
// still ours), set the identity again with the key's remaining TTL, and
// outlive the release: a resigned leader shown for up to a TTL.
//
// Node 2 is delayed (400ms each way) while the term refreshes its identity
// after a renewal (seen on node 0: the identity's TTL jumps up), then not
// delayed any more, so that Resign's withdraw reaches node 2 before the
// refresh's write queued there; node 2's release is held (ReleasePause)
// until that write has run there. Node 2's MONITOR shows the order: an
// attempt where the write ran before the withdraw (its request was read by
// the proxy only after the delay was lifted) did not play the case, and is
// made again with a new term. Once it did, no node may hold the identity.
func TestTerm_resignAfterLateProclaim(t *testing.T) {
	rc := redistest.Start(t, 3)
	const name = "late-proclaim"
	lockKey := redlock.DefaultKeyPrefix + name
	idKey := lockKey + election.LeaderSuffix
	q := regexp.QuoteMeta
	proclaimRe := regexp.MustCompile(`"eval" .*"\d+" "` + q(lockKey) + `" "` + q(idKey) + `"`)
	withdrawRe := regexp.MustCompile(`"eval" .*"\d+" "` + q(idKey) + `"`)
	mon := startMonitor(t, rc.ServerAddr(2))
	// A node timeout of 1.8s (3/10 of the TTL), so that node 2's 800ms
	// round trips time out nowhere; renewals every 2s (TTL/3).
	nodes := rc.Clients()
	c := candidateOn(t, nodes, name, "a", []redlock.Option{redlock.WithTTL(6 * time.Second), redlock.WithNodeTimeout(1800 * time.Millisecond)})
	ctx := context.Background()

	var hold atomic.Pointer[chan struct{}] // node 2's release waits for it to close
	pause := func(key string, node int) {
		if h := hold.Load(); h != nil && key == lockKey && node == 2 {
			select {
			case <-*h:
			case <-time.After(30 * time.Second):
			}
		}
	}
	testhooks.ReleasePause.Store(&pause)
	defer testhooks.ReleasePause.Store(nil)

	const attempts = 5
	for attempt := 1; ; attempt++ {
		term, err := c.e.Campaign(ctx)
		if err != nil {
			t.Fatalf("Campaign: %v", err)
		}
		h := make(chan struct{})
		hold.Store(&h)
		id := term.Leader().Term // in the identity value of every write and withdraw of the term

		// Idle connections to node 2 first: a request on a new one would
		// wait for its handshake (HELLO) behind the delay, and go out
		// only after the delay is lifted.
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() { _ = nodes[2].Ping(ctx).Err() })
		}
		wg.Wait()
		rc.SetLatency(2, 400*time.Millisecond)
		admin0 := rc.Admin(0)
		last := admin0.PTTL(ctx, idKey).Val()
		// The first renewal comes after 2s, the refresh within a quarter
		// of the node timeout after it.
		if !eventually(20*time.Second, func() bool {
			p := admin0.PTTL(ctx, idKey).Val()
			up := p > last
			last = p
			return up
		}) {
			t.Fatal("the identity was not written again on node 0 within 20s")
		}
		rc.SetLatency(2, 0)
		resigned := make(chan error, 1)
		go func() { resigned <- term.Resign(ctx) }()

		// The refresh's write (the term's second) and the withdraw have
		// both run on node 2.
		var late, withdrawn int
		ran := eventually(10*time.Second, func() bool {
			p, w := mon.find(proclaimRe, id), mon.find(withdrawRe, id)
			if len(p) < 2 || len(w) == 0 {
				return false
			}
			late, withdrawn = p[len(p)-1], w[0]
			return true
		})
		close(h)
		select {
		case err := <-resigned:
			if err != nil {
				t.Fatalf("Resign: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("Resign did not return within 20s")
		}
		if !ran {
			t.Fatal("the refresh's write and the withdraw did not both run on node 2 within 10s")
		}
		if late < withdrawn {
			if attempt == attempts {
				t.Fatalf("in %d attempts the refresh's write never ran on node 2 after the withdraw: the case was not played", attempts)
			}
			t.Logf("attempt %d: the refresh's write ran on node 2 before the withdraw; again", attempt)
			continue
		}
		for i := range rc.N() {
			if v, err := rc.Admin(i).Get(ctx, idKey).Result(); !errors.Is(err, redis.Nil) {
				t.Errorf("node %d: GET %s = %q, %v after Resign; want no identity", i, idKey, v, err)
			}
		}
		if l, err := c.e.Leader(ctx); !errors.Is(err, election.ErrNoLeader) {
			t.Errorf("Leader() = %+v, %v after Resign; want ErrNoLeader", l, err)
		}
		return
	}
}
