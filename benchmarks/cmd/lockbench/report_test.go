package main

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/benchmarks/internal/nodes"
)

func TestFmtDur(t *testing.T) {
	t.Parallel()
	cases := []struct {
		in   time.Duration
		want string
	}{
		{0, "0"},
		{812, "812ns"},
		{45300, "45.3µs"},
		{1243 * time.Microsecond, "1.24ms"},
		{131 * time.Millisecond, "131ms"},
		{2050 * time.Millisecond, "2.05s"},
		{999999, "1000µs"},
	}
	for _, tc := range cases {
		if got := fmtDur(tc.in); got != tc.want {
			t.Errorf("fmtDur(%d) = %q; want %q", int64(tc.in), got, tc.want)
		}
	}
}

func testReport() *Report {
	mk := func(scen, lib string, nodes int, ds ...time.Duration) *Result {
		r := &Result{Scenario: scen, Lib: lib, Nodes: nodes, Run: Run{Ops: len(ds), Elapsed: time.Second, OpsPerSec: float64(len(ds))}}
		for i, d := range ds {
			r.Samples = append(r.Samples, sample{Client: i % 2, D: d})
		}
		r.Summary = summarize(ds)
		return merge([]*Result{r})
	}
	rep := &Report{Nodes: "3 test nodes", NodeCount: 3, Machine: "test", TTL: "8s", Duration: "1s", Clients: 8, Resources: 1, Slow: "20ms",
		Count: 1, Versions: Versions{Go: "go1.26.0", Redis: "7.0.15", Quorumlock: "abc123", Libs: map[string]string{"redsync": "v4.18.1", "go-redis": "v9.23.0"}}}
	rep.Results = []*Result{
		mk("uncontended", "quorumlock", 3, ms(2, 2, 4)...),
		mk("uncontended", "redsync", 3, ms(4, 4, 8)...),
		mk("uncontended", "floor", 3, ms(1, 1, 2)...),
		mk("contended", "quorumlock", 3, ms(1, 300)...),
	}
	rep.Results[3].Fair = &Fairness{LongestWait: 300 * time.Millisecond, Handoffs: 4, ToOther: 3}
	rep.Results[3].ServerUS, rep.Results[3].ServerCPUUS, rep.Results[3].ClientCPUUS = 111, 222, 333
	rep.Results[3].Load, rep.Results[3].LoadMax = 1.5, 2.5
	rep.Results = append(rep.Results, &Result{Scenario: "contended", Lib: "redsync", Nodes: 3, Note: "a note", Run: Run{Err: "boom"}})
	ratios(rep.Results)
	return rep
}

func TestRatios(t *testing.T) {
	t.Parallel()
	rep := testReport()
	q := rep.Results[0]
	if q.VsFloor != 2 || q.VsRedsync != 0.5 {
		t.Errorf("quorumlock ratios = %v vs floor, %v vs redsync; want 2, 0.5", q.VsFloor, q.VsRedsync)
	}
	if f := rep.Results[2]; f.VsFloor != 0 {
		t.Errorf("floor's ratio to itself = %v; want 0 (none)", f.VsFloor)
	}
	if c := rep.Results[3]; c.VsFloor != 0 || c.VsRedsync != 0 {
		t.Errorf("contended ratios = %v, %v; want none (no floor, redsync failed)", c.VsFloor, c.VsRedsync)
	}
}

func TestWriteTables(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	writeTables(&b, testReport(), false)
	out := b.String()
	lines := strings.Split(out, "\n")
	if !strings.HasPrefix(lines[0], "scenario") || !strings.Contains(lines[0], "p50 vs floor") {
		t.Fatalf("first line = %q; want the header", lines[0])
	}
	// Columns are aligned: every row of the first table has the header's width.
	w := len([]rune(lines[0]))
	for _, l := range lines[1:5] {
		if got := len([]rune(l)); got != w {
			t.Errorf("row %q is %d wide; want %d like the header", l, got, w)
		}
	}
	for _, want := range []string{"2.00ms", "2.00×", "0.50×", "error: boom", "redsync: a note", "300ms", "75.0%",
		"† fewer than 100 samples in a run (uncontended/quorumlock n=3", "* to another: share of handoffs"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "spread") {
		t.Errorf("one run, yet the table has spread columns:\n%s", out)
	}
	// The contended row carries the fairness columns beside its ratio.
	for _, l := range lines {
		if strings.HasPrefix(l, "contended") && strings.Contains(l, "quorumlock") && strings.Contains(l, "%") {
			if f := strings.Fields(l); strings.Join(f[len(f)-2:], " ") != "75.0% 300ms" {
				t.Errorf("contended row = %q; want it to end with the share to another goroutine and the longest wait", l)
			}
		}
	}

	// The cost table has the server and client CPU per operation and their
	// sum, for the results that measured them only (no redsync figure to
	// compare with here: "–"), and the load.
	costRows := 0
	for _, l := range lines {
		if f := strings.Fields(l); len(f) == 9 && f[0] == "contended" && strings.Join(f[3:], " ") == "111 222 – 333 555 1.5–2.5" {
			costRows++
		}
	}
	if costRows != 1 || !strings.Contains(out, "client CPU µs/op") || strings.Count(out, "\nuncontended") != 3 {
		t.Errorf("want one cost row, for contended/quorumlock: 111 222 – 333 555 1.5–2.5:\n%s", out)
	}

	b.Reset()
	writeTables(&b, testReport(), true)
	md := strings.Split(b.String(), "\n")
	if !strings.HasPrefix(md[0], "| scenario |") || !strings.HasPrefix(md[1], "|---|---|---:") {
		t.Errorf("markdown table starts %q / %q; want a header and an alignment row", md[0], md[1])
	}
}

func TestWriteCSV(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	if err := writeCSV(&b, testReport()); err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(&b).ReadAll()
	if err != nil {
		t.Fatalf("CSV does not parse: %v", err)
	}
	if got, want := len(recs), 1+3+3+3+2; got != want {
		t.Fatalf("CSV has %d records; want %d (header + one per sample)", got, want)
	}
	if got, want := strings.Join(recs[1], ","), "uncontended,quorumlock,abc123,3,1,0,0,2000000,go1.26.0,7.0.15,abc123"; got != want {
		t.Errorf("first sample = %q; want %q", got, want)
	}
}

func TestWriteJSON(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	if err := writeJSON(&b, testReport()); err != nil {
		t.Fatal(err)
	}
	var got struct {
		NodeCount int `json:"node_count"`
		Versions  struct {
			Redis string            `json:"redis"`
			Libs  map[string]string `json:"libs"`
		} `json:"versions"`
		Results []struct {
			Lib       string  `json:"lib"`
			SamplesNS []int64 `json:"samples_ns"`
			Summary   struct {
				P50 int64 `json:"p50_ns"`
			} `json:"summary"`
			VsFloor  float64 `json:"vs_floor"`
			Fairness *struct {
				Handoffs int `json:"handoffs"`
			} `json:"fairness"`
		} `json:"results"`
	}
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatalf("JSON does not parse: %v", err)
	}
	if got.NodeCount != 3 || len(got.Results) != 5 {
		t.Fatalf("JSON has node_count %d and %d results; want 3 and 5", got.NodeCount, len(got.Results))
	}
	if got.Versions.Redis != "7.0.15" || got.Versions.Libs["redsync"] != "v4.18.1" {
		t.Errorf("JSON versions = %+v; want Redis 7.0.15, redsync v4.18.1", got.Versions)
	}
	r := got.Results[0]
	if r.Lib != "quorumlock" || len(r.SamplesNS) != 3 || r.Summary.P50 != int64(2*time.Millisecond) || r.VsFloor != 2 {
		t.Errorf("first result = %+v; want quorumlock, 3 samples, p50 2ms, 2× the floor", r)
	}
	if f := got.Results[3].Fairness; f == nil || f.Handoffs != 4 {
		t.Errorf("contended fairness = %+v; want 4 handoffs", f)
	}
}

// TestWriteTables_count checks the columns and notes of a report over
// several runs.
func TestWriteTables_count(t *testing.T) {
	t.Parallel()
	rep := testReport()
	rep.Count = 3
	rep.Results[0].Spread = Spread{OpsPerSec: 0.12, P50: 0.25}
	var b bytes.Buffer
	writeTables(&b, rep, true)
	out := b.String()
	for _, want := range []string{"| ops/s spread | p50 spread |", "| 12% | 25% |", "medians over 3 runs"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

// TestCommandStats reads INFO commandstats, takes the difference per
// operation, and prints it per node.
func TestCommandStats(t *testing.T) {
	before := nodes.ParseCommandStats("# Commandstats\r\ncmdstat_evalsha:calls=10,usec=100,usec_per_call=10.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_info:calls=5,usec=50,usec_per_call=10.00\r\ncmdstat_pubsub|numsub:calls=2,usec=4,usec_per_call=2.00\r\n")
	after := nodes.ParseCommandStats("cmdstat_evalsha:calls=30,usec=500,usec_per_call=16.67\r\ncmdstat_info:calls=9,usec=90,usec_per_call=10.00\r\n" +
		"cmdstat_pubsub|numsub:calls=2,usec=4,usec_per_call=2.00\r\ncmdstat_zadd:calls=10,usec=30,usec_per_call=3.00\r\n")
	got := perOp(before, after, 10)
	want := map[string]CmdCost{"evalsha": {Calls: 2, Usec: 40}, "zadd": {Calls: 1, Usec: 3}}
	if len(got) != len(want) {
		t.Fatalf("perOp = %v; want %v (INFO and commands that did not run left out)", got, want)
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("perOp[%q] = %v; want %v", k, got[k], w)
		}
	}

	rep := &Report{Count: 1, Results: []*Result{{Scenario: "clients", Lib: "quorumlock", Nodes: 2,
		Run: Run{Ops: 10, Summary: Summary{N: 10}, Commands: got}}}}
	var b strings.Builder
	writeCommands(&b, rep, false)
	var rows []string
	for l := range strings.Lines(b.String()) {
		if f := strings.Fields(l); len(f) >= 4 && f[0] == "clients" {
			rows = append(rows, strings.Join(f[2:], " "))
		}
	}
	wantRows := []string{"EVALSHA 1.00 20.0 20.0", "ZADD 0.50 3.00 1.50", "(all) 1.50 21.5"}
	if strings.Join(rows, "; ") != strings.Join(wantRows, "; ") {
		t.Errorf("writeCommands rows = %q; want %q (per node, most called first, then the sum):\n%s", rows, wantRows, b.String())
	}
}
