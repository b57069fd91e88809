//go:build !linux

package redistest

import "syscall"

// sysProcAttr returns nil: Pdeathsig is Linux-only, so elsewhere a test
// binary that dies without running its Cleanups leaves its servers behind.
func sysProcAttr() *syscall.SysProcAttr { return nil }

// waitStopped returns at once: without /proc there is no cheap way to see
// that SIGSTOP has taken effect, and it normally has within microseconds.
func waitStopped(pid int) error { return nil }

// tcpStates returns "": only Linux has /proc/net/tcp.
func tcpStates(port int) string { return "" }
