package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/quorumlock/quorumlock/internal/redistest"
)

// These tests run qlock from an interactive bash on a pseudo-terminal, so
// that job control is real: Ctrl-Z, fg, bg, reading the terminal. The pty
// is opened with four ioctls here rather than with a pty library, to keep
// the module's dependencies as they are.

// openPTY returns the master and slave ends of a new pseudo-terminal.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	var unlock int32
	var n uint32
	for _, c := range []struct {
		req uintptr
		arg unsafe.Pointer
	}{{syscall.TIOCSPTLCK, unsafe.Pointer(&unlock)}, {syscall.TIOCGPTN, unsafe.Pointer(&n)}} {
		if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), c.req, uintptr(c.arg)); errno != 0 {
			m.Close()
			t.Fatalf("pty ioctl %#x: %v", c.req, errno)
		}
	}
	s, err := os.OpenFile("/dev/pts/"+strconv.Itoa(int(n)), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		m.Close()
		t.Fatal(err)
	}
	return m, s
}

// shell is an interactive bash with job control on a pty.
type shell struct {
	t      *testing.T
	master *os.File
	out    *syncBuffer
	pid    int
}

// startShell starts bash on a new pty, in its own session, with rc's nodes
// in QLOCK_NODES. Cleanup kills every process of that session (bash, the
// qlock processes it started, their commands and reapers: all started by
// this test).
func startShell(t *testing.T, rc *redistest.Cluster) *shell {
	t.Helper()
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("bash is needed for the job-control tests")
	}
	m, s := openPTY(t)
	cmd := exec.Command(bash, "--norc", "--noprofile", "--noediting", "-i")
	cmd.Env = append(os.Environ(), nodesEnv(rc), "PS1=$ ", "TERM=dumb")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = s, s, s
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	sh := &shell{t: t, master: m, out: &syncBuffer{}, pid: cmd.Process.Pid}
	copied := make(chan struct{})
	go func() {
		_, _ = io.Copy(sh.out, m) // ends with EIO once every slave fd is closed
		close(copied)
	}()
	t.Cleanup(func() {
		for range 2 { // once more for what started while the first round ran
			eachProcess(func(pid int, st procStat) bool {
				if st.session == sh.pid {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
				return true
			})
		}
		_ = cmd.Wait()
		m.Close()
		<-copied
		if t.Failed() {
			t.Logf("terminal:\n%s", sh.out.String())
		}
	})
	sh.waitOutput("$ ", 10*time.Second)
	sh.send("set -b\n") // report a job's stop at once, not at the next prompt
	return sh
}

// send types s on the terminal.
func (sh *shell) send(s string) {
	sh.t.Helper()
	if _, err := sh.master.WriteString(s); err != nil {
		sh.t.Fatal(err)
	}
}

// waitOutput waits up to d until the terminal has shown s.
func (sh *shell) waitOutput(s string, d time.Duration) {
	sh.t.Helper()
	deadline := time.Now().Add(d)
	for !strings.Contains(sh.out.String(), s) {
		if time.Now().After(deadline) {
			sh.t.Fatalf("the terminal did not show %q within %v:\n%s", s, d, sh.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitStopped waits until the shell has reported a job stopped n times in
// all: the shell sends SIGCONT on fg only to a job it knows is stopped.
func (sh *shell) waitStopped(n int) {
	sh.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for strings.Count(sh.out.String(), "Stopped") < n {
		if time.Now().After(deadline) {
			sh.t.Fatalf("the shell did not report the job stopped:\n%s", sh.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// exitCodeOfLast asks the shell for $? and waits for the answer.
func (sh *shell) exitCodeOfLast(want int) {
	sh.t.Helper()
	sh.send("echo \"rc=$?.\"\n")
	sh.waitOutput(fmt.Sprintf("rc=%d.", want), 10*time.Second)
}

// stat5 is a process's state and its terminal's foreground group.
func stat5(pid int) (state byte, tpgid int, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	tpgid, _ = strconv.Atoi(f[5])
	return f[0][0], tpgid, true
}

// waitState waits up to d until process pid is in one of states ('-' for
// gone or a zombie).
func waitState(t *testing.T, pid int, states string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		st, _, ok := stat5(pid)
		if !ok || st == 'Z' || st == 'X' {
			st = '-'
		}
		if strings.IndexByte(states, st) >= 0 {
			return
		}
		if time.Now().After(deadline) {
			if me, ok := readStat(pid); ok {
				eachProcess(func(p int, st procStat) bool {
					if st.session == me.session {
						b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
						t.Logf("session member: %.60s", b)
					}
					return true
				})
			}
			t.Fatalf("process %d is in state %c after %v; want one of %q", pid, st, d, states)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitForeground waits up to d until pgid is the foreground group of the
// terminal of process pid.
func waitForeground(t *testing.T, pid, pgid int, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		_, tpgid, _ := stat5(pid)
		if tpgid == pgid {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the terminal's foreground group is %d after %v; want the command's %d", tpgid, d, pgid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// readPIDs waits for the file the command writes "QLOCK_PID COMMAND_PID" to.
func readPIDs(t *testing.T, path string) (qlock, command int) {
	t.Helper()
	waitFile(t, path, "\n", 30*time.Second)
	b, _ := os.ReadFile(path)
	if _, err := fmt.Sscan(string(b), &qlock, &command); err != nil {
		t.Fatalf("%s: %q: %v", path, b, err)
	}
	return qlock, command
}

// growth reports whether the file at path grows within d.
func growth(path string, d time.Duration) bool {
	size := func() int64 {
		fi, err := os.Stat(path)
		if err != nil {
			return -1
		}
		return fi.Size()
	}
	before := size()
	time.Sleep(d)
	return size() != before
}

// writer is a command that writes its PIDs to pids, then a line to log
// every 50ms for ever. It forks nothing in its loop (it waits with bash's
// read -t on a FIFO that nobody writes): a Ctrl-Z while a shell is inside
// vfork stops the child of the vfork and leaves its parent in
// uninterruptible sleep, not stopped, so that no shell sees the job stop —
// with or without qlock.
func writer(t *testing.T, pids, log string) string {
	t.Helper()
	fifo := filepath.Join(filepath.Dir(pids), "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf(`bash --norc -c 'echo "$PPID $$" > %s; exec 9<>%s; while :; do echo x >> %s; read -t 0.05 -u 9; done'`, pids, fifo, log)
}

// TestJobControl_ctrlZStopsTheCommandWithQlock: Ctrl-Z stops the command
// together with qlock; once the lease lapsed and another client holds the
// lock, the command stays stopped, and fg kills it (exit 76) instead of
// continuing it. (Before: Ctrl-Z stopped qlock only, and the command ran on
// under a lock another client had taken.)
func TestJobControl_ctrlZStopsTheCommandWithQlock(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	sh := startShell(t, rc)
	dir := t.TempDir()
	pids, log := filepath.Join(dir, "pids"), filepath.Join(dir, "log")
	sh.send(fmt.Sprintf("%s run -v -ttl 4s -grace 300ms ctrlz -- %s\n", qlockBin, writer(t, pids, log)))
	qpid, cpid := readPIDs(t, pids)
	waitFile(t, log, "x", 10*time.Second)

	sh.send("\x1a") // Ctrl-Z
	waitState(t, qpid, "T", 10*time.Second)
	waitState(t, cpid, "T", 10*time.Second)
	if growth(log, 500*time.Millisecond) {
		t.Fatal("the command runs on while qlock is stopped")
	}
	// The lease lapses (nothing renews it): another client takes the lock.
	c := bystander(t, rc)
	deadline := time.Now().Add(15 * time.Second)
	for {
		l, err := c.TryLock(t.Context(), "ctrlz")
		if err == nil {
			t.Cleanup(func() { _ = l.Unlock(context.Background()) })
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the lease did not lapse while qlock was stopped: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if growth(log, 300*time.Millisecond) {
		t.Fatal("the command runs while another client holds the lock")
	}
	sh.waitStopped(1)
	sh.send("fg\n")
	waitState(t, qpid, "-", 10*time.Second)
	sh.exitCodeOfLast(exitLost)
	waitState(t, cpid, "-", time.Second)
	if growth(log, 300*time.Millisecond) {
		t.Error("the command ran after fg although the lease had run out")
	}
}

// TestJobControl_ctrlZThenFg: stopped for less than the lease, the command
// goes on after fg, with the terminal (Ctrl-C reaches it), and qlock exits
// with its code.
func TestJobControl_ctrlZThenFg(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	sh := startShell(t, rc)
	dir := t.TempDir()
	pids, log := filepath.Join(dir, "pids"), filepath.Join(dir, "log")
	sh.send(fmt.Sprintf("%s run -v -ttl 5s fgres -- %s\n", qlockBin, writer(t, pids, log)))
	qpid, cpid := readPIDs(t, pids)
	waitFile(t, log, "x", 10*time.Second)
	sh.send("\x1a")
	waitState(t, qpid, "T", 10*time.Second)
	waitState(t, cpid, "T", 10*time.Second)
	sh.waitStopped(1)
	sh.send("fg\n")
	waitState(t, qpid, "RSD", 10*time.Second)
	waitForeground(t, qpid, cpid, 10*time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for !growth(log, 200*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the command did not go on after fg")
		}
	}
	sh.send("\x03") // Ctrl-C: to the command's group, the foreground one
	waitState(t, qpid, "-", 10*time.Second)
	sh.exitCodeOfLast(128 + int(syscall.SIGINT))
	if held, err := bystander(t, rc).IsLocked(t.Context(), "fgres"); err != nil || held {
		t.Errorf("IsLocked after the run = %v, %v; want false", held, err)
	}
}

// TestJobControl_commandReadsTheTerminal: the command's group is the
// terminal's foreground group, so it reads what is typed; started in the
// background, the command's read stops qlock too (the shell shows the job
// stopped), and fg gives it the terminal. (Before: the read stopped the
// command for ever, with the lock renewed.)
func TestJobControl_commandReadsTheTerminal(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	sh := startShell(t, rc)
	reader := func(pids, out string) string {
		return fmt.Sprintf(`sh -c 'echo "$PPID $$" > %s; read line; echo "got:$line" > %s'`, pids, out)
	}
	t.Run("foreground", func(t *testing.T) {
		dir := t.TempDir()
		pids, out := filepath.Join(dir, "pids"), filepath.Join(dir, "out")
		sh.send(fmt.Sprintf("%s run -v ttyres -- %s\n", qlockBin, reader(pids, out)))
		qpid, cpid := readPIDs(t, pids)
		waitForeground(t, qpid, cpid, 10*time.Second)
		sh.send("hello\n")
		waitFile(t, out, "got:hello", 10*time.Second)
		waitState(t, qpid, "-", 10*time.Second)
		sh.exitCodeOfLast(0)
	})
	t.Run("background, then fg", func(t *testing.T) {
		dir := t.TempDir()
		pids, out := filepath.Join(dir, "pids"), filepath.Join(dir, "out")
		sh.send(fmt.Sprintf("%s run -v ttyres -- %s &\n", qlockBin, reader(pids, out)))
		qpid, cpid := readPIDs(t, pids)
		waitState(t, cpid, "T", 10*time.Second) // SIGTTIN
		waitState(t, qpid, "T", 10*time.Second)
		sh.waitStopped(1)
		sh.send("fg\n")
		waitForeground(t, qpid, cpid, 10*time.Second)
		sh.send("hello\n")
		waitFile(t, out, "got:hello", 10*time.Second)
		waitState(t, qpid, "-", 10*time.Second)
		sh.exitCodeOfLast(0)
	})
}

// errGone is what kill(pid, 0) says of a process that is gone.
func isGone(pid int) bool {
	st, _, ok := stat5(pid)
	return !ok || st == 'Z' || errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}
