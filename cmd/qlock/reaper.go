package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

// reaperArg is the hidden first argument that makes the qlock binary run
// as the reaper of one command's process group (see startReaper).
const reaperArg = "__qlock_reaper"

// A reaper is a small process, the qlock binary run again, that ends the
// command's process group if qlock dies without doing so itself (SIGKILL,
// a crash, the OOM killer). Pdeathsig cannot do this: the kernel sends it
// to the direct child only (and only when the thread that started it
// exits), so the grandchildren of "sh -c" outlive qlock and run on without
// the lock. The reaper learns of qlock's death from a pipe: qlock holds its
// write end, close-on-exec, so the kernel closes it when qlock dies, and
// the reaper reads EOF without the "done" that qlock writes after the group
// is gone. The reaper runs in its own process group, so terminal signals
// and job control do not reach it, and it ignores the signals a stop of the
// unit or session sends (SIGINT, SIGTERM, SIGHUP, SIGQUIT).
//
// Protocol, one line each: the group's ID once the command started, "stop"
// and "cont" around qlock's job-control stops, and "done".
type reaper struct {
	w      *os.File
	cmd    *exec.Cmd
	exited chan struct{}
}

// startReaper starts the reaper; grace is the time between SIGTERM and
// SIGKILL it gives the group.
func startReaper(grace time.Duration) (*reaper, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	cmd := exec.Command(exe, reaperArg, grace.String(), strconv.Itoa(os.Getpid()))
	cmd.ExtraFiles = []*os.File{r} // fd 3
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, err
	}
	rp := &reaper{w: w, cmd: cmd, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(rp.exited)
	}()
	return rp, nil
}

// tell sends the reaper one line. A write error means the reaper is gone;
// there is nothing better to do than to go on without it.
func (r *reaper) tell(line string) {
	_, _ = fmt.Fprintln(r.w, line)
}

// release tells the reaper that the group is gone and waits for it to exit
// (a second at most: it exits on reading "done"; after that it is killed).
func (r *reaper) release() {
	r.tell("done")
	r.w.Close()
	select {
	case <-r.exited:
	case <-time.After(time.Second):
		_ = r.cmd.Process.Kill()
		<-r.exited
	}
}

// reap is the reaper's main: args are the grace and qlock's PID.
func reap(args []string) int {
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT,
		syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU, syscall.SIGPIPE)
	if len(args) != 2 {
		return exitUsage
	}
	grace, err := time.ParseDuration(args[0])
	if err != nil {
		return exitUsage
	}
	in := os.NewFile(3, "qlock")
	if in == nil {
		return exitUsage
	}
	sc := bufio.NewScanner(in)
	pgid, stopped := 0, false
	for sc.Scan() {
		switch line := sc.Text(); line {
		case "done":
			return 0
		case "stop":
			stopped = true
		case "cont":
			stopped = false
		default:
			if n, err := strconv.Atoi(line); err == nil && n > 1 {
				pgid = n
			}
		}
	}
	if pgid == 0 {
		return 0 // qlock died before it started the command
	}
	if stopped {
		// qlock had stopped the group for a job-control stop: the lease
		// may have run out since, so nothing of the command may run
		// again, not even a SIGTERM handler.
		fmt.Fprintf(os.Stderr, "qlock: qlock (pid %s) died with the command stopped; killing its process group %d\n", args[1], pgid)
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		waitGroup(pgid, time.Now().Add(killWait))
		return 0
	}
	fmt.Fprintf(os.Stderr, "qlock: qlock (pid %s) died; stopping the command's process group %d (SIGTERM, SIGKILL after %v)\n", args[1], pgid, grace)
	endGroup(pgid, time.Now().Add(grace))
	return 0
}
