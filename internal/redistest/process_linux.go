package redistest

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"
)

// sysProcAttr makes the kernel SIGKILL our servers when the test binary
// dies, e.g. on a -timeout panic, where no Cleanup runs. Pdeathsig fires
// when the thread that forked exits, not the process; Go only ends threads
// whose goroutine exits while locked with runtime.LockOSThread, which nothing
// in our tests does.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// waitStopped polls /proc until pid is in state T (stopped). SIGSTOP is
// delivered asynchronously: kill(2) returns before the target, perhaps
// running on another CPU, has stopped.
func waitStopped(pid int) error {
	path := "/proc/" + strconv.Itoa(pid) + "/stat"
	deadline := time.Now().Add(time.Second)
	for {
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		// The format is "pid (comm) state ...", and comm may contain
		// spaces and parentheses, so look after the last ')'.
		if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) && (b[i+2] == 'T' || b[i+2] == 't') {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redistest: pid %d not stopped after SIGSTOP", pid)
		}
		time.Sleep(time.Millisecond)
	}
}
