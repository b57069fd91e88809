package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/internal/redistest"
)

// TestRun_permits: qlock run -n 2 lets two commands run at once, refuses a
// third (-wait 0), lets a waiting one run once a permit comes back; status
// -n shows the holders.
func TestRun_permits(t *testing.T) {
	t.Parallel()
	rc := redistest.Start(t, 3)
	dir := t.TempDir()
	sleeper := func(name string, extra ...string) []string {
		args := append([]string{"run", "-n", "2", "-identity", name}, extra...)
		return append(args, "backups", "--", "sh", "-c", `echo "$QLOCK_PERMIT/$QLOCK_PERMITS" > `+filepath.Join(dir, name)+`; exec sleep 60`)
	}
	a, _ := start(t, rc, sleeper("host-a")...)
	waitFile(t, filepath.Join(dir, "host-a"), "/2", 20*time.Second)
	start(t, rc, sleeper("host-b")...)
	waitFile(t, filepath.Join(dir, "host-b"), "/2", 20*time.Second)
	pa, _ := os.ReadFile(filepath.Join(dir, "host-a"))
	pb, _ := os.ReadFile(filepath.Join(dir, "host-b"))
	if string(pa) == string(pb) {
		t.Errorf("both run under permit %q; want two permits", pa)
	}

	if code, _, stderr := run(t, rc, "run", "-n", "2", "backups", "--", "true"); code != exitNotObtained {
		t.Errorf("a third run -n 2 -wait 0 exited %d; want %d (stderr %q)", code, exitNotObtained, stderr)
	}
	code, out, _ := run(t, rc, "status", "-n", "2", "backups")
	t.Logf("qlock status -n 2 backups:\n%s", out)
	if code != 0 || strings.Count(out, "held") < 2 || !strings.Contains(out, "host-a") || !strings.Contains(out, "host-b") {
		t.Errorf("status -n 2 exited %d:\n%s\nwant 0, both permits held by host-a and host-b", code, out)
	}

	c, _ := start(t, rc, sleeper("host-c", "-wait", "forever")...)
	time.Sleep(500 * time.Millisecond)
	if _, err := os.Stat(filepath.Join(dir, "host-c")); err == nil {
		t.Fatalf("a third command ran while two held the permits")
	}
	// host-a ends: its permit goes to host-c.
	if err := a.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	wait(t, a, 20*time.Second)
	waitFile(t, filepath.Join(dir, "host-c"), "/2", 20*time.Second)
	code, out, _ = run(t, rc, "status", "-n", "2", "backups")
	if code != 0 || !strings.Contains(out, "host-c") || strings.Contains(out, "host-a") {
		t.Errorf("status -n 2 after the handover exited %d:\n%s\nwant 0, held by host-b and host-c", code, out)
	}
	_ = c.Process.Signal(syscall.SIGTERM)
	wait(t, c, 20*time.Second)
	code, out, _ = run(t, rc, "status", "-n", "2", "backups")
	if code != exitFree || !strings.Contains(out, "free") {
		t.Errorf("status -n 2 with one holder exited %d:\n%s\nwant %d, a permit free", code, out, exitFree)
	}
	if code, _, _ := run(t, rc, "elect", "-n", "2", "x", "--", "true"); code != exitUsage {
		t.Errorf("elect -n 2 exited %d; want %d", code, exitUsage)
	}
	if code, _, _ := run(t, rc, "run", "-n", "-1", "x", "--", "true"); code != exitUsage {
		t.Errorf("run -n -1 exited %d; want %d", code, exitUsage)
	}
}
