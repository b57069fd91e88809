package redistest

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
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

// tcpStates names the states of the IPv4 TCP sockets whose local port is
// port, from /proc/net/tcp ("TIME_WAIT ×2, FIN_WAIT2"), for Kill's message
// when the port cannot be reserved: it tells a lingering connection of the
// dead server from another process's socket. Empty when none, or unreadable.
func tcpStates(port int) string {
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return ""
	}
	names := map[string]string{"01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1",
		"05": "FIN_WAIT2", "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT", "09": "LAST_ACK", "0A": "LISTEN", "0B": "CLOSING"}
	suffix := fmt.Sprintf(":%04X", port)
	var states []string
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasSuffix(f[1], suffix) {
			continue
		}
		name := names[f[3]]
		if name == "" {
			name = f[3]
		}
		states = append(states, name)
	}
	return strings.Join(states, ", ")
}
