package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"github.com/quorumlock/quorumlock/election"
)

// forwarded are the signals qlock passes on to the command's process group.
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}

// child is the outcome of running the command under a term.
type child struct {
	code int   // the exit code qlock should exit with
	lost error // non-nil when the command was stopped because the term ended or was about to
}

// runChild starts command in its own process group with the term's
// variables in its environment, forwards signals from sigs to the group,
// and stops the group (SIGTERM, then SIGKILL after grace) when the term is
// lost or its validity falls below ttl/3. It returns when the command has
// exited.
func runChild(term *election.Term, resource string, command []string, c *common, sigs <-chan os.Signal, stderr io.Writer) child {
	cmd := exec.Command(command[0], command[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(),
		"QLOCK_RESOURCE="+resource,
		"QLOCK_FENCE="+strconv.FormatInt(term.Fence(), 10),
		"QLOCK_VALID_UNTIL="+term.ValidUntil().UTC().Format(time.RFC3339Nano),
		"QLOCK_IDENTITY="+term.Leader().Identity,
	)
	// Its own process group, so that a loss stops the command and all it
	// started. Pdeathsig stops the command if qlock itself dies (nothing
	// renews the lock then); it is tied to the thread that starts the
	// command, so that thread stays locked until the command is reaped.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := cmd.Start(); err != nil {
		code := exitCannotExec
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			code = exitNotFound
		}
		return child{code: fail(stderr, code, err)}
	}
	pgid := cmd.Process.Pid
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	// The about-to-expire check: renewals come every TTL/3, so the
	// validity left stays above 2/3 TTL while they succeed; below 1/3 they
	// have failed for a whole interval.
	margin := c.ttl / 3
	check := time.NewTimer(time.Until(term.ValidUntil().Add(-margin)))
	defer check.Stop()
	var (
		lost      error
		killTimer *time.Timer
		kill      <-chan time.Time
	)
	defer func() {
		if killTimer != nil {
			killTimer.Stop()
		}
	}()
	stop := func(why error) {
		if lost != nil {
			return
		}
		lost = why
		fmt.Fprintf(stderr, "qlock: %s: %v; stopping the command (SIGTERM, SIGKILL after %v)\n", resource, why, c.grace)
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		killTimer = time.NewTimer(c.grace)
		kill = killTimer.C
	}
	for {
		select {
		case err := <-exited:
			code := exitCode(cmd, err)
			if lost != nil {
				// The group may outlive its leader: it goes too.
				if kill != nil {
					if syscall.Kill(-pgid, 0) == nil {
						<-kill
						_ = syscall.Kill(-pgid, syscall.SIGKILL)
					}
				}
				return child{code: exitLost, lost: lost}
			}
			return child{code: code}
		case s := <-sigs:
			_ = syscall.Kill(-pgid, s.(syscall.Signal))
		case <-term.Context().Done():
			stop(context.Cause(term.Context()))
		case <-check.C:
			if left := time.Until(term.ValidUntil()); left <= margin {
				stop(fmt.Errorf("lock about to expire (%v left, renewals failing)", left.Round(time.Millisecond)))
			} else {
				check.Reset(left - margin)
			}
		case <-kill:
			kill = nil
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
		}
	}
}

// exitCode is the shell's view of how cmd ended: its exit code, or 128+N
// when signal N killed it.
func exitCode(cmd *exec.Cmd, err error) int {
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	if code := cmd.ProcessState.ExitCode(); code >= 0 {
		return code
	}
	_ = err
	return exitError
}
