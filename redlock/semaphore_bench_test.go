package redlock

import (
	"context"
	"testing"

	"github.com/quorumlock/quorumlock/internal/redistest"
)

// BenchmarkPermit compares an uncontended permit (TryAcquire + Unlock of a
// K=4 Semaphore) with an uncontended mutex (TryLock + Unlock) on 5 real
// local nodes: the permit should cost the same round trip.
//
//	go test -run '^$' -bench Permit -count 5 ./redlock | benchstat -
func BenchmarkPermit(b *testing.B) {
	ctx := context.Background()
	c, err := New(directClients(b, redistest.Start(b, 5)))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	b.Run("op=trylock/nodes=5", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			l, err := c.TryLock(ctx, "bench-mutex")
			if err != nil {
				b.Fatal(err)
			}
			if err := l.Unlock(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("op=permit/k=4/nodes=5", func(b *testing.B) {
		s, err := c.Semaphore("bench-sem", 4)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			l, err := s.TryAcquire(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if err := l.Unlock(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}
