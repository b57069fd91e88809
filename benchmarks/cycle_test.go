package benchmarks

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/benchmarks/internal/libs"
	"github.com/quorumlock/quorumlock/benchmarks/internal/nodes"
	"github.com/quorumlock/quorumlock/internal/redistest"
)

// TestProtocolCycle runs the handoff protocol bare — today's scripts, then
// the proposal's prototype (docs/fairness.md) — in the clients scenario:
// 8 instances, each with its own connections and wake-up subscriptions,
// Lock+Unlock one key with no hold, on 5 local nodes, beside the library
// and redsync, in interleaved rounds. It logs the nodes' CPU per
// acquisition (INFO cpu) and acquisitions/s, medians over the rounds.
//
// The bare protocol is a small client written for this measurement, not
// the library: each attempt goes to every node, a waiter holds once a
// majority granted it or handed it the key (a message per node), and after
// 250ms without that it gives back what it got and tries again (no clock
// bounds, no renewal, no fencing, no yields in the order). It runs today's
// acquire.lua/release.lua and the prototype with the same client, so that
// the two differ only in their scripts:
//
//	QUORUMLOCK_CYCLE_ROUNDS=5 QUORUMLOCK_CYCLE_SECONDS=3 go test -run TestProtocolCycle -v .
func TestProtocolCycle(t *testing.T) {
	rounds, secs := envInt(t, "QUORUMLOCK_CYCLE_ROUNDS", 1), envInt(t, "QUORUMLOCK_CYCLE_SECONDS", 1)
	rc := redistest.Start(t, 5)
	read := func(path string) string { return readScript(t, path) }
	// Holders of each resource at once, across the bare instances: a
	// second holder is an overlap, counted (the bare client holds only
	// while every key it got is within its reservation, well under the
	// 2s a hold-0 cycle never reaches).
	var overlaps bareOverlaps
	queue, serve := oldScript(t, "queue.lua"), read("testdata/proposal/serve.lua")
	variants := []libs.Lib{
		{Name: "bare today", Waits: true, New: newBare(&todayScripts{
			acq: redis.NewScript(queue + oldScript(t, "acquire.lua")),
			rel: redis.NewScript(queue + oldScript(t, "release.lua")),
		}, &overlaps)},
		{Name: "bare proposal", Waits: true, New: newBare(&proposalScripts{
			acq: redis.NewScript(serve + read("testdata/proposal/acquire.lua")),
			rel: redis.NewScript(serve + read("testdata/proposal/release.lua")),
		}, &overlaps)},
	}
	for _, name := range []string{"quorumlock", "redsync"} {
		l, _ := libs.ByName(name)
		variants = append(variants, l)
	}
	type result struct{ rate, cpu, toOther float64 }
	results := map[string][]result{}
	for round := range rounds {
		for _, v := range variants {
			before := nodesCPU(t, rc)
			r := runCrossClient(t, rc, v, 8, time.Duration(secs)*time.Second, fmt.Sprintf("cycle:%s:%d", v.Name, round))
			cpu := nodesCPU(t, rc) - before
			if r.errors > 0 {
				t.Errorf("%s: %d errors", v.Name, r.errors)
			}
			if r.acquisitions == 0 {
				t.Fatalf("%s: no acquisition in %ds", v.Name, secs)
			}
			results[v.Name] = append(results[v.Name], result{r.rate, cpu / float64(r.acquisitions), r.toOther})
		}
	}
	med := func(rs []result, f func(result) float64) (float64, float64, float64) {
		xs := make([]float64, len(rs))
		for i, r := range rs {
			xs[i] = f(r)
		}
		slices.Sort(xs)
		m := xs[len(xs)/2]
		if len(xs)%2 == 0 {
			m = (xs[len(xs)/2-1] + m) / 2
		}
		return m, xs[0], xs[len(xs)-1]
	}
	var b strings.Builder
	fmt.Fprintf(&b, "8 instances, one key, hold 0, 5 nodes, %d round(s) of %ds, medians (min–max); load %s:\n", rounds, secs, loadavg())
	fmt.Fprintf(&b, "%-14s %20s %26s %28s %11s\n", "", "acq/s", "nodes' CPU µs/acq", "CPU vs redsync, per round", "to another")
	rsync := results["redsync"]
	for _, v := range variants {
		rs := results[v.Name]
		r, rlo, rhi := med(rs, func(r result) float64 { return r.rate })
		c, clo, chi := med(rs, func(r result) float64 { return r.cpu })
		o, _, _ := med(rs, func(r result) float64 { return r.toOther })
		// Each round's CPU per acquisition over redsync's in that round.
		paired := make([]result, len(rs))
		for i := range rs {
			paired[i] = result{cpu: rs[i].cpu / rsync[i].cpu}
		}
		p, plo, phi := med(paired, func(r result) float64 { return r.cpu })
		fmt.Fprintf(&b, "%-14s %6.0f (%5.0f–%5.0f) %10.0f (%5.0f–%5.0f) %12.2f× (%.2f–%.2f) %10.1f%%\n", v.Name, r, rlo, rhi, c, clo, chi, p, plo, phi, 100*o)
	}
	t.Log("\n" + b.String())
	if n := overlaps.n.Load(); n > 0 {
		t.Errorf("bare client: %d acquisitions while another instance held the same key", n)
	}
}

// bareOverlaps counts, per resource, the bare instances holding it, and
// the acquisitions that found another holder.
type bareOverlaps struct {
	mu      sync.Mutex // protects holding
	holding map[string]int
	n       atomic.Int64
}

func (o *bareOverlaps) add(res string, d int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.holding == nil {
		o.holding = map[string]int{}
	}
	o.holding[res] += d
	if d > 0 && o.holding[res] > 1 {
		o.n.Add(1)
	}
}

// nodesCPU sums used_cpu_user + used_cpu_sys over the nodes, in µs.
func nodesCPU(t *testing.T, rc *redistest.Cluster) float64 {
	t.Helper()
	admins := adminClients(rc)
	cpu, err := nodes.CPU(t.Context(), admins)
	if err != nil {
		t.Fatal(err)
	}
	return cpu
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f, _, _ := strings.Cut(string(b), " ")
	return f
}

// Bare protocol parameters: the library's defaults at a 10s TTL, roughly.
const (
	bareReserve  = 2000 // ms: the reservation a handoff sets
	bareLapse    = 4500 // ms: an entry's lapse
	bareFallback = 250 * time.Millisecond
	barePrefix   = "bare:wake:"
)

// bareScripts is one version of the scripts behind the bare client.
type bareScripts interface {
	// acquire runs one attempt on node i; it reports whether the node
	// granted. w is the waiting call's state on that node.
	acquire(ctx context.Context, c redis.UniversalClient, b *bare, w *bareWait, i int) (bool, error)
	// release releases (or hands over) the key on node i.
	release(ctx context.Context, c redis.UniversalClient, b *bare, w *bareWait, i int) error
}

func bareKeys(res string) []string {
	return []string{res, res + ":guard", res + ":queue", res + ":queue:lapse"}
}

type todayScripts struct{ acq, rel *redis.Script }

func (s *todayScripts) member(b *bare, w *bareWait) string {
	return b.id + "/" + strconv.Itoa(bareReserve) + "/" + w.token
}

func (s *todayScripts) acquire(ctx context.Context, c redis.UniversalClient, b *bare, w *bareWait, i int) (bool, error) {
	n, err := s.acq.Run(ctx, c, bareKeys(w.res), w.token, 10000, s.member(b, w), w.ticket, bareLapse, "1"+barePrefix, w.attempt, 0).Int64()
	return n == 1, err
}

func (s *todayScripts) release(ctx context.Context, c redis.UniversalClient, b *bare, w *bareWait, i int) error {
	return s.rel.Run(ctx, c, bareKeys(w.res), w.token, "0", s.member(b, w), "1"+barePrefix, "", bareLapse, w.attempt).Err()
}

type proposalScripts struct{ acq, rel *redis.Script }

func (s *proposalScripts) acquire(ctx context.Context, c redis.UniversalClient, b *bare, w *bareWait, i int) (bool, error) {
	now := time.Now().UnixMilli() + b.offset[i]
	entry := fmt.Sprintf("%s#%d#%s#%d#%d", b.id, bareReserve, w.token, now+bareLapse, w.attempt)
	n, err := s.acq.Run(ctx, c, bareKeys(w.res)[:3], w.token, 10000, entry, w.ticket, 2*bareLapse, w.queued[i],
		now+int64(time.Hour/time.Millisecond), barePrefix).Int64()
	if err != nil {
		return false, err
	}
	if n == 1 {
		w.queued[i] = ""
	} else {
		w.queued[i] = entry
	}
	return n == 1, nil
}

func (s *proposalScripts) release(ctx context.Context, c redis.UniversalClient, b *bare, w *bareWait, i int) error {
	low := time.Now().UnixMilli() + b.offset[i] - 5
	err := s.rel.Run(ctx, c, bareKeys(w.res)[:3], w.token, w.queued[i], barePrefix, low).Err()
	w.queued[i] = ""
	return err
}

// bare is one instance of the bare client over its own node connections.
type bare struct {
	id      string
	nodes   []redis.UniversalClient
	offset  []int64 // node clock − local clock, ms
	scripts bareScripts
	held    *bareOverlaps
	subs    []*redis.PubSub
	wg      sync.WaitGroup
	waiting atomic.Pointer[bareWait] // the Lock call waiting now, if any
}

// bareWait is one Lock call.
type bareWait struct {
	res, token string
	ticket     int64
	attempt    int
	queued     []string     // the proposal: our entry on each node, "" when none
	handed     chan int     // nodes that handed us the key
	mu         sync.Mutex   // protects got
	got        map[int]bool // nodes where the key is ours
}

func newBare(s bareScripts, held *bareOverlaps) func(nodes []redis.UniversalClient, ttl time.Duration) (libs.Locker, error) {
	return func(nodes []redis.UniversalClient, _ time.Duration) (libs.Locker, error) {
		b := &bare{id: randomID(), nodes: nodes, scripts: s, held: held, offset: make([]int64, len(nodes))}
		for i, n := range nodes {
			tm, err := n.Time(context.Background()).Result()
			if err != nil {
				b.Close()
				return nil, err
			}
			b.offset[i] = tm.UnixMilli() - time.Now().UnixMilli()
			sub := n.(*redis.Client).Subscribe(context.Background(), barePrefix+b.id)
			if _, err := sub.Receive(context.Background()); err != nil {
				sub.Close()
				b.Close()
				return nil, err
			}
			b.subs = append(b.subs, sub)
			b.wg.Go(func() {
				for m := range sub.Channel() {
					tok, _, _ := strings.Cut(m.Payload, " ")
					if w := b.waiting.Load(); w != nil && w.token == tok {
						select {
						case w.handed <- i:
						default:
						}
					}
				}
			})
		}
		return b, nil
	}
}

func (b *bare) Close() error {
	for _, s := range b.subs {
		s.Close()
	}
	b.wg.Wait()
	return nil
}

func randomID() string {
	var p [18]byte
	_, _ = rand.Read(p[:])
	return hex.EncodeToString(p[:])
}

// round runs f on every node at once and waits for all.
func (b *bare) round(f func(i int)) {
	var wg sync.WaitGroup
	for i := range b.nodes {
		wg.Go(func() { f(i) })
	}
	wg.Wait()
}

func (b *bare) Lock(ctx context.Context, res string) (libs.Held, error) {
	w := &bareWait{res: res, token: randomID(), ticket: time.Now().UnixMilli(), queued: make([]string, len(b.nodes)),
		handed: make(chan int, 4*len(b.nodes)), got: map[int]bool{}}
	b.waiting.Store(w)
	defer b.waiting.CompareAndSwap(w, nil)
	quorum := len(b.nodes)/2 + 1
	for {
		w.attempt++
		b.round(func(i int) {
			ok, err := b.scripts.acquire(ctx, b.nodes[i], b, w, i)
			if ok && err == nil {
				w.mu.Lock()
				w.got[i] = true
				w.mu.Unlock()
			}
		})
		timer := time.NewTimer(bareFallback)
	wait:
		for {
			w.mu.Lock()
			n := len(w.got)
			w.mu.Unlock()
			if n >= quorum {
				timer.Stop()
				b.held.add(res, 1)
				return &bareHeld{b: b, w: w}, nil
			}
			select {
			case i := <-w.handed:
				w.mu.Lock()
				w.got[i] = true
				w.mu.Unlock()
				w.queued[i] = "" // a handoff took our entry out
			case <-timer.C:
				break wait
			case <-ctx.Done():
				timer.Stop()
				b.releaseAll(w)
				return nil, ctx.Err()
			}
		}
		// No majority: give back what we got (so that the others can go
		// on) and try again; our ticket keeps our place.
		w.mu.Lock()
		got := w.got
		w.got = map[int]bool{}
		w.mu.Unlock()
		b.round(func(i int) {
			if got[i] {
				_ = b.scripts.release(context.Background(), b.nodes[i], b, w, i)
			}
		})
	}
}

func (b *bare) releaseAll(w *bareWait) {
	b.round(func(i int) { _ = b.scripts.release(context.Background(), b.nodes[i], b, w, i) })
}

// bareHeld is a lock the bare client holds.
type bareHeld struct {
	b *bare
	w *bareWait
}

func (h *bareHeld) Extend(context.Context) error { return errors.New("bare: no extend") }

func (h *bareHeld) Unlock(context.Context) error {
	h.b.held.add(h.w.res, -1) // before the release reaches any node
	h.b.releaseAll(h.w)
	return nil
}
