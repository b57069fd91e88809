package main

import (
	"slices"
	"time"

	"github.com/quorumlock/quorumlock/benchmarks/internal/nodes"
)

// minSamples is the number of samples per run under which a p90 or p99 is
// flagged: with fewer than 100 samples the nearest-rank p99 is the maximum,
// and the p90 one of the top few samples, so both say little about a tail.
const minSamples = 100

// Run is what one of the -count repetitions of a library in a scenario
// measured; a Result carries the same figures combined over its runs.
type Run struct {
	Ops       int           `json:"ops"`
	Errors    int           `json:"errors"`
	Err       string        `json:"error,omitempty"`
	Elapsed   time.Duration `json:"elapsed_ns"`
	OpsPerSec float64       `json:"ops_per_sec"`
	Summary   Summary       `json:"summary"`
	Fair      *Fairness     `json:"fairness,omitempty"`
	// ServerUS is the nodes' CPU time per operation, in µs: the usec of
	// every command in INFO commandstats, summed over the nodes, before and
	// after the run (0 when it could not be read).
	ServerUS float64 `json:"server_us_per_op,omitempty"`
	// ServerCPUUS is the nodes' process CPU time per operation, in µs:
	// used_cpu_user + used_cpu_sys of INFO cpu, summed over the nodes,
	// before and after the run. Unlike ServerUS it counts the network I/O
	// and counts a command called from a script once (commandstats counts
	// it in the script's time and again under its own name), but it also
	// counts anything else the nodes did meanwhile: read it on nodes that
	// serve lockbench alone, as the embedded ones do.
	ServerCPUUS float64 `json:"server_cpu_us_per_op,omitempty"`
	// ClientCPUUS is lockbench's own process CPU time per operation, in
	// µs (getrusage: user + system), before and after the run: the
	// library's client side, network I/O included. With embedded miniredis
	// nodes it includes the nodes too.
	ClientCPUUS float64 `json:"client_cpu_us_per_op,omitempty"`
	// Commands is, per command, its calls and usec per operation summed
	// over the nodes (INFO commandstats before and after the run; commands
	// a script calls count under their own names too; lockbench's INFO
	// left out). Nil when it could not be read.
	Commands map[string]CmdCost `json:"commands_per_op,omitempty"`
	// Pool is what the library's go-redis node clients' pools did per
	// operation (PoolStats before and after the run, summed over the node
	// clients the run used, its own or shared). Nil when none was read.
	Pool *PoolCost `json:"pool_per_op,omitempty"`
	// Load is the machine's 1-minute load average when the run started
	// (-1: unknown); merged results keep the lowest and highest.
	Load    float64 `json:"load"`
	LoadMax float64 `json:"load_max,omitempty"`
}

// CmdCost is one command's share of an operation: calls and usec (time
// inside the command, INFO commandstats' usec) per operation, summed over
// the nodes.
type CmdCost = nodes.CmdCost

// Spread is, for one figure, (max − min) / median over the runs: 0.1 means
// the runs lay within 10% of their median's size of each other. It is 0
// with fewer than two runs.
type Spread struct {
	OpsPerSec float64 `json:"ops_per_sec"`
	P50       float64 `json:"p50"`
	P99       float64 `json:"p99"`
	// ServerCPU is the spread of the nodes' CPU per operation.
	ServerCPU float64 `json:"server_cpu"`
}

// merge combines the runs of one library in one scenario, in run order,
// into one Result: ops/s and the percentiles are the medians over the runs
// (the mean too), max is the largest sample of all, the counts are sums,
// and the samples are every run's, tagged with their run. Fairness adds up
// the handoffs and keeps the longest wait.
func merge(runs []*Result) *Result {
	if len(runs) == 1 {
		r := runs[0]
		r.MinRunN = r.Summary.N
		r.LoadMax = r.Load
		r.Runs = []*Run{runOf(r)}
		return r
	}
	first := runs[0]
	m := &Result{Scenario: first.Scenario, Lib: first.Lib, Nodes: first.Nodes, Note: first.Note, MinRunN: -1}
	m.Load, m.LoadMax = -1, -1
	var rates, server, serverCPU, clientCPU []float64
	var pools []PoolCost
	cmds := map[string][]CmdCost{}
	withCmds := 0
	var p50, p90, p99, mean []time.Duration
	for i, r := range runs {
		m.Runs = append(m.Runs, runOf(r))
		m.Ops += r.Ops
		m.Errors += r.Errors
		m.Elapsed += r.Elapsed
		if m.Err == "" {
			m.Err = r.Err
		}
		for _, s := range r.Samples {
			s.Run = i
			m.Samples = append(m.Samples, s)
		}
		if r.Load >= 0 {
			if m.Load < 0 || r.Load < m.Load {
				m.Load = r.Load
			}
			m.LoadMax = max(m.LoadMax, r.Load)
		}
		if m.MinRunN < 0 || r.Summary.N < m.MinRunN {
			m.MinRunN = r.Summary.N
		}
		m.Summary.N += r.Summary.N
		m.Summary.Max = max(m.Summary.Max, r.Summary.Max)
		if r.Fair != nil {
			if m.Fair == nil {
				m.Fair = &Fairness{}
			}
			if r.Fair.LongestWait > m.Fair.LongestWait {
				m.Fair.LongestWait, m.Fair.Censored = r.Fair.LongestWait, r.Fair.Censored
			}
			m.Fair.Handoffs += r.Fair.Handoffs
			m.Fair.ToOther += r.Fair.ToOther
			if len(m.Fair.PerInstance) < len(r.Fair.PerInstance) {
				m.Fair.PerInstance = append(m.Fair.PerInstance, make([]int, len(r.Fair.PerInstance)-len(m.Fair.PerInstance))...)
			}
			for i, n := range r.Fair.PerInstance {
				m.Fair.PerInstance[i] += n
			}
		}
		if r.Summary.N == 0 {
			continue // a failed run has no figures to take the median of
		}
		rates = append(rates, r.OpsPerSec)
		server = append(server, r.ServerUS)
		serverCPU = append(serverCPU, r.ServerCPUUS)
		clientCPU = append(clientCPU, r.ClientCPUUS)
		if r.Pool != nil {
			pools = append(pools, *r.Pool)
		}
		if r.Commands != nil {
			withCmds++
			for name, c := range r.Commands {
				cmds[name] = append(cmds[name], c)
			}
		}
		p50 = append(p50, r.Summary.P50)
		p90 = append(p90, r.Summary.P90)
		p99 = append(p99, r.Summary.P99)
		mean = append(mean, r.Summary.Mean)
	}
	m.OpsPerSec = medianFloat(rates)
	m.ServerUS = medianFloat(server)
	m.ServerCPUUS = medianFloat(serverCPU)
	m.ClientCPUUS = medianFloat(clientCPU)
	m.Summary.P50, m.Summary.P90, m.Summary.P99, m.Summary.Mean = medianDur(p50), medianDur(p90), medianDur(p99), medianDur(mean)
	m.Spread = Spread{OpsPerSec: spread(rates), P50: spreadDur(p50), P99: spreadDur(p99), ServerCPU: spread(serverCPU)}
	if len(pools) > 0 {
		m.Pool = medianPool(pools)
	}
	if withCmds > 0 {
		// Per command, the median over the runs that read the stats; a
		// command a run did not call counts 0 there.
		m.Commands = map[string]CmdCost{}
		for name, cs := range cmds {
			calls, usec := make([]float64, withCmds), make([]float64, withCmds)
			for i, c := range cs {
				calls[i], usec[i] = c.Calls, c.Usec
			}
			m.Commands[name] = CmdCost{Calls: medianFloat(calls), Usec: medianFloat(usec)}
		}
	}
	return m
}

func runOf(r *Result) *Run {
	run := r.Run
	return &run
}

// medianFloat returns the median of xs (the mean of the middle two for an
// even count), 0 for none.
func medianFloat(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

func medianDur(ds []time.Duration) time.Duration {
	return time.Duration(medianFloat(floats(ds)))
}

// spread returns (max − min) / median of xs; 0 with fewer than two values
// or a zero median.
func spread(xs []float64) float64 {
	med := medianFloat(xs)
	if len(xs) < 2 || med == 0 {
		return 0
	}
	return (slices.Max(xs) - slices.Min(xs)) / med
}

func spreadDur(ds []time.Duration) float64 { return spread(floats(ds)) }

func floats(ds []time.Duration) []float64 {
	xs := make([]float64, len(ds))
	for i, d := range ds {
		xs[i] = float64(d)
	}
	return xs
}
