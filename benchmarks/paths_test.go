package benchmarks

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/benchmarks/internal/nodes"
	"github.com/quorumlock/quorumlock/internal/redistest"
	"github.com/quorumlock/quorumlock/redlock"
)

// TestCommandsPerPath runs each path of a contended acquisition once per
// round on 3 nodes, with the library's own Clients, and logs the commands
// each path ran per node (INFO commandstats: the commands a script calls
// too, under their own names): an acquire of a free key, a refused attempt
// that does not queue (TryLock), a refused attempt that queues (Lock), the
// release that hands the key to that waiter, and a release with nobody
// queued. A round before the measured ones loads the scripts and opens the
// connections and the wake-up subscriptions. TestProtocolPrototype and
// TestNodeCPUPerRequest below measure the same paths script by script:
//
//	go test -run 'TestCommandsPerPath|TestProtocolPrototype|TestNodeCPUPerRequest' -v .
//	QUORUMLOCK_PATHS_ROUNDS=20 QUORUMLOCK_PATHS_N=5000 go test -run … -v .   # steadier
func TestCommandsPerPath(t *testing.T) {
	rounds := envInt(t, "QUORUMLOCK_PATHS_ROUNDS", 3)
	rc := redistest.Start(t, 3)
	admins := adminClients(rc)
	newClient := func(opts ...redlock.Option) *redlock.Client {
		t.Helper()
		// A long TTL and retry delay: no renewal and no fallback attempt
		// runs while a path is measured.
		return newRedlock(t, rc.Clients(), append([]redlock.Option{redlock.WithTTL(30 * time.Second),
			redlock.WithRetryDelay(10*time.Second, 11*time.Second)}, opts...)...)
	}
	a, b, p := newClient(), newClient(), newClient(redlock.WithWakeUp(false))
	ctx := t.Context()
	paths := []string{"acquire, free key (TryLock)", "refused, not queued (TryLock)", "refused, queued (Lock)",
		"release that hands over (Unlock)", "release, nobody queued (Unlock)"}
	sums := map[string]map[string]nodes.CmdCost{}
	for round := range rounds + 1 {
		key := "paths"
		got := map[string]map[string]nodes.CmdCost{}
		step := func(path string, do func()) {
			t.Helper()
			before := readStats(t, admins)
			do()
			got[path] = settle(t, admins, before, rc.N())
		}
		var held, next *redlock.Lock
		step(paths[0], func() {
			var err error
			if held, err = a.TryLock(ctx, key); err != nil {
				t.Fatalf("TryLock of a free key = %v", err)
			}
		})
		step(paths[1], func() {
			if _, err := p.TryLock(ctx, key); !errors.Is(err, redlock.ErrNotObtained) {
				t.Fatalf("TryLock of a held key = %v; want ErrNotObtained", err)
			}
		})
		done := make(chan error, 1)
		step(paths[2], func() {
			go func() {
				var err error
				next, err = b.Lock(ctx, key)
				done <- err
			}()
		})
		step(paths[3], func() {
			if err := held.Unlock(ctx); err != nil {
				t.Fatalf("Unlock = %v", err)
			}
			if err := <-done; err != nil {
				t.Fatalf("waiter's Lock = %v", err)
			}
		})
		step(paths[4], func() {
			if err := next.Unlock(ctx); err != nil {
				t.Fatalf("Unlock = %v", err)
			}
		})
		if round == 0 {
			continue // warm-up: scripts loaded, connections and subscriptions opened
		}
		for path, m := range got {
			if sums[path] == nil {
				sums[path] = map[string]nodes.CmdCost{}
			}
			addCosts(sums[path], m)
		}
	}
	var b2 strings.Builder
	fmt.Fprintf(&b2, "commands per node per path (3 nodes, %d rounds; µs/call is INFO commandstats' usec, a script's including the commands it calls):\n", rounds)
	for _, path := range paths {
		writePath(&b2, path, sums[path], float64(rounds*rc.N()))
	}
	t.Log("\n" + b2.String())
}

// TestProtocolPrototype runs each path N times on one node through a
// direct connection and logs what one run cost the node: today's
// acquire.lua and release.lua (queue.lua prepended, as the library loads
// them) beside the proposal's prototype (testdata/proposal), and, for
// reference, the plain commands of a Redlock without a queue (redsync's
// shape: SET NX, then a check-and-delete script). Preparation commands
// (UNLINK, SETEX) are left out of the figures.
func TestProtocolPrototype(t *testing.T) {
	n := envInt(t, "QUORUMLOCK_PATHS_N", 300)
	rc := redistest.Start(t, 1)
	admin := rc.Admin(0)
	admins := []redis.UniversalClient{admin}
	ctx := t.Context()
	read := func(path string) string { return readScript(t, path) }
	queue := oldScript(t, "queue.lua")
	today := struct{ acquire, release *redis.Script }{
		redis.NewScript(queue + oldScript(t, "acquire.lua")),
		redis.NewScript(queue + oldScript(t, "release.lua")),
	}
	serve := read("testdata/proposal/serve.lua")
	proposal := struct{ acquire, release, acquireWithQueueLua *redis.Script }{
		redis.NewScript(serve + read("testdata/proposal/acquire.lua")),
		redis.NewScript(serve + read("testdata/proposal/release.lua")),
		// The prototype behind today's queue.lua, whose functions it does
		// not call: what defining them costs each call.
		redis.NewScript(queue + serve + read("testdata/proposal/acquire.lua")),
	}
	// The floor of any script: one that calls nothing, with today's
	// acquire's 4 keys and 8 arguments.
	empty := redis.NewScript(`return 0`)
	checkDelete := redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)
	// A subscriber on the waiters' channel, as a waiting Client has: today's
	// serve counts it (PUBSUB NUMSUB), the proposal's PUBLISH reaches it.
	sub := admin.Subscribe(ctx, "w:c")
	t.Cleanup(func() { sub.Close() })
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	const lapse, reserve = 4500, 2000
	const batches = 5
	m := max(1, n/batches) // calls per path per batch
	var batch int          // tokens are named by batch and call, so every batch starts afresh
	tok := func(i int) string { return fmt.Sprintf("tok%d-%06d", batch, i) }
	member := func(i int) string { return fmt.Sprintf("c/%d/%s", reserve, tok(i)) }
	entry := func(i int, dl int64) string { return fmt.Sprintf("c#%d#%s#%d#1", reserve, tok(i), dl) }
	nodeNow := func() int64 {
		tm, err := admin.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return tm.UnixMilli()
	}
	type path struct {
		name string
		prep func()      // before the measured calls
		one  func(i int) // the measured call i
		each func(i int) // before call i, left out of the figures (UNLINK, SETEX)
		skip []string    // the prep commands to leave out
		top  []string    // the commands the client sent (default: the scripts)
		done func(t *testing.T)
	}
	must := func(err error) {
		t.Helper()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
	}
	keys3 := []string{"k", "k:guard", "k:queue"}
	keys4 := []string{"k", "k:guard", "k:queue", "k:queue:lapse"}
	var far int64  // a not-after bound well ahead of the node's clock
	var low string // the releaser's lower bound on the node's clock, which the proposal's release takes in place of TIME
	reset := func() { must(admin.Del(ctx, keys4...).Err()) }
	paths := []path{
		{name: "SET NX, refused (redsync's attempt)", top: []string{"set"}, prep: func() { reset(); must(admin.Set(ctx, "k", "other", 0).Err()) },
			one: func(int) { must(admin.SetNX(ctx, "k", "me", 30*time.Second).Err()) }},
		{name: "SET NX, granted + check-and-delete script (redsync's acquisition)", top: []string{"set", "evalsha", "eval"}, prep: reset,
			one: func(int) {
				must(admin.SetNX(ctx, "k", "me", 30*time.Second).Err())
				must(checkDelete.Run(ctx, admin, []string{"k"}, "me").Err())
			}},
		{name: "a script that calls nothing (4 keys, 8 arguments)", prep: reset,
			one: func(int) { must(empty.Run(ctx, admin, keys4, "me", 30000, "", 0, lapse, "1w:", 1, far).Err()) }},
		{name: "today: refused, not queued", prep: func() { reset(); must(admin.Set(ctx, "k", "other", 0).Err()) },
			one: func(int) { must(today.acquire.Run(ctx, admin, keys4, "me", 30000, "", 0, lapse, "1w:", 1, far).Err()) }},
		{name: "proposal: refused, not queued", prep: func() { reset(); must(admin.Set(ctx, "k", "other", 0).Err()) },
			one: func(int) {
				must(proposal.acquire.Run(ctx, admin, keys3, "me", 30000, "", 0, 2*lapse, "", far, "w:").Err())
			}},
		{name: "proposal behind today's queue.lua: refused, not queued", prep: func() { reset(); must(admin.Set(ctx, "k", "other", 0).Err()) },
			one: func(int) {
				must(proposal.acquireWithQueueLua.Run(ctx, admin, keys3, "me", 30000, "", 0, 2*lapse, "", far, "w:").Err())
			}},
		{name: "today: refused, queued", prep: func() { reset(); must(admin.Set(ctx, "k", "other", 0).Err()) },
			one: func(i int) {
				must(today.acquire.Run(ctx, admin, keys4, tok(i), 30000, member(i), i, lapse, "1w:", 1, far).Err())
			}},
		{name: "today: release that hands over", // the queue the path above left
			one: func(i int) {
				holder := "other"
				if i > 0 {
					holder = tok(i - 1)
				}
				mine := ""
				if i > 0 {
					mine = member(i - 1)
				}
				must(today.release.Run(ctx, admin, keys4, holder, "0", mine, "1w:", "", lapse, 1).Err())
			},
			done: func(t *testing.T) { wantHolder(t, admin, tok(m)) }},
		{name: "proposal: refused, queued", prep: func() { reset(); must(admin.Set(ctx, "k", "other", 0).Err()) },
			one: func(i int) {
				must(proposal.acquire.Run(ctx, admin, keys3, tok(i), 30000, entry(i, far+lapse), i, 2*lapse, "", far, "w:").Err())
			}},
		{name: "proposal: release that hands over",
			one: func(i int) {
				holder := "other"
				if i > 0 {
					holder = tok(i - 1)
				}
				must(proposal.release.Run(ctx, admin, keys3, holder, "", "w:", low).Err())
			},
			done: func(t *testing.T) { wantHolder(t, admin, tok(m)) }},
		{name: "today: acquire, free key", prep: reset, each: func(int) { must(admin.Unlink(ctx, "k").Err()) }, skip: []string{"unlink"},
			one: func(int) { must(today.acquire.Run(ctx, admin, keys4, "me", 30000, "", 0, lapse, "1w:", 1, far).Err()) }},
		{name: "proposal: acquire, free key", prep: reset, each: func(int) { must(admin.Unlink(ctx, "k").Err()) }, skip: []string{"unlink"},
			one: func(int) {
				must(proposal.acquire.Run(ctx, admin, keys3, "me", 30000, "", 0, 2*lapse, "", far, "w:").Err())
			}},
		{name: "today: release, nobody queued", prep: reset, each: func(int) { must(admin.SetEx(ctx, "k", "me", time.Minute).Err()) }, skip: []string{"setex"},
			one: func(int) { must(today.release.Run(ctx, admin, keys4, "me", "0", "", "1w:", "", lapse, 1).Err()) }},
		{name: "proposal: release, nobody queued", prep: reset, each: func(int) { must(admin.SetEx(ctx, "k", "me", time.Minute).Err()) }, skip: []string{"setex"},
			one: func(int) { must(proposal.release.Run(ctx, admin, keys3, "me", "", "w:", low).Err()) }},
	}
	// Batches of every path in turn, so that a busy spell of a shared
	// machine spreads over all of them; µs per run is the median over the
	// batches of the time inside the commands the client sent (a script's
	// includes what it calls).
	sums := make([]map[string]nodes.CmdCost, len(paths))
	perRun := make([][]float64, len(paths))
	for batch = range batches {
		for pi, p := range paths {
			far = nodeNow() + int64(time.Hour/time.Millisecond)
			low = strconv.FormatInt(nodeNow(), 10)
			if p.prep != nil {
				p.prep()
			}
			p.one(0) // loads the script (EVAL on NOSCRIPT) outside the figures
			sum := map[string]nodes.CmdCost{}
			for i := 1; i <= m; i++ {
				if p.each != nil {
					p.each(i)
				}
				before := readStats(t, admins)
				p.one(i)
				addCosts(sum, diffStats(readStats(t, admins), before))
			}
			for _, s := range append(p.skip, "info") {
				delete(sum, s)
			}
			if p.done != nil {
				p.done(t)
			}
			top := p.top
			if top == nil {
				top = []string{"evalsha", "eval"}
			}
			us := 0.0
			for _, c := range top {
				us += sum[c].Usec
			}
			perRun[pi] = append(perRun[pi], us/float64(m))
			if sums[pi] == nil {
				sums[pi] = map[string]nodes.CmdCost{}
			}
			addCosts(sums[pi], sum)
		}
	}
	var out strings.Builder
	fmt.Fprintf(&out, "one node, %d batches of %d calls per path; µs per run: median over the batches (min–max) of the time inside the commands the client sent; then per run, each command's calls × µs per call (INFO commandstats; EVALSHA's time includes the commands the script calls):\n", batches, m)
	for pi, p := range paths {
		xs := slices.Sorted(slices.Values(perRun[pi]))
		fmt.Fprintf(&out, "  %-66s %6.1fµs (%.1f–%.1f)\n", p.name, xs[len(xs)/2], xs[0], xs[len(xs)-1])
		writePath(&out, "", sums[pi], float64(batches*m))
	}
	t.Log("\n" + out.String())
}

func wantHolder(t *testing.T, c *redis.Client, want string) {
	t.Helper()
	if got, err := c.Get(t.Context(), "k").Result(); err != nil || got != want {
		t.Errorf("after the handoffs the key holds %q (%v); want %q: the path did not hand over every time", got, err, want)
	}
}

// readStats reads INFO commandstats of the nodes, summed.
func readStats(t *testing.T, ns []redis.UniversalClient) map[string]nodes.CmdCost {
	t.Helper()
	m, err := nodes.CommandStats(t.Context(), ns)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// diffStats returns after − before per command, without INFO (our reads)
// and commands that did not run.
func diffStats(after, before map[string]nodes.CmdCost) map[string]nodes.CmdCost {
	out := map[string]nodes.CmdCost{}
	for name, a := range after {
		b := before[name]
		if name == "info" || a.Calls <= b.Calls {
			continue
		}
		out[name] = nodes.CmdCost{Calls: a.Calls - b.Calls, Usec: a.Usec - b.Usec}
	}
	return out
}

func addCosts(sum, m map[string]nodes.CmdCost) {
	for name, c := range m {
		s := sum[name]
		s.Calls += c.Calls
		s.Usec += c.Usec
		sum[name] = s
	}
}

// settle waits until the nodes have run at least one script per node since
// before and then nothing more for a while (the stragglers of a call that
// returned early, a waiter's wake-up), and returns what ran.
func settle(t *testing.T, ns []redis.UniversalClient, before map[string]nodes.CmdCost, minScripts int) map[string]nodes.CmdCost {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	var last map[string]nodes.CmdCost
	for time.Now().Before(deadline) {
		time.Sleep(30 * time.Millisecond)
		d := diffStats(readStats(t, ns), before)
		scripts := d["evalsha"].Calls + d["eval"].Calls
		if scripts >= float64(minScripts) && last != nil && sameCalls(d, last) {
			return d
		}
		last = d
	}
	t.Fatalf("the nodes did not settle within 5s: %v", last)
	return nil
}

func sameCalls(a, b map[string]nodes.CmdCost) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k].Calls != v.Calls {
			return false
		}
	}
	return true
}

// writePath prints one path's commands per call (sum divided by per):
// scripts first, then the commands by name.
func writePath(w *strings.Builder, name string, sum map[string]nodes.CmdCost, per float64) {
	names := slices.Sorted(maps.Keys(sum))
	slices.SortStableFunc(names, func(a, b string) int {
		sa, sb := strings.HasPrefix(a, "eval"), strings.HasPrefix(b, "eval")
		switch {
		case sa && !sb:
			return -1
		case sb && !sa:
			return 1
		}
		return 0
	})
	var parts []string
	total := 0.0
	for _, n := range names {
		c := sum[n]
		calls := c.Calls / per
		total += calls
		us := 0.0
		if c.Calls > 0 {
			us = c.Usec / c.Calls
		}
		parts = append(parts, fmt.Sprintf("%s %.2f×%.1fµs", strings.ToUpper(n), calls, us))
	}
	if name == "" {
		fmt.Fprintf(w, "      %.2f commands: %s\n", total, strings.Join(parts, ", "))
		return
	}
	fmt.Fprintf(w, "  %-66s %5.2f commands: %s\n", name, total, strings.Join(parts, ", "))
}

// TestNodeCPUPerRequest measures what one request costs a node's process,
// network I/O included (INFO cpu: used_cpu_user + used_cpu_sys), which
// commandstats leaves out: a refused SET NX, a script that calls nothing,
// and a PUBLISH with one subscriber (its delivery is one more write) and
// with none. N sequential requests per kind, in 5 interleaved batches;
// medians over the batches.
func TestNodeCPUPerRequest(t *testing.T) {
	n := envInt(t, "QUORUMLOCK_PATHS_N", 300)
	rc := redistest.Start(t, 1)
	admin := rc.Admin(0)
	ctx := t.Context()
	sub := admin.Subscribe(ctx, "w:c")
	t.Cleanup(func() { sub.Close() })
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	go func() {
		for range sub.Channel() { // read what is delivered, as a waiting Client does
		}
	}()
	if err := admin.Set(ctx, "k", "other", 0).Err(); err != nil {
		t.Fatal(err)
	}
	empty := redis.NewScript(`return 0`)
	kinds := []struct {
		name string
		one  func() error
	}{
		{"SET NX, refused", func() error { return admin.SetNX(ctx, "k", "me", time.Minute).Err() }},
		{"EVALSHA of a script that calls nothing", func() error { return empty.Run(ctx, admin, []string{"k"}, "me").Err() }},
		{"PUBLISH, one subscriber", func() error { return admin.Publish(ctx, "w:c", "tok 1").Err() }},
		{"PUBLISH, no subscriber", func() error { return admin.Publish(ctx, "w:nobody", "tok 1").Err() }},
	}
	cpu := func() float64 {
		v, err := nodes.CPU(ctx, []redis.UniversalClient{admin})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	const batches = 5
	m := max(1, n/batches)
	per := make([][]float64, len(kinds))
	for range batches {
		for i, k := range kinds {
			if err := k.one(); err != nil { // loads the script outside the figures
				t.Fatal(err)
			}
			before := cpu()
			for range m {
				if err := k.one(); err != nil {
					t.Fatal(err)
				}
			}
			per[i] = append(per[i], (cpu()-before)/float64(m))
		}
	}
	var out strings.Builder
	fmt.Fprintf(&out, "node CPU per request (INFO cpu, I/O included; %d batches of %d; median, min–max):\n", batches, m)
	for i, k := range kinds {
		xs := slices.Sorted(slices.Values(per[i]))
		fmt.Fprintf(&out, "  %-40s %6.1fµs (%.1f–%.1f)\n", k.name, xs[len(xs)/2], xs[0], xs[len(xs)-1])
	}
	t.Log("\n" + out.String())
}

// baselineRev is the last revision of this repository before issue 32
// changed the plain lock's queue scripts: the "before" of the protocol
// measurements here and the old version of TestMixedVersions.
const baselineRev = "ced73d4"

// oldScript returns internal/scripts/name as it was at baselineRev, from
// git's objects (nothing in the work tree changes); the test is skipped
// where git cannot produce it (a shallow clone, no git).
func oldScript(t *testing.T, name string) string {
	t.Helper()
	out, err := exec.Command("git", "-C", "..", "show", baselineRev+":internal/scripts/"+name).Output()
	if err != nil {
		t.Skipf("git show %s:internal/scripts/%s: %v", baselineRev, name, err)
	}
	return string(out)
}

// readScript returns the text of a script file (the prototype's, in
// testdata/proposal).
func readScript(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
