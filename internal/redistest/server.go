package redistest

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
)

// This file holds what the multi-process topologies (Sentinel, Redis
// Cluster, TLS) share: servers started without a proxy in front, and the
// probe for the binaries they need.

// require skips t, or fails it when the environment variable CI is set, if
// the program name is not on PATH. It returns the program's path.
func require(t testing.TB, name, hint string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	msg := "redistest: " + name + " not found on PATH; install it with: " + hint
	if os.Getenv("CI") != "" {
		t.Fatal(msg + " (failing, not skipping, because CI is set)")
	}
	t.Skip(msg)
	return ""
}

// requireServer is require for redis-server, which also runs Sentinels
// (redis-server --sentinel, the program Debian's redis-sentinel links to).
func requireServer(t testing.TB) string {
	t.Helper()
	return require(t, "redis-server", InstallHint)
}

// server is one redis-server (or Sentinel) process on 127.0.0.1, without a
// proxy: the topologies reach their servers directly, as they would in
// production.
type server struct {
	dir  string // holds redis.log and data/
	port int    // write-once

	mu   sync.Mutex // protects proc
	proc *process   // nil once killed
}

func (s *server) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

func (s *server) logPath() string { return filepath.Join(s.dir, "redis.log") }

// kill sends SIGKILL and reaps the process; killing a dead server does
// nothing.
func (s *server) kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		s.proc.kill()
		s.proc = nil
	}
}

func (s *server) alive() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc != nil
}

// startServer starts redis-server with its data in dir/data on a free port,
// with the defaults of spawn and then extra, retrying on another port when
// one was taken meanwhile.
func startServer(dir string, extra ...string) (*server, error) {
	return startServerEnv(dir, nil, extra...)
}

// startServerEnv is startServer with env added to the server's environment.
func startServerEnv(dir string, env []string, extra ...string) (*server, error) {
	s := &server{dir: dir}
	if err := resetDir(filepath.Join(dir, "data")); err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		p, err := spawn(port, filepath.Join(dir, "data"), s.logPath(), extra, env...)
		if err == nil {
			s.port, s.proc = port, p
			return s, nil
		}
		if !errors.Is(err, errAddrInUse) || attempt == startAttempts {
			return nil, err
		}
	}
}

// directClient returns a client for addr with the harness's fail-fast
// options (see Cluster.Client).
func directClient(addr string) *redis.Client { return redis.NewClient(clientOptions(addr)) }

// logsOf logs the log of every server in ss through logf.
func logsOf(logf func(string, ...any), ss ...*server) {
	for _, s := range ss {
		if s == nil {
			continue
		}
		if b, err := os.ReadFile(s.logPath()); err == nil && len(b) > 0 {
			logf("redistest: %s (%s) log:\n%s", filepath.Base(s.dir), s.addr(), b)
		}
	}
}
