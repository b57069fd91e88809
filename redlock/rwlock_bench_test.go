package redlock

import (
	"context"
	"errors"
	"testing"
)

// BenchmarkRWUncontended is one uncontended acquire and release of a read
// lock, a write lock and a multi-lock of two resources on 5 real local
// nodes, next to the plain lock's TryLock+Unlock (issue 24: a read lock
// within 1.5× of it).
//
//	go test -run '^$' -bench RWUncontended -count 5 ./redlock | benchstat -
func BenchmarkRWUncontended(b *testing.B) {
	nodes := directNodes(b)
	ctx := context.Background()
	c, err := New(nodes)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	cases := []struct {
		name string
		lock func() (*Lock, error)
	}{
		{"kind=mutex/TryLock", func() (*Lock, error) { return c.TryLock(ctx, "bench") }},
		{"kind=read/TryRLock", func() (*Lock, error) { return c.TryRLock(ctx, "bench") }},
		{"kind=read/RLock", func() (*Lock, error) { return c.RLock(ctx, "bench") }},
		{"kind=write/TryWLock", func() (*Lock, error) { return c.TryWLock(ctx, "bench") }},
		{"kind=multi2/TryLockAll", func() (*Lock, error) { return c.TryLockAll(ctx, []string{"bench", "bench2"}) }},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			refused := 0
			for b.Loop() {
				l, err := tc.lock()
				// Unlock returns at a majority: the previous release may
				// still be on its way to the other nodes, which then refuse
				// the next attempt. Counted, and tried again.
				for errors.Is(err, ErrNotObtained) {
					refused++
					l, err = tc.lock()
				}
				if err != nil {
					b.Fatalf("%s: %v", tc.name, err)
				}
				if err := l.Unlock(ctx); err != nil {
					b.Fatalf("%s: Unlock: %v", tc.name, err)
				}
			}
			b.ReportMetric(float64(refused)/float64(b.N), "refused/op")
		})
	}
}
