//go:build race

package sim

// RaceEnabled reports whether the binary was built with -race (the test's
// default seed count is lower then: the race detector slows the run ~10x).
const RaceEnabled = true
