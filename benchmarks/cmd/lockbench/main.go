// Command lockbench measures what a distributed lock costs: quorumlock,
// go-redsync/redsync and bsm/redislock side by side with the floor (one
// parallel round of plain SET NX PX / DEL), in a few scenarios, on embedded
// nodes or on yours.
//
//	cd benchmarks && go run ./cmd/lockbench                # 5 embedded nodes
//	go run ./cmd/lockbench -nodes redis://10.0.0.1:6379,redis://:secret@10.0.0.2:6379/0,rediss://10.0.0.3:6380
//	go run ./cmd/lockbench -scenarios contended -clients 16 -duration 10s -svg out.svg
//
// Embedded nodes are local redis-server processes when redis-server is on
// PATH, in-process miniredis nodes (TTLs on the real clock) otherwise; the
// header says which. lockbench stops the servers it started when it ends,
// also on Ctrl-C. It is bounded in time: every library × scenario runs for
// -duration, plus at most -grace for operations in flight.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/benchmarks/internal/hold"
	"github.com/quorumlock/quorumlock/benchmarks/internal/libs"
	"github.com/quorumlock/quorumlock/benchmarks/internal/nodes"
	"github.com/quorumlock/quorumlock/internal/redistest"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case errors.Is(err, errUsage):
		os.Exit(2)
	case err != nil && ctx.Err() != nil:
		fmt.Fprintln(os.Stderr, "lockbench: interrupted:", err)
		os.Exit(130)
	case err != nil:
		fmt.Fprintln(os.Stderr, "lockbench:", err)
		os.Exit(1)
	}
}

var errUsage = errors.New("usage")

// config is the command line.
type config struct {
	nodes     string
	n         int
	embedded  string
	ttl       time.Duration
	clients   int
	resources int
	duration  time.Duration
	grace     time.Duration
	hold      time.Duration
	slow      time.Duration
	libs      string
	scenarios string
	csv       string
	json      string
	svg       string
	markdown  bool
	progress  string
	many      int
	count     int
	cpuprof   string
	blockprof string
	mutexprof string
	// nodeLatency puts every node behind a proxy adding this delay to each
	// direction (0: direct).
	nodeLatency time.Duration
	commands    bool
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("lockbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.nodes, "nodes", "", "comma-separated `URLs` of your Redis masters (redis://[user:pass@]host:port[/db], rediss:// for TLS); default: embedded nodes")
	fs.IntVar(&c.n, "n", 5, "number of embedded nodes")
	fs.StringVar(&c.embedded, "embedded", "auto", "embedded nodes: auto (redis-server if on PATH, else miniredis), redis-server or miniredis")
	fs.DurationVar(&c.ttl, "ttl", 8*time.Second, "lock TTL for every library (8s is redsync's default expiry)")
	fs.IntVar(&c.clients, "clients", 8, "goroutines in the contended, parallel and mixed scenarios; instances in clients and shared")
	fs.IntVar(&c.resources, "resources", 1, "resources the contended scenario's clients share (client i uses resource i mod resources)")
	fs.DurationVar(&c.duration, "duration", 2*time.Second, "measuring time per library and scenario, per run")
	fs.IntVar(&c.count, "count", 1, "runs of each library × scenario, interleaved (round 1 of every pair, then round 2, …); tables show the medians over the runs and their spread")
	fs.DurationVar(&c.grace, "grace", 5*time.Second, "longest an operation in flight may run past -duration before it is abandoned")
	fs.DurationVar(&c.hold, "hold", 0, "time a lock is held in the contended scenario (handoff holds at least 10ms)")
	fs.DurationVar(&c.slow, "slow", 20*time.Millisecond, "latency added to each direction of node 0 in the slow scenario")
	fs.DurationVar(&c.nodeLatency, "node-latency", 0, "put every node behind a proxy that delays each direction by this much (e.g. 250us: nodes on machines of their own); 0: no proxy")
	fs.BoolVar(&c.commands, "commands", false, "also print the commands each operation ran on a node (INFO commandstats, script-called commands included): calls and µs per operation per node, µs per call")
	fs.StringVar(&c.libs, "libs", "all", "libraries, comma-separated: "+strings.Join(libs.Names(), ", "))
	fs.StringVar(&c.scenarios, "scenarios", "all", "scenarios, comma-separated: "+strings.Join(scenarioNames(), ", "))
	fs.StringVar(&c.csv, "csv", "", "write every sample to this CSV `file`")
	fs.StringVar(&c.json, "json", "", "write the results and every sample to this JSON `file`")
	fs.StringVar(&c.svg, "svg", "", "draw the latency distributions (CDF per library, one panel per scenario) to this SVG `file`")
	fs.BoolVar(&c.markdown, "markdown", false, "print the tables as Markdown")
	fs.IntVar(&c.many, "many", 0, "also hold this many auto-renewed quorumlock locks for -duration, batched and unbatched, and report renewal lag, CPU and round trips (0: off; see cmd/holdbench for more)")
	fs.StringVar(&c.cpuprof, "cpuprofile", "", "write a CPU profile of the whole run (clients of every library, and embedded miniredis nodes) to this `file`, for go tool pprof")
	fs.StringVar(&c.blockprof, "blockprofile", "", "write a profile of where goroutines blocked (channels, mutexes, selects; every event) during the whole run to this `file`, for go tool pprof")
	fs.StringVar(&c.mutexprof, "mutexprofile", "", "write a profile of mutex contention (every event) during the whole run to this `file`, for go tool pprof")
	fs.StringVar(&c.progress, "progress", "auto", "progress line on stderr: auto (when stderr is a terminal), on, off")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: lockbench [flags]\n\nMeasures lock latency and throughput of quorumlock, redsync and redislock next to\nthe floor (one parallel round of SET NX PX / DEL). Scenarios:\n")
		for _, s := range scenarios {
			fmt.Fprintf(fs.Output(), "  %-12s %s\n", s.name, s.about)
		}
		fmt.Fprintf(fs.Output(), "\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return c, err
		}
		return c, errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "lockbench: unexpected argument %q\n", fs.Arg(0))
		return c, errUsage
	}
	var bad []string
	if c.n < 1 {
		bad = append(bad, "-n must be at least 1")
	}
	if c.count < 1 {
		bad = append(bad, "-count must be at least 1")
	}
	if c.ttl <= 0 || c.duration <= 0 || c.grace <= 0 {
		bad = append(bad, "-ttl, -duration and -grace must be positive")
	}
	if c.clients < 1 || c.resources < 1 {
		bad = append(bad, "-clients and -resources must be at least 1")
	}
	if c.hold < 0 || c.slow < 0 || c.nodeLatency < 0 {
		bad = append(bad, "-hold, -slow and -node-latency must not be negative")
	}
	switch c.progress {
	case "auto", "on", "off":
	default:
		bad = append(bad, "-progress must be auto, on or off")
	}
	if len(bad) > 0 {
		fmt.Fprintln(stderr, "lockbench: "+strings.Join(bad, "; "))
		return c, errUsage
	}
	return c, nil
}

// Report is everything one lockbench invocation measured.
type Report struct {
	Nodes     string    `json:"nodes"`
	NodeCount int       `json:"node_count"`
	Machine   string    `json:"machine"`
	Started   time.Time `json:"started"`
	TTL       string    `json:"ttl"`
	Duration  string    `json:"duration"`
	Clients   int       `json:"clients"`
	Resources int       `json:"resources"`
	Slow      string    `json:"slow"`
	// NodeLatency is the delay added to each direction of every node
	// (-node-latency), "0s" for none.
	NodeLatency string `json:"node_latency"`
	// Count is the number of runs of each library × scenario (-count).
	Count    int       `json:"count"`
	Versions Versions  `json:"versions"`
	Results  []*Result `json:"results"`
}

// Result is one library in one scenario, over its -count runs (see merge):
// Ops, Errors and Elapsed add up the runs; OpsPerSec and the percentiles
// are medians over the runs, Summary.Max the largest sample of all.
type Result struct {
	Scenario string `json:"scenario"`
	Lib      string `json:"lib"`
	Nodes    int    `json:"nodes"`
	Note     string `json:"note,omitempty"`
	Run             // the figures: of the one run, or combined over the runs
	// Spread is how far apart the runs were; MinRunN the fewest samples
	// one run had (under minSamples, its p90 and p99 are flagged).
	Spread  Spread `json:"spread"`
	MinRunN int    `json:"min_run_samples"`
	// Ratios of p50 to the floor's and to redsync's p50 in the same
	// scenario; 0 when there is none.
	VsFloor   float64  `json:"vs_floor,omitempty"`
	VsRedsync float64  `json:"vs_redsync,omitempty"`
	Runs      []*Run   `json:"runs"`
	Samples   []sample `json:"-"`
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	selLibs, err := libs.Select(cfg.libs)
	if err != nil {
		return err
	}
	selScen, err := selectScenarios(cfg.scenarios)
	if err != nil {
		return err
	}
	if cfg.cpuprof != "" {
		f, err := os.Create(cfg.cpuprof)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}

	for _, p := range []struct {
		path, name string
		on, off    func()
	}{
		{cfg.blockprof, "block", func() { runtime.SetBlockProfileRate(1) }, func() { runtime.SetBlockProfileRate(0) }},
		{cfg.mutexprof, "mutex", func() { runtime.SetMutexProfileFraction(1) }, func() { runtime.SetMutexProfileFraction(0) }},
	} {
		if p.path == "" {
			continue
		}
		f, err := os.Create(p.path)
		if err != nil {
			return err
		}
		p.on()
		defer func() {
			_ = pprof.Lookup(p.name).WriteTo(f, 0)
			p.off()
			f.Close()
		}()
	}

	// Nodes: the user's, or embedded ones that we stop on the way out,
	// whatever happens (Ctrl-C cancels ctx; deferred calls still run).
	var opts []*redis.Options
	var desc string
	var faults nodes.Faults // embedded redis-server nodes only
	miniredis := false
	if cfg.nodes != "" {
		if opts, err = nodes.ParseURLs(cfg.nodes); err != nil {
			return err
		}
		addrs := make([]string, len(opts))
		for i, o := range opts {
			addrs[i] = o.Addr
		}
		desc = fmt.Sprintf("%d of your nodes: %s", len(opts), strings.Join(addrs, ", "))
	} else {
		e, err := nodes.StartEmbedded(cfg.n, nodes.Kind(cfg.embedded))
		if err != nil {
			if errors.Is(err, redistest.ErrNoRedisServer) {
				return fmt.Errorf("%w (or use -embedded miniredis)", err)
			}
			return err
		}
		defer e.Close()
		faults = e.Faults()
		for _, a := range e.Addrs {
			opts = append(opts, nodes.Options(a))
		}
		switch e.Kind {
		case nodes.RedisServer:
			desc = fmt.Sprintf("%d embedded redis-server processes on 127.0.0.1 (started by lockbench)", cfg.n)
		default:
			miniredis = true
			desc = fmt.Sprintf("%d embedded in-process miniredis nodes with ClockTTL(true) (redis-server not used%s)", cfg.n, onPath())
		}
	}
	// Every node behind a delaying proxy: nodes on machines of their own.
	// The proxy is redistest.Proxy, the one the slow scenario and the
	// fault tests use, not toxiproxy: no extra process or dependency, and
	// it delays each chunk from when it was read, so pipelined requests
	// are not serialised behind each other's delay. It runs in this
	// process, so its CPU counts in the client CPU column, never in the
	// nodes'.
	if cfg.nodeLatency > 0 {
		for i, o := range opts {
			p, err := redistest.NewProxy(o.Addr)
			if err != nil {
				return err
			}
			defer p.Close()
			p.SetLatency(cfg.nodeLatency)
			po := *o
			po.Addr = p.Addr()
			opts[i] = &po
		}
		desc += fmt.Sprintf(", each behind a proxy adding %v per direction", cfg.nodeLatency)
	}
	fast := nodes.Clients(opts)
	defer nodes.CloseAll(fast)
	versions := readVersions(ctx, fast, miniredis)

	e := &env{fast: fast, opts: opts, clients: cfg.clients, resources: cfg.resources, hold: cfg.hold, slowBy: cfg.slow, faults: faults}
	if hasScenario(selScen, "slow") {
		// The slow node sits behind a proxy of our own (redistest.Proxy,
		// not toxiproxy): every byte each way waits cfg.slow.
		p, err := redistest.NewProxy(opts[0].Addr)
		if err != nil {
			return err
		}
		defer p.Close()
		p.SetLatency(cfg.slow)
		o := *opts[0]
		o.Addr = p.Addr()
		slow := redis.NewClient(&o)
		defer slow.Close()
		e.slow = append([]redis.UniversalClient{slow}, fast[1:]...)
	}

	rep := &Report{
		Nodes:       desc,
		NodeCount:   len(fast),
		Machine:     fmt.Sprintf("%s/%s, %d CPUs (GOMAXPROCS %d), %s", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version()),
		Started:     time.Now(),
		TTL:         cfg.ttl.String(),
		Duration:    cfg.duration.String(),
		Clients:     cfg.clients,
		Resources:   cfg.resources,
		Slow:        cfg.slow.String(),
		NodeLatency: cfg.nodeLatency.String(),
		Count:       cfg.count,
		Versions:    versions,
	}
	type job struct {
		s   scenario
		lib libs.Lib
	}
	var jobs []job
	for _, s := range selScen {
		for _, l := range selLibs {
			if (s.waits && !l.Waits) || (s.multiNode && l.MaxNodes == 1) || (s.noFloor && l.Name == "floor") || (s.only != "" && l.Name != s.only) {
				continue
			}
			jobs = append(jobs, job{s, l})
		}
	}
	total := len(jobs) * cfg.count
	fmt.Fprintf(stdout, "lockbench: %s\nversions: %s\nmachine: %s\nTTL %v, %v per run, %d runs (%d × -count %d, interleaved): done in about %v (at most %v)\n\n",
		desc, versions, rep.Machine, cfg.ttl, cfg.duration, total, len(jobs), cfg.count,
		roundDur(time.Duration(total)*cfg.duration), roundDur(time.Duration(total)*(cfg.duration+cfg.grace)))

	// Interleaved: round k runs every library × scenario once, so that a
	// slow spell of a shared machine spreads over all of them instead of
	// landing on one library's runs.
	prog := newProgress(stderr, cfg.progress)
	var runErr error
	runs := make([][]*Result, len(jobs))
rounds:
	for k := range cfg.count {
		for i, j := range jobs {
			if ctx.Err() != nil {
				runErr = ctx.Err()
				break rounds
			}
			tag := fmt.Sprintf("[%d/%d]", k*len(jobs)+i+1, total)
			runs[i] = append(runs[i], runOne(ctx, e, j.s, j.lib, cfg, prog, tag))
		}
	}
	prog.done()
	for _, rs := range runs {
		if len(rs) > 0 {
			rep.Results = append(rep.Results, merge(rs))
		}
	}
	ratios(rep.Results)

	writeTables(stdout, rep, cfg.markdown)
	if cfg.commands {
		writeCommands(stdout, rep, cfg.markdown)
	}
	if cfg.many > 0 && ctx.Err() == nil {
		if err := writeMany(ctx, stdout, opts, cfg); err != nil {
			return err
		}
	}
	for _, w := range []struct {
		path  string
		write func(io.Writer, *Report) error
	}{{cfg.csv, writeCSV}, {cfg.json, writeJSON}, {cfg.svg, writeSVG}} {
		if w.path == "" {
			continue
		}
		if err := writeFile(w.path, rep, w.write); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s\n", w.path)
	}
	if runErr == nil {
		for _, r := range rep.Results {
			if r.Err != "" {
				runErr = fmt.Errorf("%s/%s: %s", r.Lib, r.Scenario, r.Err)
				break
			}
		}
	}
	return runErr
}

func roundDur(d time.Duration) time.Duration {
	if d < 10*time.Second {
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Second)
}

func hasScenario(ss []scenario, name string) bool {
	for _, s := range ss {
		if s.name == name {
			return true
		}
	}
	return false
}

func onPath() string {
	if redistest.Available() {
		return ", though it is on PATH"
	}
	return ": not on PATH"
}

// runOne measures lib in scenario s for cfg.duration.
func runOne(ctx context.Context, e *env, s scenario, lib libs.Lib, cfg config, prog *progress, tag string) *Result {
	ns := e.fast
	note := ""
	if s.name == "slow" {
		if lib.Name == "floor" && s.floorOnFast {
			note = "floor without the slow node, idling 4×slow after each round like a release through it"
			pe := *e
			pe.pace = 4 * e.slowBy
			e = &pe
		} else {
			ns = e.slow
		}
	}
	ns = lib.Nodes(ns)
	if lib.MaxNodes > 0 && len(e.fast) > lib.MaxNodes {
		note = strings.TrimPrefix(note+"; single-node library: node 0 only", "; ")
	}
	res := &Result{Scenario: s.name, Lib: lib.Name, Nodes: len(ns), Note: note}
	lks, err := instances(e, s, lib, ns, cfg.ttl)
	defer func() {
		for _, l := range lks[1:] {
			l.Close()
		}
	}()
	if err != nil {
		res.Err = err.Error()
		return res
	}
	lk := lks[0]
	rec := &recorder{}
	hard, cancelHard := context.WithTimeout(ctx, cfg.duration+cfg.grace)
	defer cancelHard()
	soft, cancelSoft := context.WithTimeout(context.WithValue(ctx, hardKey{}, hard), cfg.duration)
	defer cancelSoft()
	prog.start(tag+" "+lib.Name+" · "+s.name, cfg.duration, &rec.ops)
	res.Load = loadAverage()
	statsBefore, cpuBefore := commandStats(ctx, ns), serverCPU(ctx, ns)
	clientBefore := processCPU()
	pooled := nodeClientsOf(lks, ns)
	poolBefore := poolStats(pooled)
	start := time.Now()
	name := fmt.Sprintf("lockbench:%s:%s:%d", lib.Name, s.name, start.UnixNano())
	if s.runMany != nil {
		err = s.runMany(soft, e, lks, name, rec)
	} else {
		err = s.run(soft, e, lk, name, rec)
	}
	res.Elapsed = time.Since(start)
	client := processCPU() - clientBefore
	poolAfter := poolStats(pooled)
	statsAfter, cpuAfter := commandStats(ctx, ns), serverCPU(ctx, ns)
	cpu := cpuAfter - cpuBefore
	if cerr := lk.Close(); err == nil {
		err = cerr
	}
	prog.stop()
	if err != nil && ctx.Err() == nil {
		res.Err = err.Error()
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.lastErr != nil && res.Err == "" {
		res.Err = rec.lastErr.Error()
	}
	res.Samples = rec.samples
	res.Errors = rec.errs
	res.Fair = rec.fair
	res.Ops = len(rec.samples)
	if res.Ops > 0 && statsBefore != nil && statsAfter != nil {
		res.Commands = perOp(statsBefore, statsAfter, res.Ops)
		for _, c := range res.Commands {
			res.ServerUS += c.Usec
		}
	}
	if res.Ops > 0 {
		res.Pool = poolPerOp(poolBefore, poolAfter, res.Ops)
	}
	if res.Ops > 0 && cpuBefore >= 0 && cpuAfter >= 0 && cpu > 0 {
		res.ServerCPUUS = cpu / float64(res.Ops)
	}
	if res.Ops > 0 && clientBefore >= 0 && client > 0 {
		res.ClientCPUUS = float64(client.Microseconds()) / float64(res.Ops)
	}
	d := make([]time.Duration, len(rec.samples))
	for i, sm := range rec.samples {
		d[i] = sm.D
	}
	res.Summary = summarize(d)
	if res.Elapsed > 0 {
		res.OpsPerSec = float64(res.Ops) / res.Elapsed.Seconds()
	}
	return res
}

// instances returns the lockers lib runs scenario s with: one over ns, or
// for a scenario of several instances (runMany) s.instances(e) of them (or
// e.clients), over ns or, with s.ownNodes, each over node clients of its
// own, closed when it is. On error it returns what it built, lks[0] a
// closed placeholder if nothing was: the caller closes lks[1:].
func instances(e *env, s scenario, lib libs.Lib, ns []redis.UniversalClient, ttl time.Duration) ([]libs.Locker, error) {
	n := 1
	if s.runMany != nil {
		n = e.clients
		if s.instances != nil {
			n = s.instances(e)
		}
	}
	lks := []libs.Locker{}
	for len(lks) < n {
		var (
			l   libs.Locker
			err error
		)
		if s.ownNodes && s.runMany != nil && e.opts != nil {
			own := nodes.Clients(e.opts)
			// A connection to each node before the timed region, as the
			// shared clients have from earlier runs: a run measures
			// locking, not dialing.
			warm(own)
			l, err = lib.New(lib.Nodes(own), ttl)
			if err == nil {
				l = ownedNodes{l, own}
			} else {
				nodes.CloseAll(own)
			}
		} else {
			l, err = lib.New(ns, ttl)
		}
		if err != nil {
			if len(lks) == 0 {
				lks = append(lks, nopLocker{})
			}
			return lks, err
		}
		lks = append(lks, l)
	}
	return lks, nil
}

// warm opens a connection to each node of cs (a PING, errors ignored:
// the run reports them).
func warm(cs []redis.UniversalClient) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for _, c := range cs {
		_ = c.Ping(ctx).Err()
	}
}

// ownedNodes is a Locker over node clients of its own, which Close closes
// after the Locker.
type ownedNodes struct {
	libs.Locker
	nodes []redis.UniversalClient
}

func (o ownedNodes) Close() error {
	return errors.Join(o.Locker.Close(), nodes.CloseAll(o.nodes))
}

// nopLocker stands for a Locker that could not be built.
type nopLocker struct{}

func (nopLocker) Lock(context.Context, string) (libs.Held, error) { return nil, errors.ErrUnsupported }
func (nopLocker) Close() error                                    { return nil }

// ratios fills VsFloor and VsRedsync from the p50s of the same scenario.
func ratios(rs []*Result) {
	p50 := map[[2]string]time.Duration{}
	for _, r := range rs {
		if r.Err == "" && r.Summary.N > 0 {
			p50[[2]string{r.Scenario, r.Lib}] = r.Summary.P50
		}
	}
	for _, r := range rs {
		if r.Summary.N == 0 {
			continue
		}
		if f := p50[[2]string{r.Scenario, "floor"}]; f > 0 && r.Lib != "floor" {
			r.VsFloor = float64(r.Summary.P50) / float64(f)
		}
		if s := p50[[2]string{r.Scenario, "redsync"}]; s > 0 && r.Lib != "redsync" {
			r.VsRedsync = float64(r.Summary.P50) / float64(s)
		}
	}
}

func serverVersion(ctx context.Context, c redis.UniversalClient) string {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			return v
		}
	}
	return ""
}

func writeFile(path string, rep *Report, write func(io.Writer, *Report) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f, rep); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", path, err)
	}
	return f.Close()
}

// writeMany holds cfg.many quorumlock locks, renewed batched and then
// unbatched, and prints what holding them costs (the hold package).
func writeMany(ctx context.Context, stdout io.Writer, opts []*redis.Options, cfg config) error {
	iv := (cfg.ttl / 3).Round(time.Millisecond)
	fmt.Fprintf(stdout, "\nholding %d auto-renewed quorumlock locks (TTL %v, renewed every %v) for %v:\n", cfg.many, cfg.ttl, iv, cfg.duration)
	if cfg.duration < 2*iv {
		fmt.Fprintf(stdout, "(to see renewals, run for several intervals: -duration %v or more, or a shorter -ttl)\n", 3*iv)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, hold.Header)
	for _, mode := range []string{"batched", "unbatched"} {
		r, err := hold.Measure(ctx, opts, cfg.many, mode, cfg.ttl, cfg.duration, io.Discard)
		if err != nil {
			fmt.Fprintf(tw, "%d\t%s\tfailed: %.80s\t\n", cfg.many, mode, strings.ReplaceAll(err.Error(), "\n", "; "))
			continue
		}
		// The locks were released by Close (the nodes may be the user's:
		// nothing is flushed), so the next mode can take them again.
		fmt.Fprintln(tw, r.Row())
	}
	return tw.Flush()
}

// loadAverage returns the machine's 1-minute load average
// (/proc/loadavg), or -1 where it cannot be read. On a machine whose
// cores other work shares, it says how much CPU the run had to itself.
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f, _, _ := strings.Cut(string(b), " ")
	v, err := strconv.ParseFloat(f, 64)
	if err != nil {
		return -1
	}
	return v
}

// serverCPU sums used_cpu_user and used_cpu_sys of INFO cpu over the
// nodes, in µs: the CPU time the server processes used, network I/O
// included. It returns -1 when a node cannot tell (miniredis).
func serverCPU(ctx context.Context, ns []redis.UniversalClient) float64 {
	v, err := nodes.CPU(ctx, ns)
	if err != nil {
		return -1
	}
	return v
}

// commandStats reads INFO commandstats of every node and sums each
// command's calls and usec over the nodes (nodes.CommandStats). It returns
// nil when a node cannot tell (miniredis has no commandstats).
func commandStats(ctx context.Context, ns []redis.UniversalClient) map[string]CmdCost {
	m, err := nodes.CommandStats(ctx, ns)
	if err != nil {
		return nil
	}
	return m
}

// perOp returns, per command, the calls and usec between two readings of
// commandStats divided by ops, leaving out INFO (lockbench's own reads)
// and commands that did not run.
func perOp(before, after map[string]CmdCost, ops int) map[string]CmdCost {
	out := map[string]CmdCost{}
	for name, a := range after {
		if name == "info" {
			continue
		}
		b := before[name]
		if a.Calls <= b.Calls {
			continue
		}
		out[name] = CmdCost{Calls: (a.Calls - b.Calls) / float64(ops), Usec: (a.Usec - b.Usec) / float64(ops)}
	}
	return out
}
