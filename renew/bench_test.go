package renew

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkAddStop is what the scheduler costs a lock that is taken and
// released at once (an uncontended Lock+Unlock): Add, then Stop, with
// renewal on and off (a fixed lease: only its deadline is watched).
//
//	go test -run '^$' -bench AddStop -count 6 ./renew | benchstat -
func BenchmarkAddStop(b *testing.B) {
	for _, auto := range []bool{true, false} {
		b.Run(fmt.Sprintf("autorenew=%v", auto), func(b *testing.B) {
			s := New()
			defer s.Close()
			f := newFake(30*time.Second, func(int) (time.Duration, error) { return 0, nil })
			opts := Options{AutoRenew: auto, Interval: 10 * time.Second}
			b.ReportAllocs()
			for b.Loop() {
				h, err := s.Add(f, opts)
				if err != nil {
					b.Fatal(err)
				}
				h.Stop()
			}
		})
	}
}
