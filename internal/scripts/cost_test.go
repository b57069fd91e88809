package scripts

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/redistest"
)

// TestCycleCost prices the handoff's two scripts on one real node, in the
// steady state of lockbench's clients scenario: a queue of 7 waiters, each
// step one refused attempt that queues (fresh) and one release that hands
// the key to the head, whose Client listens. It logs the node's process
// CPU per step (INFO cpu: I/O included) and the time inside each script
// (INFO commandstats), beside redsync's step (SET NX, then a
// check-and-delete script), the same step with its message sent to a
// channel nobody listens on, handed without counting as on Cluster nodes
// (no delivery), and a floor: the same commands from scripts that keep only
// the steady state's Lua (issue 32: how much of a script's cost is its
// Lua and how much its commands). Batches interleaved, medians and range.
//
//	QUORUMLOCK_SCRIPT_COST=8000 go test -run TestCycleCost -v ./internal/scripts
func TestCycleCost(t *testing.T) {
	n, rc := costNode(t, "QUORUMLOCK_SCRIPT_COST", "the steps per batch")
	c := rc.Admin(0)
	ctx := t.Context()
	const client = "c0000000-1111-2222-3333-444444444444"
	sub := rc.Admin(0).Subscribe(ctx, "w:"+client)
	t.Cleanup(func() { sub.Close() })
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	go func() {
		for range sub.Channel() { // read what is delivered, as a waiting Client does
		}
	}()
	keys := NewKeys("k", "", "x").rel
	checkDelete := redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)
	floorAcq, floorRel := redis.NewScript(floorAcquire), redis.NewScript(floorRelease)
	type step struct {
		name     string
		acq, rel func(tok, member string, ticket int64, notAfter int64, holder string) error
		handoff  bool // the key goes to the queue's head (else to the acquirer)
	}
	lib := func(acq, rel *redis.Script, wake string) (func(string, string, int64, int64, string) error, func(string, string, int64, int64, string) error) {
		return func(tok, member string, ticket, na int64, _ string) error {
				return acq.Run(ctx, c, keys, tok, 30000, member, ticket, 4500, wake, "1n", na).Err()
			}, func(_, _ string, _, _ int64, holder string) error {
				return rel.Run(ctx, c, keys, holder, "0", "", wake, "", 4500, "0 0").Err()
			}
	}
	la, lr := lib(acquire.Script, release.Script, "1w:")
	na, nr := lib(acquire.Script, release.Script, "0nobody:") // as for Cluster nodes: handed without counting
	fa, fr := lib(floorAcq, floorRel, "1w:")
	lessAcq, lessRel := floorLess(t)
	la3, lr3 := lib(redis.NewScript(lessAcq), redis.NewScript(lessRel), "1w:")
	steps := []step{
		{name: "redsync: SET NX + check-and-delete", acq: func(tok, _ string, _, _ int64, _ string) error {
			return c.SetNX(ctx, "k", tok, 30*time.Second).Err()
		}, rel: func(_, _ string, _, _ int64, holder string) error {
			return checkDelete.Run(ctx, c, []string{"k"}, holder).Err()
		}},
		{name: "quorumlock: queueing attempt + handing release", acq: la, rel: lr, handoff: true},
		{name: "the same, the message reaches nobody (no delivery)", acq: na, rel: nr, handoff: true},
		{name: "floor: the same commands, the steady state's Lua only", acq: fa, rel: fr, handoff: true},
		{name: "floor less the release's TIME, the attempt's PTTLs", acq: la3, rel: lr3, handoff: true},
	}
	type cost struct{ cpu, acq, rel []float64 }
	costs := make([]cost, len(steps))
	for b := range 5 {
		for si, s := range steps {
			if err := c.Del(ctx, "k", "k:queue", "k:queue:lapse").Err(); err != nil {
				t.Fatal(err)
			}
			tm, err := c.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			notAfter := tm.UnixMilli() + time.Hour.Milliseconds()
			holder, fifo := "h0", []string(nil)
			if err := c.Set(ctx, "k", holder, 0).Err(); err != nil {
				t.Fatal(err)
			}
			one := func(i int, withRelease bool, timed bool) (acqUs, relUs float64) {
				tok := fmt.Sprintf("%08x-aaaa-bbbb-cccc-%012d", b, i)
				_, u0 := evalshaUsec(t, c, timed)
				if err := s.acq(tok, client+"/2000/"+tok, int64(i+1), notAfter, ""); err != nil && err != redis.Nil {
					t.Fatal(s.name, err)
				}
				_, u1 := evalshaUsec(t, c, timed)
				fifo = append(fifo, tok)
				if !withRelease {
					return 0, 0
				}
				if err := s.rel("", "", 0, 0, holder); err != nil {
					t.Fatal(s.name, err)
				}
				_, u2 := evalshaUsec(t, c, timed)
				if s.handoff {
					holder, fifo = fifo[0], fifo[1:]
				} else {
					holder, fifo = tok, nil // redsync's attempt took the free key
				}
				return u1 - u0, u2 - u1
			}
			for i := range 7 {
				one(i, false, false)
			}
			for i := 7; i < 100; i++ {
				one(i, true, false)
			}
			if s.handoff {
				if got, err := c.Get(ctx, "k").Result(); err != nil || got != holder {
					t.Fatalf("%s: the key holds %q (%v); want %q", s.name, got, err, holder)
				}
			}
			before := nodeCPU(t, c)
			for i := 100; i < 100+n; i++ {
				one(i, true, false)
			}
			costs[si].cpu = append(costs[si].cpu, (nodeCPU(t, c)-before)*1e6/float64(n))
			// The time inside each script, from INFO commandstats around
			// each call (left out of the CPU figure above).
			var a, r float64
			m := max(1, n/10)
			for i := 100 + n; i < 100+n+m; i++ {
				x, y := one(i, true, true)
				a, r = a+x, r+y
			}
			costs[si].acq = append(costs[si].acq, a/float64(m))
			costs[si].rel = append(costs[si].rel, r/float64(m))
		}
	}
	med := func(xs []float64) string {
		xs = slices.Sorted(slices.Values(xs))
		return fmt.Sprintf("%6.2f (%.2f–%.2f)", xs[len(xs)/2], xs[0], xs[len(xs)-1])
	}
	var out strings.Builder
	fmt.Fprintf(&out, "one node, 5 batches of %d steps; medians (range) over the batches; the node's CPU per step, µs (I/O included), then µs inside the attempt's and the release's command (EVALSHA or SET NX is not counted for redsync's attempt):\n", n)
	for si, s := range steps {
		fmt.Fprintf(&out, "  %-56s CPU %s  attempt %s  release %s\n", s.name, med(costs[si].cpu), med(costs[si].acq), med(costs[si].rel))
	}
	t.Log("\n" + out.String())
}

// evalshaUsec reads the calls and µs of EVALSHA (INFO commandstats), when
// timed.
func evalshaUsec(t *testing.T, c *redis.Client, timed bool) (calls, usec float64) {
	t.Helper()
	if !timed {
		return 0, 0
	}
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for l := range strings.SplitSeq(info, "\r\n") {
		rest, ok := strings.CutPrefix(l, "cmdstat_evalsha:")
		if !ok {
			continue
		}
		for f := range strings.SplitSeq(rest, ",") {
			k, v, _ := strings.Cut(f, "=")
			x, _ := strconv.ParseFloat(v, 64)
			switch k {
			case "calls":
				calls = x
			case "usec":
				usec = x
			}
		}
	}
	return calls, usec
}

// nodeCPU is the node process's CPU time in seconds (INFO cpu).
func nodeCPU(t *testing.T, c *redis.Client) float64 {
	t.Helper()
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		t.Fatal(err)
	}
	s := 0.0
	for l := range strings.SplitSeq(info, "\r\n") {
		k, v, ok := strings.Cut(l, ":")
		if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			f, _ := strconv.ParseFloat(v, 64)
			s += f
		}
	}
	return s
}

// floorAcquire and floorRelease run the commands the library's scripts run
// in the steady state measured above (a fresh waiter refused and queued in
// the new entry form; a release that hands the key to the head, which
// listens), with no other Lua: not the library's scripts (no other path,
// no checks beyond these), a floor to price their Lua against.
const floorAcquire = `local kg = redis.call('MGET', KEYS[1], KEYS[2])
if kg[2] then return 0 end
local v = kg[1]
if v ~= ARGV[1] and v ~= false then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if now > tonumber(ARGV[8]) then return -2 end
  local attempt = string.match(ARGV[7], '^(%d+)')
  local p = string.gsub(ARGV[3], '/', '#', 2)
  if redis.call('PTTL', KEYS[4]) == -2 then
    redis.call('ZADD', KEYS[3], ARGV[4], p .. '#' .. (now + ARGV[5]) .. '#' .. attempt)
  end
  if redis.call('PTTL', KEYS[3]) < tonumber(ARGV[5]) then redis.call('PEXPIRE', KEYS[3], 2 * ARGV[5]) end
  return 0
end
return 1`

const floorRelease = `local v = redis.call('GET', KEYS[1])
if v ~= ARGV[1] then return 0 end
local head = redis.call('ZPOPMIN', KEYS[3])[1]
if head then
  local client, reserve, token, dl, attempt = string.match(head, '^([^#/]*)#(%d+)#([^#]+)#(%d+)#(%d+)$')
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if tonumber(dl) > now then
    redis.call('SET', KEYS[1], token, 'PX', reserve)
    local n = redis.pcall('PUBLISH', string.sub(ARGV[4], 2) .. client, token .. ' ' .. attempt)
    if n > 0 then return 2 end
  end
end
redis.call('DEL', KEYS[1])
return 1`

// floorLess returns the floor without three of its commands (the queueing
// attempt's two PTTL, the handing release's TIME: the lapse compared with
// a time the client would send): what the remaining proposals to cut
// commands would save.
func floorLess(t *testing.T) (acq, rel string) {
	cut := func(s string, pairs ...string) string {
		for i := 0; i < len(pairs); i += 2 {
			if !strings.Contains(s, pairs[i]) {
				t.Fatalf("floorLess: %q is not in the floor", pairs[i])
			}
			s = strings.Replace(s, pairs[i], pairs[i+1], 1)
		}
		return s
	}
	acq = cut(floorAcquire,
		"  if redis.call('PTTL', KEYS[4]) == -2 then\n", "",
		"  end\n  if redis.call('PTTL', KEYS[3]) < tonumber(ARGV[5]) then redis.call('PEXPIRE', KEYS[3], 2 * ARGV[5]) end\n", "")
	rel = cut(floorRelease,
		"  local t = redis.call('TIME')\n  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n", "",
		"tonumber(dl) > now", "tonumber(dl) > 0")
	return acq, rel
}

// TestUncontendedCost prices the uncontended path's two scripts on one
// real node — an acquire of a free key (with a not-after bound) and the
// release of it with no guard — beside redsync's (SET NX as a script, and
// its check-and-delete) and a script that returns at once: µs per call
// inside EVALSHA (INFO commandstats), n calls each, three interleaved
// rounds (benchmarks/README.md quotes it).
//
//	QUORUMLOCK_UNCONTENDED_COST=5000 go test -run TestUncontendedCost -v ./internal/scripts
func TestUncontendedCost(t *testing.T) {
	n, rc := costNode(t, "QUORUMLOCK_UNCONTENDED_COST", "the calls per script and round")
	c := rc.Admin(0)
	ctx := t.Context()
	variants := []struct {
		name     string
		acq, rel *redis.Script
	}{
		{"quorumlock", acquire.Script, release.Script},
		{"redsync", redis.NewScript("return redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2], 'NX') and 1 or 0"),
			redis.NewScript("if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0")},
		{"empty", redis.NewScript("return 1"), redis.NewScript("return 1")},
	}
	const tok = "0123456789abcdef0123456789abcdef"
	perCall := func(phase func(k Keys) error) float64 {
		if err := c.ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			if err := phase(NewKeys("cost:"+strconv.Itoa(i), "", tok)); err != nil {
				t.Fatal(err)
			}
		}
		calls, usec := evalshaUsec(t, c, true)
		return usec / calls
	}
	for round := range 3 {
		for _, v := range variants {
			bound := time.Now().Add(time.Minute).UnixMilli() // the node is local: its clock is ours
			a := perCall(func(k Keys) error {
				return v.acq.Run(ctx, c, k.rel, tok, 30000, "", 0, 0, "0", "0", bound).Err()
			})
			r := perCall(func(k Keys) error {
				return v.rel.Run(ctx, c, k.rel, tok, 0, "", "0", "", 0, "0 0").Err()
			})
			if err := c.FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			t.Logf("round %d %-10s acquire %5.2f µs/call  release %5.2f µs/call", round, v.name, a, r)
		}
	}
}

// costNode reads a cost test's size from env (skipping the test when it
// is unset) and starts its one real node.
func costNode(t *testing.T, env, what string) (int, *redistest.Cluster) {
	t.Helper()
	n, _ := strconv.Atoi(os.Getenv(env))
	if n <= 0 {
		t.Skipf("set %s to %s", env, what)
	}
	return n, redistest.Start(t, 1)
}
