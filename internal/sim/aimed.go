package sim

import (
	"bytes"
	"context"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/quorumlock/quorumlock/internal/scripts"
	"github.com/quorumlock/quorumlock/redlock"
)

// Faults aimed at issue 30's late requests (items 2 and 5), drawn from a
// generator of their own (drawAimed) so that the plans drawn before stay
// those of their seeds:
//
//   - an Extend in flight across a Detach (Plan.DetachLag): in half the
//     hand-overs of the Detach/Resume workload, the holder's links to one
//     or two nodes are slowed by DetachLag each way while it sends an
//     Extend, and it Detaches at once; the resumer Unlocks within 20ms.
//     Detach must wait out the Extend (it lands within its round), else
//     it lands after the resumer's release and sets the key again;
//   - yields held in the network (Plan.YieldHold): every Client's yields
//     (a release carrying a ticket, redlock/retry.go settle) are held on
//     their way to every node for longer than any guard lives. The
//     library must refuse them by their not-after bound; without it, a
//     held yield queues a token given up again, and a release hands it
//     the key (key-back, counted from the yield's sending).
//
// Neither gives the key-back check an allowance: both are recorded as
// spikes (faultLog: spurious-loss only).

// drawAimed draws the faults aimed at issue 30's late requests.
func (p *Plan) drawAimed(r *rand.Rand) {
	if r.IntN(2) == 0 {
		p.DetachLag = 7*p.NodeTimeout/10 + time.Duration(r.Int64N(int64(3*p.NodeTimeout/10)))
	}
	// In every seed: yields are rare (a queued waiter's split vote), and
	// the gate costs nothing where none is sent.
	{
		// Past the guard (a few node timeouts) and long enough that the
		// key a release hands the requeued token lasts past half a TTL
		// from the yield's sending: held 12-16 node timeouts, the key
		// lasts a queue entry's life (2 retry delays and 4 node
		// timeouts) and a reservation after it lands.
		p.YieldHold = 12*p.NodeTimeout + time.Duration(r.Int64N(int64(4*p.NodeTimeout)))
	}
}

// yieldGate holds the yields of every Client (Plan.YieldHold).
type yieldGate struct {
	mu   sync.Mutex
	hold time.Duration // 0: off
}

var releaseSHA = []byte(scripts.ReleaseHash())

func (g *yieldGate) set(hold time.Duration) {
	g.mu.Lock()
	g.hold = hold
	g.mu.Unlock()
}

// delay is how long the gate holds chunk b: its hold if b carries a
// yield, else 0.
func (g *yieldGate) delay(b []byte) time.Duration {
	g.mu.Lock()
	d := g.hold
	g.mu.Unlock()
	if d == 0 || !bytes.Contains(b, releaseSHA) || !carriesYield(b) {
		return 0
	}
	return d
}

// carriesYield reports whether chunk b (RESP requests) holds an EVALSHA of
// the release script with a ticket (ARGV[5], scripts.ReleaseArgs): a yield.
func carriesYield(b []byte) bool {
	for len(b) > 0 {
		args, rest, ok := respCommand(b)
		if !ok {
			return false
		}
		b = rest
		if len(args) < 3 || !bytes.EqualFold(args[0], []byte("evalsha")) || !bytes.Equal(args[1], releaseSHA) {
			continue
		}
		nk, err := strconv.Atoi(string(args[2]))
		if err != nil || nk < 0 {
			continue
		}
		if i := 3 + nk + 4; i < len(args) && len(args[i]) > 0 {
			return true
		}
	}
	return false
}

// respCommand reads one RESP array of bulk strings from b.
func respCommand(b []byte) (args [][]byte, rest []byte, ok bool) {
	line := func() ([]byte, bool) {
		i := bytes.Index(b, []byte("\r\n"))
		if i < 0 {
			return nil, false
		}
		l := b[:i]
		b = b[i+2:]
		return l, true
	}
	l, ok := line()
	if !ok || len(l) < 2 || l[0] != '*' {
		return nil, nil, false
	}
	n, err := strconv.Atoi(string(l[1:]))
	if err != nil || n < 0 {
		return nil, nil, false
	}
	for range n {
		l, ok := line()
		if !ok || len(l) < 2 || l[0] != '$' {
			return nil, nil, false
		}
		m, err := strconv.Atoi(string(l[1:]))
		if err != nil || m < 0 || len(b) < m+2 {
			return nil, nil, false
		}
		args = append(args, b[:m])
		b = b[m+2:]
	}
	return args, b, true
}

// holdYields is the yield gate's episode: over the fault phase, every
// yield is held YieldHold on its way.
func (p *LockProfile) holdYields(env *Env) {
	pl := env.Plan
	from, to := time.Now(), env.At(pl.FaultPhase)
	env.faults.add(Fault{Kind: LinkSpike}, from, to.Add(pl.YieldHold))
	env.cl.net.yields.set(pl.YieldHold)
	env.History.Note("yields held %v until %v", pl.YieldHold, env.History.since(to))
	env.SleepUntil(to)
	env.cl.net.yields.set(0)
}

// extendInFlight starts an Extend of l while the links of client c to
// one or two nodes are slowed by the plan's DetachLag each way, and
// returns once it was sent (the slowed links hold it) with its end to
// wait for. The slowing is undone at once: the chunks read meanwhile keep
// their delay.
func extendInFlight(env *Env, r *rand.Rand, c int, l *redlock.Lock, ctx context.Context) (wait func()) {
	pl := env.Plan
	n := env.cl.net
	slowed := r.Perm(pl.Nodes)[:1+r.IntN(2)]
	from := time.Now()
	before := make([]time.Duration, len(slowed))
	for k, i := range slowed {
		n.mu.Lock()
		before[k] = n.delay[c][i] // a delay fault of the plan's, restored below
		n.mu.Unlock()
		n.setDelay(c, i, before[k]+pl.DetachLag)
		env.faults.add(Fault{Kind: LinkSpike, Client: c, Node: i}, from, from.Add(2*pl.DetachLag))
	}
	env.History.Note("c%d extends hold of %s before its Detach, links to %v slowed %v", c, l.Token()[:8], slowed, pl.DetachLag)
	done := make(chan struct{})
	env.Go(func() {
		defer close(done)
		_ = l.Extend(context.WithoutCancel(ctx))
	})
	// In the bubble, a sleep returns once every goroutine is blocked:
	// the Extend's requests were written and read by the forwarders.
	runtime.Gosched()
	time.Sleep(time.Microsecond)
	for k, i := range slowed {
		n.setDelay(c, i, before[k])
	}
	return func() { <-done }
}
