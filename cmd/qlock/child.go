package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

// forwarded are the signals qlock passes on to the command's process group.
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}

// jobSignals are the job-control stops qlock handles itself when they are
// sent to it: it stops the command's group, then itself (see job.suspend).
// SIGTTOU is not among them: qlock ignores it (see notifySignals).
var jobSignals = []os.Signal{syscall.SIGTSTP, syscall.SIGTTIN}

// notifySignals makes sigs receive the forwarded and job-control signals,
// and ignores SIGTTOU: qlock's own writes to the terminal from the
// background (with stty tostop) and its tcsetpgrp calls then go through.
// Were SIGTTOU caught, such a write would be restarted after each SIGTTOU
// for as long as qlock is in the background, and never return to let qlock
// act on it. The command does not inherit the ignored SIGTTOU (see
// startCommand).
func notifySignals(sigs chan<- os.Signal) {
	signal.Notify(sigs, append(append([]os.Signal{}, forwarded...), jobSignals...)...)
	signal.Ignore(syscall.SIGTTOU)
	signal.Notify(continued, syscall.SIGCONT)
}

// continued receives SIGCONT: stopSelf waits on it.
var continued = make(chan os.Signal, 1)

// stopSelf stops qlock — its whole process group when group is true, as
// the terminal stops a job — and returns once it has been continued.
// kill(2) can return before the stop has taken hold of a multi-threaded
// process (measured here: a Go program's kill of itself with SIGSTOP
// returned within microseconds and ran on, its stop coming later, 198 times
// in 200), so returning from it proves nothing: the SIGCONT that continues
// qlock does.
func stopSelf(group bool) {
	for len(continued) > 0 {
		<-continued
	}
	target := os.Getpid()
	if group {
		target = 0
	}
	if syscall.Kill(target, syscall.SIGSTOP) == nil {
		<-continued
	}
}

// startCommand starts cmd with SIGTTOU caught rather than ignored for the
// time of the fork: a child inherits ignored signals through exec, and
// caught ones as the default (stop), which is what the command must have.
func startCommand(cmd *exec.Cmd) error {
	ttou := make(chan os.Signal, 1)
	signal.Notify(ttou, syscall.SIGTTOU)
	err := cmd.Start()
	signal.Ignore(syscall.SIGTTOU) // also undoes the Notify
	return err
}

// isJobStop reports whether s is one of jobSignals.
func isJobStop(s syscall.Signal) bool {
	return s == syscall.SIGTSTP || s == syscall.SIGTTIN || s == syscall.SIGTTOU
}

// terminating reports whether s, forwarded to the command, asks qlock to
// end: elect does not campaign again after it.
func terminating(s syscall.Signal) bool {
	return s == syscall.SIGINT || s == syscall.SIGTERM || s == syscall.SIGHUP || s == syscall.SIGQUIT
}

// child is the outcome of running the command under a term.
type child struct {
	code int            // the exit code qlock should exit with
	lost error          // non-nil when the command was stopped because the term ended or was about to
	sig  syscall.Signal // the first of SIGINT, SIGTERM, SIGHUP, SIGQUIT forwarded to the command; 0 if none
}

// childEvent is what wait4 reported of the command: a stop, or its end.
type childEvent struct {
	stopped syscall.Signal // the signal that stopped it; 0 when it ended
	status  syscall.WaitStatus
	err     error
}

// waitChild reports the stops and the end of process pid on events, and
// returns after its end. It waits itself (wait4 with WUNTRACED) rather than
// through exec.Cmd.Wait, which does not report stops.
func waitChild(pid int, events chan<- childEvent) {
	for {
		var ws syscall.WaitStatus
		_, err := syscall.Wait4(pid, &ws, syscall.WUNTRACED, nil)
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case err != nil:
			events <- childEvent{err: err}
			return
		case ws.Stopped():
			events <- childEvent{stopped: ws.StopSignal()}
		case ws.Exited() || ws.Signaled():
			events <- childEvent{status: ws}
			return
		}
	}
}

// job is the command's process group while it runs under a term.
type job struct {
	logf   func(format string, args ...any) // -v
	pgid   int
	term   lease         // an election's term, or a read lock (read.go)
	margin time.Duration // stop the command when less validity than this is left
	tty    *os.File      // the controlling terminal; nil without one
	gave   bool          // the group was made the terminal's foreground group
	reaper *reaper
}

// runChild starts command in its own process group with the term's
// variables in its environment, forwards signals from sigs to the group,
// and stops the group (SIGTERM, then SIGKILL after grace) when the term is
// lost or its validity falls below ttl/3. It returns when the command has
// exited and its process group is gone.
//
// Job control: when qlock is in the terminal's foreground, the command's
// group becomes the foreground group, so that it reads the terminal and
// gets Ctrl-C, Ctrl-\ and Ctrl-Z as if run directly. When the command stops
// for job control (Ctrl-Z, or reading the terminal from the background), or
// qlock gets SIGTSTP, SIGTTIN or SIGTTOU, qlock stops the whole group with
// SIGSTOP and then stops itself (its own process group, as the terminal
// would), so that its shell sees the job stopped; nothing of the command
// runs while qlock, which renews the lock, is stopped. On SIGCONT (fg, bg)
// it continues the group only if the lease is still valid — after the
// renewal that was due while it was stopped, when less than ttl/3 was left —
// and kills the group with SIGKILL otherwise.
func runChild(term lease, resource string, command []string, c *common, sigs <-chan os.Signal, stderr io.Writer) child {
	j := &job{term: term, margin: c.ttl / 3, logf: func(string, ...any) {}}
	if c.verbose {
		j.logf = func(format string, args ...any) {
			fmt.Fprintf(stderr, "qlock: %s: "+format+"\n", append([]any{resource}, args...)...)
		}
	}
	if j.tty = openTTY(); j.tty != nil {
		defer j.tty.Close()
	}
	var err error
	if j.reaper, err = startReaper(c.grace); err != nil {
		return child{code: fail(stderr, exitError, fmt.Errorf("starting the reaper of the command's process group: %w", err))}
	}
	defer j.reaper.release()

	cmd := exec.Command(command[0], command[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(),
		"QLOCK_RESOURCE="+resource,
		"QLOCK_FENCE="+strconv.FormatInt(term.Fence(), 10),
		"QLOCK_VALID_UNTIL="+term.ValidUntil().UTC().Format(time.RFC3339Nano),
		"QLOCK_IDENTITY="+term.Leader().Identity,
	)
	// Its own process group, so that a loss stops the command and all it
	// started, and so that qlock stays between the shell's SIGCONT and the
	// command (see suspend). The reaper ends the group if qlock dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if j.tty != nil && inForeground(j.tty) {
		// The child sets its group as the foreground one before exec
		// (with signals blocked, so no SIGTTOU).
		cmd.SysProcAttr.Foreground, cmd.SysProcAttr.Ctty = true, int(j.tty.Fd())
		j.gave = true
	}
	if err := startCommand(cmd); err != nil {
		code := exitCannotExec
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			code = exitNotFound
		}
		return child{code: fail(stderr, code, err)}
	}
	j.pgid = cmd.Process.Pid
	j.reaper.tell(strconv.Itoa(j.pgid))
	defer cmd.Process.Release()
	defer j.takeTerminal()
	events := make(chan childEvent, 1)
	go waitChild(j.pgid, events)

	// The about-to-expire check: renewals come every TTL/3, so the
	// validity left stays above 2/3 TTL while they succeed; below 1/3 they
	// have failed for a whole interval. A lock handed over by a release
	// starts with a short reservation instead, which its first renewal,
	// due within it, extends to the TTL: until the validity first moves,
	// the margin is half of what it started with.
	first := term.ValidUntil()
	short := min(j.margin, time.Until(first)/2)
	margin := func() time.Duration {
		if term.ValidUntil().Equal(first) {
			return short
		}
		return j.margin
	}
	check := time.NewTimer(time.Until(first.Add(-margin())))
	defer check.Stop()
	var (
		res       child
		killAt    time.Time // SIGKILL of the group, after a loss
		killTimer *time.Timer
		kill      <-chan time.Time
	)
	defer func() {
		if killTimer != nil {
			killTimer.Stop()
		}
	}()
	termDone := term.Context().Done()
	stop := func(why error) {
		if res.lost != nil {
			return
		}
		res.lost = why
		fmt.Fprintf(stderr, "qlock: %s: %v; stopping the command (SIGTERM, SIGKILL after %v)\n", resource, why, c.grace)
		_ = syscall.Kill(-j.pgid, syscall.SIGTERM)
		_ = syscall.Kill(-j.pgid, syscall.SIGCONT) // a stopped member acts on SIGTERM only once continued
		killAt = time.Now().Add(c.grace)
		killTimer = time.NewTimer(c.grace)
		kill = killTimer.C
	}
	suspend := func() {
		if why := j.suspend(); why != nil && res.lost == nil {
			res.lost = why
			fmt.Fprintf(stderr, "qlock: %s: %v; the command was killed (SIGKILL)\n", resource, why)
			killAt = time.Now()
		}
	}
	for {
		select {
		case ev := <-events:
			if ev.stopped != 0 {
				// A job-control stop of the command (Ctrl-Z; the
				// terminal read or written from the background) is the
				// job's: qlock stops with it. Other stops (SIGSTOP from
				// someone) leave qlock renewing.
				jc := j.jobControl()
				j.logf("the command was stopped by %v (job control: %v)", ev.stopped, jc)
				if isJobStop(ev.stopped) && jc {
					suspend()
				}
				continue
			}
			code := exitError
			if ev.err == nil {
				code = exitStatus(ev.status)
			}
			// The group may outlive its leader: it goes too, before the
			// lock is released (after a loss, SIGKILL at the time set).
			deadline := time.Now().Add(c.grace)
			if res.lost != nil {
				deadline = killAt
			}
			endGroup(j.pgid, deadline)
			if res.lost != nil {
				res.code = exitLost
			} else {
				res.code = code
			}
			return res
		case s := <-sigs:
			sig := s.(syscall.Signal)
			if isJobStop(sig) {
				j.logf("got %v", sig)
				suspend()
				continue
			}
			_ = syscall.Kill(-j.pgid, sig)
			if terminating(sig) && res.sig == 0 {
				res.sig = sig
			}
		case <-termDone:
			termDone = nil // it stays ready: select it once
			stop(context.Cause(term.Context()))
		case <-check.C:
			if left, m := time.Until(term.ValidUntil()), margin(); left <= m {
				stop(fmt.Errorf("lock about to expire (%v left, renewals failing)", left.Round(time.Millisecond)))
			} else {
				check.Reset(left - m)
			}
		case <-kill:
			kill = nil
			_ = syscall.Kill(-j.pgid, syscall.SIGKILL)
		}
	}
}

// jobControl reports whether qlock runs under a job-control shell that
// will continue it after a stop: it has a controlling terminal and its
// process group is not orphaned.
func (j *job) jobControl() bool {
	if j.tty == nil {
		return false
	}
	me, ok := readStat(os.Getpid())
	return ok && !orphaned(me.pgrp, me.session)
}

// suspend stops the command's group and then qlock, and on SIGCONT
// continues the group if the lease is still valid. It returns why the group
// was killed instead, or nil.
func (j *job) suspend() error {
	_ = syscall.Kill(-j.pgid, syscall.SIGSTOP) // SIGSTOP: no member can ignore it
	waitStopped(j.pgid, time.Now().Add(time.Second))
	j.reaper.tell("stop")
	// With a job-control shell, stop as the terminal would have stopped
	// the job: qlock's whole process group (a pipeline qlock is in, too).
	// The shell sees it and takes the terminal back.
	jc := j.jobControl()
	j.logf("command stopped; stopping qlock (its process group: %v)", jc)
	stopSelf(jc)
	j.logf("continued")
	// Continued. The renewal that fell due while qlock was stopped runs
	// now; wait for it while less than the margin is left (bounded: the
	// margin is TTL/3), and kill the group if the lease ran out.
	for {
		if err := j.term.Context().Err(); err != nil {
			return j.killStopped(context.Cause(j.term.Context()))
		}
		left := time.Until(j.term.ValidUntil())
		if left <= 0 {
			return j.killStopped(errors.New("the lease ran out while qlock was stopped"))
		}
		if left > j.margin {
			break
		}
		time.Sleep(min(left, 10*time.Millisecond))
	}
	if j.tty != nil && inForeground(j.tty) {
		// fg: the command gets the terminal back. (bg: it goes on in the
		// background, and stops again if it reads the terminal.)
		if tcsetpgrp(j.tty, j.pgid) == nil {
			j.gave = true
		}
	}
	j.reaper.tell("cont")
	j.logf("the lease is valid for %v; continuing the command (terminal: %v)", time.Until(j.term.ValidUntil()).Round(time.Millisecond), j.gave)
	_ = syscall.Kill(-j.pgid, syscall.SIGCONT)
	return nil
}

// killStopped kills the stopped group: the lease is gone, so nothing of it
// may run again, not even a SIGTERM handler.
func (j *job) killStopped(why error) error {
	_ = syscall.Kill(-j.pgid, syscall.SIGKILL)
	return why
}

// takeTerminal makes qlock's group the terminal's foreground group again
// if the command's (now ended) group still is, so that the next command of
// elect does not start in the background. qlock is not in the foreground
// group when it calls tcsetpgrp here: that works because it ignores
// SIGTTOU.
func (j *job) takeTerminal() {
	if !j.gave {
		return
	}
	if pg, err := tcgetpgrp(j.tty); err != nil || pg != j.pgid {
		return
	}
	_ = tcsetpgrp(j.tty, syscall.Getpgrp())
}

// exitStatus is the shell's view of how a process ended: its exit code, or
// 128+N when signal N killed it.
func exitStatus(ws syscall.WaitStatus) int {
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}
