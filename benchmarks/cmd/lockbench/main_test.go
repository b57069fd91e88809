package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/quorumlock/quorumlock/internal/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRun_smoke runs every scenario and library for a short while on the
// embedded default (redis-server when on PATH), and checks the table and
// the files. About two seconds.
func TestRun_smoke(t *testing.T) {
	if !redistest.Available() && os.Getenv("CI") != "" {
		t.Fatal("redis-server not found on PATH (failing, not skipping, because CI is set): " + redistest.InstallHint)
	}
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	args := []string{"-n", "3", "-duration", "100ms", "-grace", "3s", "-clients", "4",
		"-csv", filepath.Join(dir, "s.csv"), "-json", filepath.Join(dir, "s.json"), "-svg", filepath.Join(dir, "s.svg")}
	if err := run(t.Context(), args, &stdout, &stderr); err != nil {
		t.Fatalf("run(%q) = %v\nstdout:\n%s\nstderr:\n%s", args, err, &stdout, &stderr)
	}
	out := stdout.String()
	for _, s := range scenarioNames() {
		if !strings.Contains(out, "\n"+s+" ") {
			t.Errorf("table lacks scenario %q:\n%s", s, out)
		}
	}
	for _, want := range []string{"quorumlock", "redsync", "redislock", "floor", "longest wait in Lock", "to another",
		"\nversions: Go ", ", redsync v4.18.1", "* to another: share of handoffs"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if redistest.Available() && !strings.Contains(out, "redis-server") {
		t.Errorf("header does not say the nodes are redis-server processes:\n%s", out)
	}
	f, err := os.Open(filepath.Join(dir, "s.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	if err != nil || len(recs) < 10 {
		t.Errorf("CSV: %d records, err %v; want samples", len(recs), err)
	}
	for _, name := range []string{"s.json", "s.svg"} {
		if st, err := os.Stat(filepath.Join(dir, name)); err != nil || st.Size() == 0 {
			t.Errorf("%s not written: %v", name, err)
		}
	}
}

// TestRun_miniredis runs on in-process nodes, as on a machine without
// redis-server.
func TestRun_miniredis(t *testing.T) {
	t.Parallel()
	var stdout bytes.Buffer
	args := []string{"-embedded", "miniredis", "-n", "3", "-duration", "100ms", "-scenarios", "uncontended,contended", "-libs", "quorumlock,floor", "-clients", "3", "-markdown", "-count", "2"}
	if err := run(t.Context(), args, &stdout, io.Discard); err != nil {
		t.Fatalf("run(%q) = %v\n%s", args, err, &stdout)
	}
	out := stdout.String()
	for _, want := range []string{"miniredis nodes with ClockTTL(true)", "| uncontended | quorumlock |", "| contended | quorumlock |",
		"medians over 2 runs", "| p50 spread |", "6 runs (3 × -count 2, interleaved)", ", Redis miniredis v2."} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "| contended | floor") {
		t.Errorf("the floor ran the contended scenario; it never waits:\n%s", out)
	}
}

// TestRun_nodeLatency puts every node behind the delaying proxy and prints
// the commands per operation: the header says so, an uncontended Lock+Unlock
// (two rounds, each at least two delayed directions) takes at least 4×d,
// and the commands table lists quorumlock's scripts and the polling
// variant selected by name.
func TestRun_nodeLatency(t *testing.T) {
	if !redistest.Available() {
		if os.Getenv("CI") != "" {
			t.Fatal("redis-server not found on PATH (failing, not skipping, because CI is set): " + redistest.InstallHint)
		}
		t.Skip("redis-server not on PATH: " + redistest.InstallHint)
	}
	// Not parallel: a run of 2ms round trips beside the other runs of this
	// package under -race once completed no operation in 200ms.
	dir := t.TempDir()
	args := []string{"-n", "3", "-duration", "500ms", "-grace", "5s", "-scenarios", "uncontended", "-libs", "quorumlock+poll,redsync",
		"-node-latency", "2ms", "-commands", "-json", filepath.Join(dir, "r.json")}
	out, b := runWants(t, args, filepath.Join(dir, "r.json"),
		"each behind a proxy adding 2ms per direction", "uncontended  quorumlock+poll", "EVALSHA", "(all)", "µs/op/node")
	var rep struct {
		NodeLatency string `json:"node_latency"`
		Results     []struct {
			Lib     string `json:"lib"`
			Summary struct {
				N   int           `json:"n"`
				P50 time.Duration `json:"p50_ns"`
			} `json:"summary"`
		} `json:"results"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.NodeLatency != "2ms" || len(rep.Results) != 2 {
		t.Fatalf("JSON: node latency %q, %d results; want 2ms, 2", rep.NodeLatency, len(rep.Results))
	}
	for _, r := range rep.Results {
		if r.Summary.N == 0 {
			t.Errorf("%s: no operation completed in 500ms:\n%s", r.Lib, out)
			continue
		}
		if r.Summary.P50 < 8*time.Millisecond {
			t.Errorf("%s: uncontended p50 %v behind 2ms per direction; want at least 8ms (two rounds of two delayed directions)", r.Lib, r.Summary.P50)
		}
	}
}

// runWants runs lockbench with args, checks that its output holds each of
// wants, and returns the output and the file at jsonPath.
func runWants(t *testing.T, args []string, jsonPath string, wants ...string) (string, []byte) {
	t.Helper()
	var stdout bytes.Buffer
	if err := run(t.Context(), args, &stdout, io.Discard); err != nil {
		t.Fatalf("run(%q) = %v\n%s", args, err, &stdout)
	}
	out := stdout.String()
	for _, want := range wants {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	return out, b
}

// TestRun_cancelled checks that an interrupt (ctx cancelled, as Ctrl-C does
// through signal.NotifyContext) stops the run and the nodes: goleak in
// TestMain finds any goroutine left behind.
func TestRun_cancelled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := run(ctx, []string{"-embedded", "miniredis", "-n", "1", "-duration", "5s"}, io.Discard, io.Discard)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("run with a cancelled ctx = %v; want context.Canceled", err)
	}
}

func TestParseFlags(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		args []string
		want error
	}{
		{"defaults", nil, nil},
		{"help", []string{"-h"}, flag.ErrHelp},
		{"unknown flag", []string{"-nope"}, errUsage},
		{"no clients", []string{"-clients", "0"}, errUsage},
		{"negative duration", []string{"-duration", "-1s"}, errUsage},
		{"stray argument", []string{"extra"}, errUsage},
		{"bad progress", []string{"-progress", "sometimes"}, errUsage},
		{"no runs", []string{"-count", "0"}, errUsage},
		{"negative node latency", []string{"-node-latency", "-1ms"}, errUsage},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := parseFlags(tc.args, io.Discard)
			if !errors.Is(err, tc.want) {
				t.Errorf("parseFlags(%q) = %v; want %v", tc.args, err, tc.want)
			}
		})
	}
	err := run(t.Context(), []string{"-libs", "nope"}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "unknown library") {
		t.Errorf("run(-libs nope) = %v; want an unknown library error", err)
	}
}
