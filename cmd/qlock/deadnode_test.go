package main

import (
	"bytes"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/internal/redistest"
)

// qlockDirect runs qlock with QLOCK_NODES set to urls and returns its exit
// code, stderr and how long it ran.
func qlockDirect(t *testing.T, urls []string, args ...string) (int, string, time.Duration) {
	t.Helper()
	cmd := exec.Command(qlockBin, args...)
	cmd.Env = append(cmd.Environ(), "QLOCK_NODES="+strings.Join(urls, ","))
	var errb bytes.Buffer
	cmd.Stderr = &errb
	start := time.Now()
	err := cmd.Run()
	d := time.Since(start)
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatalf("qlock %v: %v", args, err)
	}
	return cmd.ProcessState.ExitCode(), errb.String(), d
}

// refusedAddr returns a local address where nothing listens.
func refusedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// An empty RESOURCE or NAME is qlock's usage error, named by qlock's own
// argument (it read "election: name must not be empty"), and found before
// any node is dialled: the nodes here refuse connections.
func TestRun_emptyName(t *testing.T) {
	t.Parallel()
	urls := []string{"redis://" + refusedAddr(t)}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "", "--", "true"}, "RESOURCE must not be empty"},
		{[]string{"run", "-n", "2", "", "--", "true"}, "RESOURCE must not be empty"},
		{[]string{"elect", "", "--", "true"}, "NAME must not be empty"},
		{[]string{"status", ""}, "RESOURCE must not be empty"},
	} {
		code, stderr, _ := qlockDirect(t, urls, tc.args...)
		if code != exitUsage || !strings.Contains(stderr, tc.want) || strings.Contains(stderr, "election") || strings.Contains(stderr, "refused") {
			t.Errorf("qlock %q exited %d, stderr %q; want %d and %q", tc.args, code, stderr, exitUsage, tc.want)
		}
	}
}

// A node that refuses connections is reported as refusing them, at once:
// qlock read "context deadline exceeded" after the full node timeout (1s)
// while go-redis retried each dial 5 times, 100ms apart, in each of its 4
// tries (issue 44).
func TestRun_refusedNodesReportedAtOnce(t *testing.T) {
	t.Parallel()
	urls := []string{"redis://" + refusedAddr(t), "redis://" + refusedAddr(t), "redis://" + refusedAddr(t)}
	code, stderr, d := qlockDirect(t, urls, "run", "refused", "--", "true")
	if code != exitNoQuorum || !strings.Contains(stderr, "connection refused") || strings.Contains(stderr, "deadline") {
		t.Errorf("qlock run on refusing nodes exited %d, stderr %q; want %d naming the refused connections", code, stderr, exitNoQuorum)
	}
	// The node timeout (1s at the default 30s TTL) is what it waited
	// before; 0.1s now (and the binary's start).
	if d >= time.Second {
		t.Errorf("qlock run on refusing nodes took %v; want less than the 1s node timeout", d)
	}
}

// One killed node of three costs a qlock run little: Dial gets its refusal
// at once, and the release of the lock does not wait for the dead node
// (qlock run took 1.17s here, where 0.1s is usual; issue 44). stderr has
// no line of go-redis's.
func TestRun_deadNodeCostsLittle(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	var urls []string
	for i := range rc.N() {
		urls = append(urls, "redis://"+rc.ServerAddr(i))
	}
	rc.Kill(2)
	var worst time.Duration
	for range 3 {
		code, stderr, d := qlockDirect(t, urls, "run", "deadnode", "--", "true")
		if code != 0 || stderr != "" {
			t.Fatalf("qlock run with node 2 killed exited %d, stderr %q; want 0 and nothing", code, stderr)
		}
		worst = max(worst, d)
	}
	t.Logf("qlock run with one node of three killed: slowest of 3 runs %v", worst)
	// The node timeout is 1s (the default TTL's tenth): a run that waits it
	// out once takes longer; 0.1-0.2s is usual.
	if worst >= time.Second {
		t.Errorf("qlock run with node 2 killed took %v; want less than the 1s node timeout", worst)
	}
}
