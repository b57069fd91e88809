package main

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// fmtDur prints d with three significant digits in the unit that suits it:
// 812ns, 45.3µs, 1.24ms, 131ms, 2.05s.
func fmtDur(d time.Duration) string {
	if d <= 0 {
		return "0"
	}
	units := []struct {
		name string
		size time.Duration
	}{{"s", time.Second}, {"ms", time.Millisecond}, {"µs", time.Microsecond}, {"ns", 1}}
	for _, u := range units {
		if d >= u.size || u.size == 1 {
			v := float64(d) / float64(u.size)
			switch {
			case v >= 100 || u.size == 1:
				return strconv.FormatFloat(math.Round(v), 'f', 0, 64) + u.name
			case v >= 10:
				return strconv.FormatFloat(v, 'f', 1, 64) + u.name
			default:
				return strconv.FormatFloat(v, 'f', 2, 64) + u.name
			}
		}
	}
	return d.String()
}

func fmtRatio(r float64) string {
	if r == 0 {
		return "–"
	}
	return strconv.FormatFloat(r, 'f', 2, 64) + "×"
}

// fmtRate prints a rate (or any positive figure) with about three
// significant digits: 1234, 12.3, 1.23.
func fmtRate(r float64) string {
	switch {
	case r >= 100:
		return strconv.FormatFloat(r, 'f', 0, 64)
	case r >= 10:
		return strconv.FormatFloat(r, 'f', 1, 64)
	}
	return strconv.FormatFloat(r, 'f', 2, 64)
}

// table is a text table: columns are right-aligned except the first two.
type table struct {
	head []string
	rows [][]string
}

func (t *table) add(cells ...string) { t.rows = append(t.rows, cells) }

func (t *table) write(w io.Writer, markdown bool) {
	if markdown {
		fmt.Fprintf(w, "| %s |\n", strings.Join(t.head, " | "))
		seps := make([]string, len(t.head))
		for i := range seps {
			seps[i] = "---:"
			if i < 2 {
				seps[i] = "---"
			}
		}
		fmt.Fprintf(w, "|%s|\n", strings.Join(seps, "|"))
		for _, r := range t.rows {
			fmt.Fprintf(w, "| %s |\n", strings.Join(r, " | "))
		}
		return
	}
	width := make([]int, len(t.head))
	for _, r := range append([][]string{t.head}, t.rows...) {
		for i, c := range r {
			width[i] = max(width[i], len([]rune(c)))
		}
	}
	for _, r := range append([][]string{t.head}, t.rows...) {
		var b strings.Builder
		for i, c := range r {
			pad := strings.Repeat(" ", width[i]-len([]rune(c)))
			if i > 0 {
				b.WriteString("  ")
			}
			if i < 2 {
				b.WriteString(c + pad)
			} else {
				b.WriteString(pad + c)
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
}

// writeTables prints the latency table and, when the contended scenario
// ran, the fairness table. The contended rows of the latency table carry
// the fairness columns too, beside the p50 ratio they qualify: a lock that
// hands itself back to its releaser shows a small wait p50 while the other
// goroutines wait for long.
func writeTables(w io.Writer, rep *Report, markdown bool) {
	repeated := rep.Count > 1
	head := []string{"scenario", "lib", "nodes", "ops", "ops/s", "p50", "p90", "p99", "max"}
	if repeated {
		head = append(head, "ops/s spread", "p50 spread")
	}
	head = append(head, "p50 vs floor", "p50 vs redsync", "to another", "longest wait")
	t := &table{head: head}
	var notes, thin []string
	for _, r := range rep.Results {
		lib := r.Lib
		if r.Note != "" {
			if n := r.Lib + ": " + r.Note; !slices.Contains(notes, n) {
				notes = append(notes, n)
			}
			lib += "*"
		}
		if r.Err != "" && r.Summary.N == 0 {
			row := []string{r.Scenario, lib, strconv.Itoa(r.Nodes), "0", "–", "–", "–", "–", "–"}
			if repeated {
				row = append(row, "–", "–")
			}
			t.add(append(row, "–", "–", "–", "error: "+r.Err)...)
			continue
		}
		p90, p99 := fmtDur(r.Summary.P90), fmtDur(r.Summary.P99)
		if r.MinRunN < minSamples {
			p90, p99 = p90+"†", p99+"†"
			thin = append(thin, fmt.Sprintf("%s/%s n=%d", r.Scenario, r.Lib, r.MinRunN))
		}
		row := []string{r.Scenario, lib, strconv.Itoa(r.Nodes), strconv.Itoa(r.Ops), fmtRate(r.OpsPerSec),
			fmtDur(r.Summary.P50), p90, p99, fmtDur(r.Summary.Max)}
		if repeated {
			row = append(row, fmtSpread(r.Spread.OpsPerSec), fmtSpread(r.Spread.P50))
		}
		other, longest := "–", "–"
		if r.Fair != nil {
			other, longest = fmtShare(r.Fair), fmtWait(r.Fair)
		}
		t.add(append(row, fmtRatio(r.VsFloor), fmtRatio(r.VsRedsync), other, longest)...)
	}
	t.write(w, markdown)
	for _, n := range notes {
		fmt.Fprintf(w, "* %s\n", n)
	}
	if repeated {
		fmt.Fprintf(w, "* ops/s, p50, p90, p99: medians over %d runs; ops and max: all runs; spread: (max − min) / median over the runs\n", rep.Count)
	}
	if hasFairness(rep) {
		fmt.Fprintln(w, "* to another: share of handoffs that went to a goroutine (contended) or an instance (clients, shared, mixed) other than the one that held it before; longest wait: the longest single Lock call; per instance: each instance's share of the acquisitions (lowest–highest beyond 4 instances)")
	}
	if len(thin) > 0 {
		fmt.Fprintf(w, "† fewer than %d samples in a run (%s): p90 and p99 are among its top few samples, close to the max; run longer (-duration)\n",
			minSamples, strings.Join(thin, ", "))
	}
	for _, r := range rep.Results {
		if r.Err != "" {
			fmt.Fprintf(w, "! %s/%s: %d errors, last: %s\n", r.Scenario, r.Lib, max(r.Errors, 1), r.Err)
		}
	}

	ft := &table{head: []string{"contenders", "lib", "nodes", "acquisitions", "acq/s", "longest wait in Lock", "handoffs", "to another", "per instance", "server CPU µs/acq"}}
	for _, r := range rep.Results {
		if r.Fair == nil {
			continue
		}
		wait := fmtWait(r.Fair)
		if r.Fair.Censored {
			wait += " (still waiting at the end)"
		}
		who := contenders(r, rep)
		cpu := "–"
		if r.ServerCPUUS > 0 {
			cpu = strconv.FormatFloat(r.ServerCPUUS, 'f', 0, 64)
		}
		ft.add(who, r.Lib, strconv.Itoa(r.Nodes), strconv.Itoa(r.Ops), fmtRate(r.OpsPerSec),
			wait, strconv.Itoa(r.Fair.Handoffs), fmtShare(r.Fair), fmtShares(r.Fair), cpu)
	}
	if len(ft.rows) > 0 {
		fmt.Fprintln(w)
		ft.write(w, markdown)
	}
	writeCost(w, rep, markdown)
	fmt.Fprintln(w)
}

// writeCost prints what one operation cost the nodes and the client, for
// every result that could read it, with the nodes' CPU beside redsync's in
// the same scenario and the load the runs saw.
func writeCost(w io.Writer, rep *Report, markdown bool) {
	repeated := rep.Count > 1
	head := []string{"scenario", "lib", "nodes", "server µs/op", "server CPU µs/op"}
	if repeated {
		head = append(head, "server CPU spread")
	}
	head = append(head, "server CPU vs redsync", "client CPU µs/op", "CPU µs/op", "load")
	ct := &table{head: head}
	us := func(v float64) string {
		if v <= 0 {
			return "–"
		}
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	redsyncCPU := map[string]float64{}
	for _, r := range rep.Results {
		if r.Lib == "redsync" && r.Summary.N > 0 {
			redsyncCPU[r.Scenario] = r.ServerCPUUS
		}
	}
	for _, r := range rep.Results {
		if r.Summary.N == 0 || (r.ServerUS <= 0 && r.ServerCPUUS <= 0 && r.ClientCPUUS <= 0) {
			continue
		}
		total := 0.0
		if r.ServerCPUUS > 0 && r.ClientCPUUS > 0 {
			total = r.ServerCPUUS + r.ClientCPUUS
		}
		row := []string{r.Scenario, r.Lib, strconv.Itoa(r.Nodes), us(r.ServerUS), us(r.ServerCPUUS)}
		if repeated {
			row = append(row, fmtSpread(r.Spread.ServerCPU))
		}
		vs := 0.0
		if s := redsyncCPU[r.Scenario]; s > 0 && r.ServerCPUUS > 0 && r.Lib != "redsync" {
			vs = r.ServerCPUUS / s
		}
		ct.add(append(row, fmtRatio(vs), us(r.ClientCPUUS), us(total), fmtLoad(r.Load, r.LoadMax))...)
	}
	if len(ct.rows) == 0 {
		return
	}
	fmt.Fprintln(w)
	ct.write(w, markdown)
	fmt.Fprintln(w, "* per operation (an acquisition in the scenarios of contenders: contended, clients, shared, mixed), each read before and after the run: server µs: the nodes' command time (INFO commandstats: wall time in commands; a command called from a script counts in the script's time and again under its own name; network I/O left out); server CPU µs: the node processes' CPU time (INFO cpu: used_cpu_user + used_cpu_sys; network I/O included), summed over the nodes; client CPU µs: lockbench's own process CPU time (getrusage: the library's client side, network I/O included; with embedded miniredis, the nodes too; with -node-latency, the proxies too); CPU µs: server CPU + client CPU, what the operation cost the machine; load: the 1-minute load average as the runs started (lowest–highest)")
}

// writeCommands prints, for every result that read INFO commandstats, the
// commands one operation ran on a node: calls per operation per node, µs
// per call, µs per operation per node, most called first.
func writeCommands(w io.Writer, rep *Report, markdown bool) {
	ct := &table{head: []string{"scenario", "lib", "command", "calls/op/node", "µs/call", "µs/op/node"}}
	num := fmtRate // three significant digits, as the rates
	for _, r := range rep.Results {
		if r.Summary.N == 0 || len(r.Commands) == 0 || r.Nodes == 0 {
			continue
		}
		names := make([]string, 0, len(r.Commands))
		for n := range r.Commands {
			names = append(names, n)
		}
		slices.SortFunc(names, func(a, b string) int {
			if ca, cb := r.Commands[a].Calls, r.Commands[b].Calls; ca != cb {
				if ca > cb {
					return -1
				}
				return 1
			}
			return strings.Compare(a, b)
		})
		n := float64(r.Nodes)
		var calls, usec float64
		for _, name := range names {
			c := r.Commands[name]
			per := 0.0
			if c.Calls > 0 {
				per = c.Usec / c.Calls
			}
			calls += c.Calls
			usec += c.Usec
			ct.add(r.Scenario, r.Lib, strings.ToUpper(name), num(c.Calls/n), num(per), num(c.Usec/n))
		}
		ct.add(r.Scenario, r.Lib, "(all)", num(calls/n), "", num(usec/n))
	}
	pt := &table{head: []string{"scenario", "lib", "pool waits/op", "pool wait µs/op", "dials/op", "pool timeouts/op"}}
	for _, r := range rep.Results {
		if r.Summary.N == 0 || r.Pool == nil {
			continue
		}
		pc := r.Pool
		pt.add(r.Scenario, r.Lib, num(pc.Waits), num(pc.WaitUS), num(pc.Dials), num(pc.Timeouts))
	}
	if len(pt.rows) > 0 {
		fmt.Fprintln(w)
		pt.write(w, markdown)
		fmt.Fprintln(w, "* the go-redis pools of the node clients the library used (each instance's own, or the shared ones), PoolStats before and after each run, summed over them and divided by the operations (medians over the runs): a wait is a request that found every connection of its pool busy; a dial a connection the pool had to open")
	}
	if len(ct.rows) == 0 {
		return
	}
	fmt.Fprintln(w)
	ct.write(w, markdown)
	fmt.Fprintln(w, "* commands per operation (an acquisition in the scenarios of contenders: contended, clients, shared, mixed) on one node: INFO commandstats before and after each run, summed over the nodes and divided by the operations and the nodes (medians over the runs); a command a script calls (GET, ZADD, …) is listed under its own name and its time counts again in EVALSHA's, so (all) counts it twice; lockbench's own INFO is left out")
}

// fmtLoad prints a load average, or the range of several, "–" when unknown.
func fmtLoad(lo, hi float64) string {
	if lo < 0 {
		return "–"
	}
	if hi-lo < 0.05 {
		return strconv.FormatFloat(lo, 'f', 1, 64)
	}
	return strconv.FormatFloat(lo, 'f', 1, 64) + "–" + strconv.FormatFloat(hi, 'f', 1, 64)
}

func hasFairness(rep *Report) bool {
	return slices.ContainsFunc(rep.Results, func(r *Result) bool { return r.Fair != nil })
}

// contenders names who contended in r's scenario.
func contenders(r *Result, rep *Report) string {
	n := len(r.Fair.PerInstance)
	switch r.Scenario {
	case "clients":
		return fmt.Sprintf("%d instances / 1 res.", n)
	case "shared":
		return fmt.Sprintf("%d Clients, shared nodes / 1 res.", n)
	case "mixed":
		return fmt.Sprintf("%d instances × %d goroutines / 1 res.", n, max(rep.Clients, n)/max(n, 1))
	}
	return fmt.Sprintf("%d goroutines / %d res.", rep.Clients, rep.Resources)
}

// fmtShares prints each instance's share of the acquisitions when there
// are at most 4 instances, else the lowest and highest share; "–" for none.
func fmtShares(f *Fairness) string {
	sh := f.Shares()
	if len(sh) == 0 {
		return "–"
	}
	pct := func(x float64) string { return strconv.FormatFloat(100*x, 'f', 0, 64) + "%" }
	if len(sh) <= 4 {
		parts := make([]string, len(sh))
		for i, x := range sh {
			parts[i] = pct(x)
		}
		return strings.Join(parts, " / ")
	}
	return pct(slices.Min(sh)) + "–" + pct(slices.Max(sh))
}

func fmtShare(f *Fairness) string { return strconv.FormatFloat(100*f.Share(), 'f', 1, 64) + "%" }

func fmtWait(f *Fairness) string {
	if f.Censored {
		return "≥ " + fmtDur(f.LongestWait)
	}
	return fmtDur(f.LongestWait)
}

// fmtSpread prints a relative spread as a percentage, "–" for none.
func fmtSpread(x float64) string {
	if x == 0 {
		return "–"
	}
	return strconv.FormatFloat(100*x, 'f', 0, 64) + "%"
}

// writeCSV writes one line per sample. Every line also names the versions
// measured, so that files from several runs can be concatenated and still
// be told apart.
func writeCSV(w io.Writer, rep *Report) error {
	cw := csv.NewWriter(w)
	if err := cw.Write([]string{"scenario", "lib", "lib_version", "nodes", "run", "seq", "client", "latency_ns", "go", "redis", "quorumlock"}); err != nil {
		return err
	}
	v := rep.Versions
	for _, r := range rep.Results {
		libVersion := v.Libs[r.Lib]
		switch r.Lib {
		case "quorumlock", "quorumlock+poll":
			libVersion = v.Quorumlock
		case "floor":
			libVersion = v.Libs["go-redis"]
		}
		seq, run := 0, -1
		for _, s := range r.Samples {
			if s.Run != run {
				seq, run = 0, s.Run
			}
			rec := []string{r.Scenario, r.Lib, libVersion, strconv.Itoa(r.Nodes), strconv.Itoa(s.Run + 1), strconv.Itoa(seq),
				strconv.Itoa(s.Client), strconv.FormatInt(int64(s.D), 10), v.Go, v.Redis, v.Quorumlock}
			if err := cw.Write(rec); err != nil {
				return err
			}
			seq++
		}
	}
	cw.Flush()
	return cw.Error()
}

// writeJSON writes the report with every result's samples in nanoseconds.
func writeJSON(w io.Writer, rep *Report) error {
	type result struct {
		*Result
		SamplesNS []int64 `json:"samples_ns"`
		Clients   []int   `json:"sample_clients"`
		RunsOf    []int   `json:"sample_runs"` // 1-based run of each sample
	}
	out := struct {
		*Report
		Results []result `json:"results"`
	}{Report: rep}
	for _, r := range rep.Results {
		x := result{Result: r, SamplesNS: make([]int64, len(r.Samples)), Clients: make([]int, len(r.Samples)), RunsOf: make([]int, len(r.Samples))}
		for i, s := range r.Samples {
			x.SamplesNS[i], x.Clients[i], x.RunsOf[i] = int64(s.D), s.Client, s.Run+1
		}
		out.Results = append(out.Results, x)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}
