package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/internal/redistest"
)

// cpuTime returns the user+system CPU time process pid has used.
func cpuTime(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / 100 // USER_HZ is 100 on Linux
}

// waitStderr waits up to d until the stderr buffer contains s.
func waitStderr(t *testing.T, b *syncBuffer, s string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !strings.Contains(b.String(), s) {
		if time.Now().After(deadline) {
			t.Fatalf("stderr does not show %q within %v: %q", s, d, b.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRun_noSpinAfterLoss: while qlock waits out -grace for a command that
// ignores SIGTERM after a loss, it sleeps. (Before: the term's Done channel
// stayed ready in its select loop, a full core for the whole grace.)
func TestRun_noSpinAfterLoss(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	file := filepath.Join(t.TempDir(), "log")
	cmd, stderr := start(t, rc, "run", "-ttl", "3s", "-grace", "6s", "spinres", "--", "sh", "-c",
		fmt.Sprintf(`trap '' TERM; echo ready >> %s; while :; do sleep 0.05; done`, file))
	waitFile(t, file, "ready", 30*time.Second)
	rc.Pause(1)
	rc.Pause(2)
	t.Cleanup(func() { rc.Resume(1); rc.Resume(2) })
	waitStderr(t, stderr, "stopping the command", 15*time.Second)
	// That was the about-to-expire check, TTL/3 before the lease ends;
	// the term's end (the loss) follows within a second.
	time.Sleep(1500 * time.Millisecond)
	before, begin := cpuTime(t, cmd.Process.Pid), time.Now()
	time.Sleep(2 * time.Second)
	used, wall := cpuTime(t, cmd.Process.Pid)-before, time.Since(begin)
	t.Logf("qlock used %v of CPU in %v of its grace period", used, wall.Round(time.Millisecond))
	if used > wall/10 { // measured: 10ms in 2s; the spin: 550ms to 1.4s
		t.Errorf("qlock used %v of CPU in %v while waiting for the command to exit; want it asleep", used, wall)
	}
	if code := wait(t, cmd, 15*time.Second); code != exitLost {
		t.Errorf("exit %d; want %d", code, exitLost)
	}
}

// TestElect_signalDuringLossGrace: SIGTERM to qlock elect while it stops
// the command after a loss (systemctl stop at that moment) ends it with
// 128+15 once the command is gone; it does not campaign again. (Before: the
// forwarded signal was forgotten; elect was re-elected and ran the command
// again until systemd's SIGKILL.)
func TestElect_signalDuringLossGrace(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	file := filepath.Join(t.TempDir(), "log")
	cmd, stderr := start(t, rc, "elect", "-ttl", "3s", "-grace", "3s", "-identity", "a", "gracename", "--", "sh", "-c",
		fmt.Sprintf(`trap 'echo stop >> %s; sleep 1; exit 0' TERM; echo lead >> %s; while :; do sleep 0.05; done`, file, file))
	waitFile(t, file, "lead", 30*time.Second)
	rc.Pause(1)
	rc.Pause(2)
	waitFile(t, file, "stop", 15*time.Second) // the loss's SIGTERM
	rc.Resume(1)
	rc.Resume(2)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := wait(t, cmd, 15*time.Second); code != 128+int(syscall.SIGTERM) {
		t.Errorf("exit %d; want %d (stderr %q)", code, 128+int(syscall.SIGTERM), stderr.String())
	}
	if b, _ := os.ReadFile(file); strings.Count(string(b), "lead") != 1 {
		t.Errorf("log %q: the command ran again after qlock got SIGTERM", b)
	}
}

// aclAllBut returns ACL key patterns that match every key except key
// (which must hold no glob character). Redis ACLs only grant, so the
// complement of one name is spelled out: the keys that first differ from it
// at each position, its proper prefixes, and the longer keys.
func aclAllBut(key string) []string {
	var pats []string
	for i := range len(key) {
		pats = append(pats, "~"+key[:i]+"[^"+key[i:i+1]+"]*")
		if i > 0 {
			pats = append(pats, "~"+key[:i])
		}
	}
	return append(pats, "~"+key+"?*")
}

// TestElect_retriesTransientNoQuorum: the elected candidate's identity
// cannot be written on a majority for a while (an ACL refuses its key on
// two nodes of three), so Campaign fails with ErrNoQuorum; qlock elect
// campaigns again with backoff and leads once the nodes take the identity.
// (Before: it exited 69 at the first failure.)
func TestElect_retriesTransientNoQuorum(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	for i := range rc.N() {
		args := []any{"ACL", "SETUSER", "q", "on", ">pw", "+@all", "&*"}
		if i > 0 {
			for _, p := range aclAllBut("lock:blip:leader") {
				args = append(args, p)
			}
		} else {
			args = append(args, "~*")
		}
		if err := rc.Admin(i).Do(t.Context(), args...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	var urls []string
	for i := range rc.N() {
		urls = append(urls, "redis://q:pw@"+rc.Addr(i))
	}
	file := filepath.Join(t.TempDir(), "log")
	cmd := exec.Command(qlockBin, "elect", "-ttl", "5s", "blip", "--", "sh", "-c",
		fmt.Sprintf(`echo lead >> %s; sleep 0.2`, file))
	cmd.Env = append(os.Environ(), "QLOCK_NODES="+strings.Join(urls, ","))
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
	waitCmd.Store(cmd, done)

	deadline := time.Now().Add(20 * time.Second)
	for strings.Count(stderr.String(), "campaigning again") < 2 {
		select {
		case <-done:
			t.Fatalf("qlock elect exited %d on a transient no-quorum; stderr %q", cmd.ProcessState.ExitCode(), stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no retried campaign within 20s; stderr %q", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	for i := 1; i < rc.N(); i++ {
		if err := rc.Admin(i).Do(t.Context(), "ACL", "SETUSER", "q", "~*").Err(); err != nil {
			t.Fatal(err)
		}
	}
	waitFile(t, file, "lead", 30*time.Second)
	if code := wait(t, cmd, 15*time.Second); code != 0 {
		t.Errorf("exit %d; want the command's 0 (stderr %q)", code, stderr.String())
	}
}

// TestRun_groupEndedOnRelease: a background process the command left
// behind is ended before the lock is released. (Before: it ran on after
// qlock exited, without the lock.)
func TestRun_groupEndedOnRelease(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	pidFile := filepath.Join(t.TempDir(), "bg")
	code, _, stderr := run(t, rc, "run", "-grace", "2s", "bgres", "--", "sh", "-c",
		fmt.Sprintf(`sleep 300 >/dev/null 2>&1 & echo $! > %s; exit 3`, pidFile)) // (not holding qlock's output pipes)
	if code != 3 {
		t.Fatalf("exit %d; want the command's 3 (stderr %q)", code, stderr)
	}
	b, _ := os.ReadFile(pidFile)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("pid file %q: %v", b, err)
	}
	if !isGone(pid) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		t.Errorf("the command's background process (pid %d) outlived the release", pid)
	}
}

// TestRun_groupEndedWhenQlockDies: qlock is SIGKILLed while the command
// runs under sh -c; the reaper ends the whole group, grandchildren too.
// (Before: Pdeathsig reached sh only, and its child ran on.)
func TestRun_groupEndedWhenQlockDies(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	pidFile := filepath.Join(t.TempDir(), "pids")
	cmd, _ := start(t, rc, "run", "-grace", "1s", "dieres", "--", "sh", "-c",
		fmt.Sprintf(`sleep 300 & echo "$$ $!" > %s; wait`, pidFile))
	waitFile(t, pidFile, "\n", 30*time.Second)
	var shPID, sleepPID int
	b, _ := os.ReadFile(pidFile)
	if _, err := fmt.Sscan(string(b), &shPID, &sleepPID); err != nil {
		t.Fatalf("%q: %v", b, err)
	}
	// Killed at the end only if still there: once gone, their PIDs may
	// be another process's (the tests run in parallel).
	t.Cleanup(func() {
		for _, pid := range []int{sleepPID, shPID} {
			if !isGone(pid) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	deadline := killed.Add(10 * time.Second)
	for !isGone(shPID) || !isGone(sleepPID) {
		if time.Now().After(deadline) {
			t.Fatalf("10s after qlock was killed: sh gone %v, its child gone %v", isGone(shPID), isGone(sleepPID))
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("the command's group was gone %v after qlock's SIGKILL", time.Since(killed).Round(time.Millisecond))
}

// TestDocs_systemdUnit checks the unit file in docs/qlock.md with
// systemd-analyze verify, with the paths of this machine: it must load with
// no warning at all (verify exits 0 on unknown keys and bad values, only
// printing them).
func TestDocs_systemdUnit(t *testing.T) {
	t.Parallel()
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("systemd-analyze is needed in CI (.ci/run installs the systemd package)")
		}
		t.Skip("systemd-analyze not installed")
	}
	doc, err := os.ReadFile("../../docs/qlock.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)```ini\n(# qlock-scheduler.service.*?)```").FindSubmatch(doc)
	if m == nil {
		t.Fatal("docs/qlock.md has no ```ini block starting with # qlock-scheduler.service")
	}
	unit := strings.NewReplacer("/usr/local/bin/qlock", qlockBin, "/usr/local/bin/scheduler", "/bin/sleep").Replace(string(m[1]))
	dir := t.TempDir()
	path := filepath.Join(dir, "qlock-scheduler.service")
	if err := os.WriteFile(path, []byte(unit), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", path).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s\nunit:\n%s", err, out, unit)
	}
}
