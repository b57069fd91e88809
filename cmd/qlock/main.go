// Command qlock runs a command under a Redlock lock held on a majority of
// independent Redis nodes (or under one of K permits of a semaphore), runs
// a command only while it is the elected leader, and shows who holds a
// lock or the permits.
//
//	qlock run    [flags] RESOURCE -- COMMAND [ARGS...]
//	qlock run    -n K [flags] RESOURCE -- COMMAND [ARGS...]
//	qlock elect  [flags] NAME -- COMMAND [ARGS...]
//	qlock status [-n K] [flags] RESOURCE
//
// The module is not published yet: build it from a checkout of the
// repository with go build ./cmd/qlock (or go install ./cmd/qlock); run
// qlock help for the flags, the exit codes and examples.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/election"
	"github.com/quorumlock/quorumlock/redlock"
)

// Exit codes of qlock itself. Otherwise qlock exits with the command's code
// (128+N when a signal N killed it).
const (
	exitUsage       = 64  // bad flags or arguments (EX_USAGE)
	exitNoQuorum    = 69  // too few nodes answered (EX_UNAVAILABLE)
	exitError       = 70  // any other failure of qlock itself (EX_SOFTWARE)
	exitNotObtained = 75  // another holder has the lock, and -wait ran out (EX_TEMPFAIL)
	exitLost        = 76  // the lock was lost (or about to expire) while the command ran; it was stopped
	exitCannotExec  = 126 // the command is not executable
	exitNotFound    = 127 // the command was not found
	exitFree        = 1   // status: the lock is free
)

const usage = `qlock runs a command under a lock held on a majority of Redis nodes (Redlock).

Usage:
  qlock run    [flags] RESOURCE -- COMMAND [ARGS...]
  qlock run    -n K [flags] RESOURCE -- COMMAND [ARGS...]
  qlock elect  [flags] NAME -- COMMAND [ARGS...]
  qlock status [-n K] [flags] RESOURCE
  qlock help

run      Acquire the lock on RESOURCE, run COMMAND with the lock renewed
         in the background, release it when COMMAND exits, and exit with
         COMMAND's exit code. -wait 0 (the default) fails at once when the
         lock is held, like flock -n; -wait 30s waits up to 30s; -wait forever
         waits until acquired.
run -n K Run COMMAND under one of K permits of the semaphore RESOURCE (as
         consul lock -n): at most K commands run at once, across hosts.
         The permit is renewed, lost and released as the lock is; -wait
         works the same way. Every run -n of RESOURCE must give the same
         K. COMMAND also gets QLOCK_PERMIT (the permit's number, 0..K-1)
         and QLOCK_PERMITS (K).
elect    Campaign for the leadership NAME; run COMMAND while leader. If
         leadership is lost, stop COMMAND and campaign again. If COMMAND
         exits on its own, resign and exit with its code. A campaign that
         too few nodes answer is retried with backoff. For singleton
         daemons under systemd (docs/qlock.md has a unit file).
status   Show, per node, whether RESOURCE is held, by whom (the identity
         qlock run or elect wrote; never the token), its PTTL, the fence
         counter and the Lock calls waiting in the node's queue, then the
         verdict a client reaches. With -n K: one line per permit of the
         semaphore RESOURCE (held on how many nodes, by whom, its PTTL),
         the waiters, and how many permits are held.

The command gets QLOCK_RESOURCE, QLOCK_FENCE (the fencing token; 0 without
-fencing), QLOCK_VALID_UNTIL (the lease's deadline at start, RFC 3339; it
moves on with each renewal) and QLOCK_IDENTITY in its environment. It runs
in its own process group: SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and
SIGUSR2 sent to qlock are forwarded to that group. When COMMAND exits, what
is left of its group gets SIGTERM (SIGKILL after -grace), then the lock is
released; if qlock dies, a reaper process ends the group the same way.

In a terminal, COMMAND's group is the foreground group (it reads the
terminal, Ctrl-C reaches it). Ctrl-Z stops COMMAND and qlock together; fg
or bg continues COMMAND only if the lock is still valid, and kills it
otherwise (exit 76). SIGSTOP of qlock alone cannot be acted on: COMMAND
runs on unrenewed, and only -fencing (QLOCK_FENCE checked by the store)
protects against that.

When the lock is lost, or its validity falls below a third of the TTL
because renewals keep failing, qlock sends SIGTERM to the command's group,
SIGKILL after -grace; then run exits with code 76, and elect campaigns
again. Keep -grace at most a third of -ttl (the defaults: 10s and 30s) so
that the command is gone before another holder can get the lock.

Flags (before RESOURCE or NAME):
  -nodes URL,URL,...  the Redis nodes, independent masters (default
                      $QLOCK_NODES): redis://, rediss://, unix://,
                      redis+sentinel://, redis+cluster:// URLs, as
                      redlock.Dial takes them; use an odd number, 3 or 5
  -ttl DURATION       lease per renewal (default 30s)
  -fencing            hand out fencing tokens (QLOCK_FENCE)
  -prefix STRING      key prefix, as the library's WithKeyPrefix (default "lock:")
  -cacert FILE        PEM CA certificates to trust for rediss:// URLs
                      (default: the system's roots)
  -cert FILE -key FILE  a client certificate and its key, for mutual TLS
  -identity STRING    run, elect: the identity status shows (default HOSTNAME:PID)
  -wait DURATION      run: how long to wait for the lock: 0, a duration, or
                      forever (default 0)
  -n K                run, status: a semaphore of K permits, not a lock
                      (default 0: a lock)
  -grace DURATION     run, elect: time between SIGTERM and SIGKILL after a
                      loss (default 10s)
  -read               run: take a read lock, shared with other -read runs;
                      a plain run of RESOURCE is its writer (docs/rwlock.md)
  -v                  log what happens to stderr

Exit codes:
  COMMAND's code  run, elect: COMMAND's exit code; 128+N if signal N killed it
  0               status: held by a majority (-n: every permit held)
  1               status: free (-n: a permit is free)
  64              bad usage
  69              no quorum: too few nodes answered
  70              other failure of qlock itself (e.g. a node refused the
                  credentials, ACL or TLS)
  75              run: not obtained: the lock is held by another, -wait ran out
  76              run: the lock was lost while COMMAND ran; COMMAND was stopped
                  (elect stops it too, then campaigns again; a signal INT,
                  TERM, HUP or QUIT meanwhile makes elect exit 128+N)
  126, 127        COMMAND could not be executed, or was not found
  128+N           qlock was stopped by signal N while waiting for the lock

Examples:
  # Cron: one report across the fleet every 5 minutes; skip if still running.
  */5 * * * * qlock run -nodes redis://a:6379,redis://b:6379,redis://c:6379 nightly-report -- ./report.sh

  # Wait up to a minute for the migration lock, with fencing tokens.
  qlock run -wait 1m -fencing migrate -- ./migrate.sh

  # A singleton daemon: one leader runs it, the others stand by.
  QLOCK_NODES=redis://a,redis://b,redis://c qlock elect scheduler -- /usr/bin/scheduler

  # Who holds it?
  qlock status nightly-report

  # At most 4 backups at once across the fleet; who runs them?
  qlock run -n 4 -wait forever backups -- ./backup.sh
  qlock status -n 4 backups
`

func main() {
	if len(os.Args) > 1 && os.Args[1] == reaperArg {
		os.Exit(reap(os.Args[2:]))
	}
	os.Exit(Main(os.Args[1:], os.Stdout, os.Stderr))
}

// Main runs qlock with args (without the program name) and returns the exit
// code.
func Main(args []string, stdout, stderr io.Writer) int {
	// go-redis logs failed dials on its own; errors reach the user as one
	// line from qlock instead (with -v, go-redis's lines go to the logger).
	redis.SetLogger(redisLog{})
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	switch args[0] {
	case "run":
		return cmdRun(args[1:], stdout, stderr)
	case "elect":
		return cmdElect(args[1:], stdout, stderr)
	case "status":
		return cmdStatus(args[1:], stdout, stderr)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	return fail(stderr, exitUsage, fmt.Errorf("unknown command %q: want run, elect, status or help", args[0]))
}

// fail prints err as one line on stderr and returns code.
func fail(stderr io.Writer, code int, err error) int {
	msg := strings.ReplaceAll(err.Error(), "\n", "; ")
	fmt.Fprintf(stderr, "qlock: %s\n", msg)
	return code
}

// common holds the flags every command takes.
type common struct {
	nodes    string
	ttl      time.Duration
	fencing  bool
	prefix   string
	identity string
	verbose  bool
	wait     waitFlag
	permits  int // -n: run, status: one of K permits of a semaphore; 0: a lock
	grace    time.Duration
	cacert   string // PEM file of the CAs to trust for rediss URLs
	cert     string // PEM file of a client certificate (mutual TLS)
	key      string // PEM file of its key
	read     bool   // run -read: under a read lock (read.go)
}

// waitFlag is -wait: a duration, or "forever" (negative).
type waitFlag struct{ d time.Duration }

func (w *waitFlag) String() string {
	if w.d < 0 {
		return "forever"
	}
	return w.d.String()
}

func (w *waitFlag) Set(s string) error {
	if s == "forever" || s == "inf" {
		w.d = -1
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return errors.New(`want a duration ≥ 0 or "forever"`)
	}
	w.d = d
	return nil
}

// flags returns a flag set with the common flags; run and elect add theirs.
func (c *common) flags(name string, stderr io.Writer, withRun bool) *flag.FlagSet {
	fs := flag.NewFlagSet("qlock "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&c.nodes, "nodes", os.Getenv("QLOCK_NODES"), "")
	fs.DurationVar(&c.ttl, "ttl", redlock.DefaultTTL, "")
	fs.BoolVar(&c.fencing, "fencing", false, "")
	fs.StringVar(&c.prefix, "prefix", redlock.DefaultKeyPrefix, "")
	fs.BoolVar(&c.verbose, "v", false, "")
	fs.StringVar(&c.cacert, "cacert", "", "")
	fs.StringVar(&c.cert, "cert", "", "")
	fs.StringVar(&c.key, "key", "", "")
	fs.IntVar(&c.permits, "n", 0, "")
	if withRun {
		fs.StringVar(&c.identity, "identity", election.DefaultIdentity(), "")
		fs.Var(&c.wait, "wait", "")
		fs.DurationVar(&c.grace, "grace", 10*time.Second, "")
		if name == "run" {
			fs.BoolVar(&c.read, "read", false, "")
		}
	}
	return fs
}

// parse parses args into c and returns the positional arguments: the
// resource (what names it in errors: RESOURCE or NAME), then the command
// (after an optional "--"). It checks the arguments before any I/O, so
// that a bad one is named as qlock's own, not by the library.
func (c *common) parse(fs *flag.FlagSet, what string, args []string, stdout io.Writer) (resource string, command []string, err error) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, usage)
			return "", nil, flag.ErrHelp
		}
		return "", nil, err
	}
	rest := fs.Args()
	if len(rest) == 0 {
		return "", nil, errors.New("missing " + what)
	}
	resource, command = rest[0], rest[1:]
	if resource == "" {
		return "", nil, errors.New(what + " must not be empty")
	}
	switch i := slices.Index(command, "--"); {
	case i == 0:
		command = command[1:]
	case i > 0 && strings.HasPrefix(command[0], "-"):
		// "qlock run res -wait 5s -- cmd": flag parsing stopped at RESOURCE.
		return "", nil, fmt.Errorf("%q before --: flags go before RESOURCE", command[:i])
	}
	switch {
	case c.nodes == "":
		return "", nil, errors.New("no nodes: set -nodes or QLOCK_NODES")
	case c.ttl <= 0:
		return "", nil, errors.New("-ttl must be positive")
	case c.grace < 0:
		return "", nil, errors.New("-grace must be ≥ 0")
	case (c.cert == "") != (c.key == ""):
		return "", nil, errors.New("-cert and -key go together")
	case c.permits < 0 || c.permits > maxPermits:
		return "", nil, fmt.Errorf("-n must be in [1, %d] (or 0: a lock), got %d", maxPermits, c.permits)
	}
	return resource, command, nil
}

func (c *common) urls() []string {
	var out []string
	for _, u := range strings.Split(c.nodes, ",") {
		if u = strings.TrimSpace(u); u != "" {
			out = append(out, u)
		}
	}
	return out
}

func (c *common) logger(stderr io.Writer) *slog.Logger {
	if !c.verbose {
		return nil
	}
	l := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	redis.SetLogger(redisLog{l})
	return l
}

// redisLog passes go-redis's log lines to a logger at Debug, or drops them.
type redisLog struct{ l *slog.Logger }

func (r redisLog) Printf(ctx context.Context, format string, args ...any) {
	if r.l != nil {
		r.l.DebugContext(ctx, "go-redis: "+fmt.Sprintf(format, args...))
	}
}

// tlsOptions returns WithTLSConfig for -cacert, -cert and -key, or nothing
// when none is given (rediss URLs then trust the system's roots).
func (c *common) tlsOptions() ([]redlock.Option, error) {
	if c.cacert == "" && c.cert == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.cacert != "" {
		pem, err := os.ReadFile(c.cacert)
		if err != nil {
			return nil, fmt.Errorf("-cacert: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("-cacert %s: no PEM certificate in it", c.cacert)
		}
	}
	if c.cert != "" {
		pair, err := tls.LoadX509KeyPair(c.cert, c.key)
		if err != nil {
			return nil, fmt.Errorf("-cert, -key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return []redlock.Option{redlock.WithTLSConfig(cfg)}, nil
}

// connect dials the nodes (redlock.Dial: it checks them with PING) and
// builds plain clients of the same nodes (they connect on first use). The
// election no longer needs them: it uses the Client's own nodes. The caller
// closes both.
func (c *common) connect(ctx context.Context, stderr io.Writer) (*redlock.Client, []redis.UniversalClient, error) {
	tlsOpts, err := c.tlsOptions()
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", redlock.ErrInvalidArgument, err)
	}
	opts := append([]redlock.Option{redlock.WithTTL(c.ttl), redlock.WithKeyPrefix(c.prefix)}, tlsOpts...)
	if l := c.logger(stderr); l != nil {
		opts = append(opts, redlock.WithLogger(l))
	}
	client, err := redlock.Dial(ctx, c.urls(), opts...)
	if err != nil {
		return nil, nil, err
	}
	nodes, err := redlock.NodeClients(c.urls(), tlsOpts...)
	if err != nil {
		client.Close()
		return nil, nil, err
	}
	return client, nodes, nil
}

func closeNodes(nodes []redis.UniversalClient) {
	for _, n := range nodes {
		n.Close()
	}
}

// exitFor maps an error of connecting or acquiring to an exit code.
func exitFor(err error) int {
	switch {
	case errors.Is(err, redlock.ErrInvalidArgument):
		return exitUsage
	case errors.Is(err, redlock.ErrNotObtained):
		return exitNotObtained
	case errors.Is(err, redlock.ErrNoQuorum):
		return exitNoQuorum
	}
	return exitError
}
