//go:build unix

package main

import (
	"syscall"
	"time"
)

// processCPU is the CPU time this process has used so far (user + system),
// or -1 when it cannot be read. lockbench runs one library at a time, so
// the difference over a run is that library's client CPU (with lockbench's
// own small bookkeeping, the same for every library; and, with embedded
// miniredis nodes, the nodes' work too).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
