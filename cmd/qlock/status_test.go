package main

import (
	"errors"
	"testing"
)

// Each reader holds on a majority, not necessarily the same one: status
// counts the readers that hold on a majority by their members, not by the
// per-node counts (two readers on {0, 1} and {0, 2} count 2, where the
// counts 2, 1, 1 gave 1 — TestRun_read once saw that beside stress-ng).
func TestMajorityReaders(t *testing.T) {
	down := errors.New("down")
	for _, tc := range []struct {
		name string
		sts  []nodeStatus
		want int64
	}{
		{"two readers on different majorities", []nodeStatus{{readerIDs: []string{"a", "b"}}, {readerIDs: []string{"b"}}, {readerIDs: []string{"a"}}}, 2},
		{"a reader on a minority", []nodeStatus{{readerIDs: []string{"a", "c"}}, {readerIDs: []string{"a"}}, {}}, 1},
		{"a node that failed: a lower bound", []nodeStatus{{readerIDs: []string{"a", "b"}}, {readerIDs: []string{"b"}}, {err: down, readerIDs: []string{"a"}}}, 1},
		{"no readers", []nodeStatus{{}, {}, {}}, 0},
	} {
		if got := majorityReaders(tc.sts, 2); got != tc.want {
			t.Errorf("%s: majorityReaders = %d; want %d", tc.name, got, tc.want)
		}
	}
}
