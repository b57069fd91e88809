// Package benchmarks compares quorumlock with go-redsync/redsync v4 and
// bsm/redislock on real redis-server nodes, next to the floor: one parallel
// round of plain SET NX PX / DEL with go-redis, the physical limit of one
// Redlock round trip.
//
// It is its own module, so that the peer libraries never enter quorumlock's
// go.mod. Run the benchmarks with
//
//	cd benchmarks && go test -run '^$' -bench . -benchtime=2s -count=5 | tee new.txt
//	go run golang.org/x/perf/cmd/benchstat new.txt
//
// and the user command with
//
//	cd benchmarks && go run ./cmd/lockbench
//
// See README.md for what each case measures.
package benchmarks
