package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

const (
	// readyTimeout bounds how long a new server may take to answer. A local
	// redis-server with nothing to load answers within tens of milliseconds.
	readyTimeout = 5 * time.Second

	// probeTimeout bounds one readiness probe. A probe that times out is
	// simply retried, so this can be short; being short matters when a
	// stranger holds the port and never answers: waitReady then gets to see
	// our server exit with "Address already in use" sooner.
	probeTimeout = 100 * time.Millisecond

	// reserveWait bounds how long Kill tries to reserve the dead server's
	// port while someone else holds it (reserveWithin): a freePort probe
	// holds a port for microseconds, so this is ample under load.
	reserveWait = 250 * time.Millisecond

	// logTail is how much of a server log goes into a start error.
	logTail = 2 << 10
)

// errAddrInUse means the chosen port was taken by someone else between our
// probe for a free port and the server's bind; the caller retries elsewhere.
var errAddrInUse = errors.New("redistest: port already in use")

// lookPath probes for redis-server once per test binary, as nats.go's
// testerProbe does: every Start needs the answer, and it cannot change.
var lookPath = sync.OnceValues(func() (string, error) {
	return exec.LookPath("redis-server")
})

// process is one running redis-server that we started.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd.Wait has returned, i.e. the child is reaped
	err  error         // cmd.Wait's result; read only after done is closed
}

// spawn starts redis-server on 127.0.0.1:port with its data in dataDir,
// appending its output to logPath, and waits until it answers. env is added
// to the server's environment. On failure it kills and reaps the process
// before returning.
func spawn(port int, dataDir, logPath string, extra []string, env ...string) (*process, error) {
	path, err := lookPath()
	if err != nil {
		return nil, ErrNoRedisServer
	}
	args := []string{
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", dataDir,
		"--protected-mode", "no",
		"--loglevel", "warning",
	}
	// Later arguments override earlier ones in redis-server, so WithArgs
	// can change any of the defaults above.
	args = append(args, extra...)
	return startProcess(path, args, dataDir, port, logPath, env...)
}

// startProcess runs the program at path with args in directory dir,
// appending its output to logPath, and waits until it answers INFO server on
// 127.0.0.1:port as itself. On failure it kills and reaps the process before
// returning. It is spawn without the default arguments, for servers started
// differently (a Sentinel, whose config file comes first). env is added to
// the environment the program inherits.
func startProcess(path string, args []string, dir string, port int, logPath string, env ...string) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child has its own descriptor after Start
	logStart, err := logFile.Seek(0, io.SeekEnd)
	if err != nil {
		return nil, err
	}

	cmd := exec.Command(path, args...)
	cmd.Dir = dir
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	// An *os.File is handed to the child as is; any other io.Writer would
	// make exec start copying goroutines that Wait must drain.
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("redistest: start redis-server: %w", err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	// The only goroutine per process: it reaps the child, so that no zombie
	// is left, and tells kill when the child is gone.
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()

	if err := p.waitReady(port); err != nil {
		p.kill()
		tail := readFrom(logPath, logStart)
		if strings.Contains(tail, "Address already in use") {
			err = errAddrInUse
		}
		return nil, fmt.Errorf("redistest: redis-server on port %d: %w\n%s", port, err, tail)
	}
	return p, nil
}

// waitReady polls until the server on port answers as this process.
func (p *process) waitReady(port int) error {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.Now().Add(readyTimeout)
	for {
		err := probe(addr, p.cmd.Process.Pid)
		if err == nil || errors.Is(err, errAddrInUse) {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v: %w", readyTimeout, err)
		}
		select {
		case <-p.done:
			return fmt.Errorf("exited before answering: %v", p.err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// probe asks the server at addr for INFO server and checks that its
// process_id is pid. A bare PING is not enough: if another program took the
// port first, our server fails to bind while the other one answers.
func probe(addr string, pid int) error {
	c, err := net.DialTimeout("tcp", addr, probeTimeout)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(probeTimeout)); err != nil {
		return err
	}
	if _, err := io.WriteString(c, "INFO server\r\n"); err != nil {
		return err
	}
	r := bufio.NewReader(c)
	head, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	// A bulk string: "$<len>\r\n<body>\r\n". Anything else (-LOADING, or
	// not Redis at all) means not ready, or not ours.
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(head, "$")))
	if !strings.HasPrefix(head, "$") || err != nil || n < 0 {
		return fmt.Errorf("unexpected reply %q", strings.TrimSpace(head))
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return err
	}
	want := "process_id:" + strconv.Itoa(pid) + "\r\n"
	if !strings.Contains(string(body), want) {
		return errAddrInUse
	}
	return nil
}

// kill sends SIGKILL and waits until the child is reaped. It is a no-op on a
// process that has already exited.
func (p *process) kill() {
	// SIGKILL first, SIGCONT second. The kernel wakes a stopped process to
	// deliver SIGKILL, so a paused server dies either way; but resuming it
	// first would let it execute the commands that piled up while it was
	// paused, just before it dies. SIGCONT after is belt and braces: nothing
	// we started is ever left stopped. Signal on a reaped process returns
	// os.ErrProcessDone and never reaches a recycled PID.
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	<-p.done
}

// pause sends SIGSTOP and waits until the server is actually stopped, so
// that a command sent right after Pause cannot slip in first.
func (p *process) pause() error {
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	return waitStopped(p.cmd.Process.Pid)
}

func (p *process) resume() error {
	return p.cmd.Process.Signal(syscall.SIGCONT)
}

// Server ports are drawn from [minPort, the kernel's ephemeral range), when
// that leaves at least minPortSpan ports.
const (
	minPort     = 15000
	minPortSpan = 1000
)

// freePort returns a port on 127.0.0.1 that was free a moment ago; someone may
// still take it before our server binds it, and spawn reports errAddrInUse
// then.
//
// It prefers a random port below the ephemeral range over asking the kernel
// for 127.0.0.1:0. Ports from :0 are ephemeral ports, and every outgoing
// connection on the machine (each client dial in a parallel test, say) takes
// one too: after Kill, the dead server's port would soon be some
// connection's local port, and Restart could not bind it again.
func freePort() (int, error) {
	if hi := ephemeralLow(); hi-minPort >= minPortSpan {
		for range 20 {
			port := minPort + rand.IntN(hi-minPort)
			ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
			if err == nil {
				ln.Close()
				return port, nil
			}
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// ephemeralLow returns the first port of the kernel's ephemeral range: from
// Linux's ip_local_port_range, else 32768, which is below the default of
// Linux (32768), the BSDs and macOS (49152).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) < 1 {
		return 32768
	}
	lo, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return lo
}

// readFrom returns the end of the file at path from offset, at most logTail
// bytes of it, or "" if it cannot be read.
func readFrom(path string, offset int64) string {
	b, err := os.ReadFile(path)
	if err != nil || offset > int64(len(b)) {
		return ""
	}
	b = b[offset:]
	if len(b) > logTail {
		b = b[len(b)-logTail:]
	}
	return string(b)
}

// resetDir empties dir (creating it if needed), so that a restarted server
// finds no data to load even if WithArgs turned persistence on.
func resetDir(dir string) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	return os.MkdirAll(filepath.Clean(dir), 0o755)
}
