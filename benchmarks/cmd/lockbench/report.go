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
// ran, the fairness table.
func writeTables(w io.Writer, rep *Report, markdown bool) {
	t := &table{head: []string{"scenario", "lib", "nodes", "ops", "ops/s", "p50", "p90", "p99", "max", "p50 vs floor", "p50 vs redsync"}}
	var notes []string
	for _, r := range rep.Results {
		lib := r.Lib
		if r.Note != "" {
			if n := r.Lib + ": " + r.Note; !slices.Contains(notes, n) {
				notes = append(notes, n)
			}
			lib += "*"
		}
		if r.Err != "" && r.Summary.N == 0 {
			t.add(r.Scenario, lib, strconv.Itoa(r.Nodes), "0", "–", "–", "–", "–", "–", "–", "error: "+r.Err)
			continue
		}
		t.add(r.Scenario, lib, strconv.Itoa(r.Nodes), strconv.Itoa(r.Ops), fmtRate(r.OpsPerSec),
			fmtDur(r.Summary.P50), fmtDur(r.Summary.P90), fmtDur(r.Summary.P99), fmtDur(r.Summary.Max),
			fmtRatio(r.VsFloor), fmtRatio(r.VsRedsync))
	}
	t.write(w, markdown)
	for _, n := range notes {
		fmt.Fprintf(w, "* %s\n", n)
	}
	for _, r := range rep.Results {
		if r.Err != "" {
			fmt.Fprintf(w, "! %s/%s: %d errors, last: %s\n", r.Scenario, r.Lib, max(r.Errors, 1), r.Err)
		}
	}

	ft := &table{head: []string{"contended", "lib", "nodes", "acquisitions", "acq/s", "longest wait in Lock", "handoffs", "to another goroutine"}}
	for _, r := range rep.Results {
		if r.Fair == nil {
			continue
		}
		wait := fmtDur(r.Fair.LongestWait)
		if r.Fair.Censored {
			wait = "≥ " + wait + " (still waiting at the end)"
		}
		ft.add(fmt.Sprintf("%d clients / %d res.", rep.Clients, rep.Resources), r.Lib, strconv.Itoa(r.Nodes), strconv.Itoa(r.Ops), fmtRate(r.OpsPerSec),
			wait, strconv.Itoa(r.Fair.Handoffs), strconv.FormatFloat(100*r.Fair.Share(), 'f', 1, 64)+"%")
	}
	if len(ft.rows) > 0 {
		fmt.Fprintln(w)
		ft.write(w, markdown)
	}
	fmt.Fprintln(w)
}

// writeCSV writes one line per sample.
func writeCSV(w io.Writer, rep *Report) error {
	cw := csv.NewWriter(w)
	if err := cw.Write([]string{"scenario", "lib", "nodes", "seq", "client", "latency_ns"}); err != nil {
		return err
	}
	for _, r := range rep.Results {
		for i, s := range r.Samples {
			rec := []string{r.Scenario, r.Lib, strconv.Itoa(r.Nodes), strconv.Itoa(i), strconv.Itoa(s.Client), strconv.FormatInt(int64(s.D), 10)}
			if err := cw.Write(rec); err != nil {
				return err
			}
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
	}
	out := struct {
		*Report
		Results []result `json:"results"`
	}{Report: rep}
	for _, r := range rep.Results {
		x := result{Result: r, SamplesNS: make([]int64, len(r.Samples)), Clients: make([]int, len(r.Samples))}
		for i, s := range r.Samples {
			x.SamplesNS[i], x.Clients[i] = int64(s.D), s.Client
		}
		out.Results = append(out.Results, x)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}
