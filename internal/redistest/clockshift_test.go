package redistest

import (
	"testing"
	"time"
)

// WithClockOffset shifts each master's wall clock as asked, TIME inside
// scripts included (StartRedisCluster checks both), and the cluster still
// forms: the bus compares no wall-clock instants across nodes.
func TestRedisCluster_clockOffset(t *testing.T) {
	t.Parallel()
	c := StartRedisCluster(t, 3, WithClockOffset(0, -3*time.Second), WithClockOffset(2, 3*time.Second))
	for i, want := range []time.Duration{-3 * time.Second, 0, 3 * time.Second} {
		got, err := c.NodeClient(i).Time(t.Context()).Result()
		if err != nil {
			t.Fatal(err)
		}
		if off := time.Until(got); off < want-time.Second || off > want+time.Second {
			t.Errorf("master %d's clock is %v off ours; want %v", i, -off, want)
		}
	}
}
