package redistest

import (
	"flag"
	"runtime"
	"strconv"
)

// WaitingParallel raises -test.parallel to perCPU times GOMAXPROCS unless
// the command line set it; call it from TestMain, before m.Run.
//
// The tests of packages that fault real nodes spend their time waiting:
// for a TTL to run out, a paused node's timeout, a renewal interval. Under
// -race the redlock package's tests took 217 s of test time in 140 s of
// wall time and 57 s of CPU: two parallel tests at a time (the default,
// GOMAXPROCS) left the machine idle most of the time. More at once fills
// those waits; each test's bounds are kept for a loaded machine anyway (see
// docs/development.md). Not too many: at 5 per CPU the redlock package's
// requests all timed out beside stress-ng --cpu 2 (in 2 of 2 runs), at 2
// per CPU it passed. The redlock package runs 3 per CPU: its parallel
// tests kept 4 slots busy the whole of its parallel phase (about 90 of
// its 140s idle, 53s of CPU), and at load 17-21 three runs of each took
// 145-169s at 2 per CPU and 119-131s at 3, with one failing test in two
// runs of either (a different test each time). -parallel on the command
// line still decides.
func WaitingParallel(perCPU int) {
	if !flag.Parsed() {
		flag.Parse()
	}
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", strconv.Itoa(perCPU*runtime.GOMAXPROCS(0)))
	}
}
