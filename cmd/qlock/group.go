package main

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"
)

// procStat is what qlock reads of a process in /proc/PID/stat.
type procStat struct {
	state   byte // R, S, D, T (stopped), t, Z (zombie), X …
	ppid    int
	pgrp    int
	session int
}

// readStat reads /proc/pid/stat. The command name (field 2) may contain
// spaces and parentheses, so the fields are counted from its last ')'.
func readStat(pid int) (procStat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, false
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return procStat{}, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 4 || len(f[0]) != 1 {
		return procStat{}, false
	}
	var st procStat
	st.state = f[0][0]
	var errs [3]error
	st.ppid, errs[0] = strconv.Atoi(f[1])
	st.pgrp, errs[1] = strconv.Atoi(f[2])
	st.session, errs[2] = strconv.Atoi(f[3])
	if errors.Join(errs[:]...) != nil {
		return procStat{}, false
	}
	return st, true
}

// eachProcess calls fn for every process in /proc until fn returns false.
// It reports false when /proc cannot be read.
func eachProcess(fn func(pid int, st procStat) bool) bool {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return false
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := readStat(pid); ok && !fn(pid, st) {
			break
		}
	}
	return true
}

// groupAlive reports whether process group pgid has a member that is not a
// zombie. kill(-pgid, 0) alone is not enough: it also finds zombies, and an
// orphaned zombie stays one for ever where PID 1 does not reap (some
// container inits), which would hold up every release for the -grace.
func groupAlive(pgid int) bool {
	if err := syscall.Kill(-pgid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	alive := false
	if !eachProcess(func(_ int, st procStat) bool {
		if st.pgrp == pgid && st.state != 'Z' && st.state != 'X' {
			alive = true
		}
		return !alive
	}) {
		return true // cannot tell: kill found something
	}
	return alive
}

// endGroup ends process group pgid: SIGTERM (and SIGCONT, so that a
// stopped member can act on it), then SIGKILL at deadline if a member is
// still alive, then waits up to killWait for the group to go. It returns
// at once when the group is already gone.
func endGroup(pgid int, deadline time.Time) {
	if !groupAlive(pgid) {
		return
	}
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	_ = syscall.Kill(-pgid, syscall.SIGCONT)
	if waitGroup(pgid, deadline) {
		return
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	waitGroup(pgid, time.Now().Add(killWait))
}

// killWait bounds the wait for a SIGKILLed group to go (a process in
// uninterruptible sleep dies only when its system call returns).
const killWait = time.Second

// waitGroup polls until process group pgid is gone or deadline passes; it
// reports whether the group is gone.
func waitGroup(pgid int, deadline time.Time) bool {
	for {
		if !groupAlive(pgid) {
			return true
		}
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		time.Sleep(min(left, 20*time.Millisecond))
	}
}

// waitStopped polls until every member of process group pgid that is not
// a zombie is stopped, or deadline passes.
func waitStopped(pgid int, deadline time.Time) {
	for time.Now().Before(deadline) {
		running := false
		eachProcess(func(_ int, st procStat) bool {
			if st.pgrp == pgid && strings.IndexByte("TtZX", st.state) < 0 {
				running = true
			}
			return !running
		})
		if !running {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// orphaned reports whether process group pgrp of session sid is orphaned
// in the POSIX sense: no member has a parent in another group of the same
// session, so no job-control shell is there to continue it after a stop.
func orphaned(pgrp, sid int) bool {
	parents := map[int]bool{}
	eachProcess(func(_ int, st procStat) bool {
		if st.pgrp == pgrp {
			parents[st.ppid] = true
		}
		return true
	})
	for ppid := range parents {
		if st, ok := readStat(ppid); ok && st.pgrp != pgrp && st.session == sid {
			return false
		}
	}
	return true
}

// openTTY opens qlock's controlling terminal, or returns nil when it has
// none (under systemd, cron, or a test without a pty).
func openTTY() *os.File {
	f, err := os.OpenFile("/dev/tty", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil
	}
	return f
}

// tcgetpgrp returns the terminal's foreground process group.
func tcgetpgrp(tty *os.File) (int, error) {
	var pgrp int32
	err := ttyIoctl(tty, syscall.TIOCGPGRP, &pgrp)
	return int(pgrp), err
}

// tcsetpgrp makes pgrp the terminal's foreground process group. From a
// background group the kernel sends SIGTTOU instead unless it is ignored;
// see takeTerminal.
func tcsetpgrp(tty *os.File, pgrp int) error {
	p := int32(pgrp)
	return ttyIoctl(tty, syscall.TIOCSPGRP, &p)
}

func ttyIoctl(tty *os.File, req uintptr, arg *int32) error {
	rc, err := tty.SyscallConn()
	if err != nil {
		return err
	}
	var errno syscall.Errno
	if err := rc.Control(func(fd uintptr) {
		_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, fd, req, uintptr(unsafe.Pointer(arg)))
	}); err != nil {
		return err
	}
	if errno != 0 {
		return errno
	}
	return nil
}

// inForeground reports whether qlock's process group is the terminal's
// foreground group.
func inForeground(tty *os.File) bool {
	pg, err := tcgetpgrp(tty)
	return err == nil && pg == syscall.Getpgrp()
}
