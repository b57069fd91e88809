package main

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/benchmarks/internal/libs"
	"github.com/quorumlock/quorumlock/benchmarks/internal/nodes"
)

// TestInstances: the clients and mixed scenarios give each instance node
// clients of its own (as processes of their own have), shared gives them
// all the same ones, and mixed has two instances whatever -clients is.
func TestInstances(t *testing.T) {
	t.Parallel()
	var opts []*redis.Options
	for range 3 {
		opts = append(opts, nodes.Options(miniredis.RunT(t).Addr()))
	}
	fast := nodes.Clients(opts)
	t.Cleanup(func() { nodes.CloseAll(fast) })
	e := &env{fast: fast, opts: opts, clients: 4, resources: 1}
	lib, _ := libs.ByName("quorumlock")
	byName := func(name string) scenario {
		i := slices.IndexFunc(scenarios, func(s scenario) bool { return s.name == name })
		if i < 0 {
			t.Fatalf("no scenario %q", name)
		}
		return scenarios[i]
	}
	cases := []struct {
		scenario string
		n        int
		own      bool
	}{
		{"clients", 4, true},
		{"shared", 4, false},
		{"mixed", 2, true},
		{"contended", 1, false},
	}
	for _, tc := range cases {
		lks, err := instances(e, byName(tc.scenario), lib, fast, 8*time.Second)
		if err != nil {
			t.Fatalf("%s: instances = %v", tc.scenario, err)
		}
		seen := map[redis.UniversalClient]bool{}
		for i, l := range lks {
			o, own := l.(ownedNodes)
			if own != tc.own {
				t.Errorf("%s: instance %d has node clients of its own: %v; want %v", tc.scenario, i, own, tc.own)
			}
			if own {
				for _, c := range o.nodes {
					if seen[c] || slices.Contains(fast, c) {
						t.Errorf("%s: instance %d shares node client %p", tc.scenario, i, c)
					}
					seen[c] = true
				}
			}
			if err := l.Close(); err != nil {
				t.Errorf("%s: Close of instance %d = %v", tc.scenario, i, err)
			}
		}
		if len(lks) != tc.n {
			t.Errorf("%s: %d instances; want %d", tc.scenario, len(lks), tc.n)
		}
	}
}

// TestRun_instances runs the scenarios of several instances and checks
// what the fairness table and the JSON say of each instance.
func TestRun_instances(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	args := []string{"-embedded", "miniredis", "-n", "3", "-duration", "300ms", "-scenarios", "clients,shared,mixed",
		"-libs", "quorumlock,redsync", "-clients", "4", "-commands", "-json", filepath.Join(dir, "r.json")}
	_, b := runWants(t, args, filepath.Join(dir, "r.json"),
		"4 instances / 1 res.", "4 Clients, shared nodes / 1 res.", "2 instances × 2 goroutines / 1 res.", "per instance", "pool waits/op")
	var rep struct {
		Results []struct {
			Scenario string `json:"scenario"`
			Lib      string `json:"lib"`
			Ops      int    `json:"ops"`
			Fair     *struct {
				PerInstance []int `json:"per_instance"`
			} `json:"fairness"`
		} `json:"results"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"clients": 4, "shared": 4, "mixed": 2}
	for _, r := range rep.Results {
		if r.Fair == nil {
			t.Errorf("%s/%s: no fairness", r.Scenario, r.Lib)
			continue
		}
		sum := 0
		for _, n := range r.Fair.PerInstance {
			sum += n
		}
		if len(r.Fair.PerInstance) != want[r.Scenario] || sum != r.Ops {
			t.Errorf("%s/%s: per instance %v (sum %d); want %d instances summing to the %d acquisitions",
				r.Scenario, r.Lib, r.Fair.PerInstance, sum, want[r.Scenario], r.Ops)
		}
	}
}

func TestFmtShares(t *testing.T) {
	t.Parallel()
	cases := []struct {
		per  []int
		want string
	}{
		{nil, "–"},
		{[]int{1, 3}, "25% / 75%"},
		{[]int{0, 0}, "0% / 0%"},
		{[]int{1, 1, 1, 1, 2, 4}, "10%–40%"},
	}
	for _, tc := range cases {
		if got := fmtShares(&Fairness{PerInstance: tc.per}); got != tc.want {
			t.Errorf("fmtShares(%v) = %q; want %q", tc.per, got, tc.want)
		}
	}
}
