package redistest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// GCCHint is the command that installs gcc on Debian and Ubuntu, which
// WithClockOffset needs to build its clock shim.
const GCCHint = "apt-get install -y gcc"

// clockOffsetEnv is the shim's environment variable: the offset in µs.
const clockOffsetEnv = "REDISTEST_CLOCK_OFFSET_US"

// clockShimSrc is an LD_PRELOAD library that adds a fixed offset to the
// wall clock of the process it is loaded into: gettimeofday, time and
// clock_gettime of CLOCK_REALTIME(_COARSE). Monotonic clocks are left as
// they are. redis-server (dynamically linked) reads the wall clock only
// through these (ustime/mstime, TIME, and TIME inside scripts, which is
// what the lock scripts compare their bounds with), so the whole server,
// scripts included, sees the shifted clock, as on a host whose clock is
// off. Its own definition of gettimeofday is declared under another C name
// with an asm label, so that it compiles whatever prototype sys/time.h
// gives (glibc changed the timezone argument's type).
const clockShimSrc = `#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

static long long offset_us;
static int (*real_clock_gettime)(clockid_t, struct timespec *);
static int (*real_gettimeofday)(struct timeval *, void *);

static void init(void) {
	const char *s = getenv("` + clockOffsetEnv + `");
	offset_us = s ? atoll(s) : 0;
	real_clock_gettime = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
	real_gettimeofday = (int (*)(struct timeval *, void *))dlsym(RTLD_NEXT, "gettimeofday");
}

__attribute__((constructor)) static void shim_init(void) { init(); }

int clock_gettime(clockid_t id, struct timespec *ts) {
	if (!real_clock_gettime) init();
	int r = real_clock_gettime(id, ts);
	if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
		long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + offset_us * 1000LL;
		ts->tv_sec = ns / 1000000000LL;
		ts->tv_nsec = ns % 1000000000LL;
	}
	return r;
}

int shim_gettimeofday(struct timeval *tv, void *tz) __asm__("gettimeofday");
int shim_gettimeofday(struct timeval *tv, void *tz) {
	if (!real_gettimeofday) init();
	int r = real_gettimeofday(tv, tz);
	if (r == 0 && tv) {
		long long us = (long long)tv->tv_sec * 1000000LL + tv->tv_usec + offset_us;
		tv->tv_sec = us / 1000000LL;
		tv->tv_usec = us % 1000000LL;
	}
	return r;
}

time_t time(time_t *t) {
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	if (t) *t = ts.tv_sec;
	return ts.tv_sec;
}
`

// WithClockOffset makes server i's wall clock read d ahead of the host's
// (behind when d < 0), as if its host's clock were off by d: TIME, TIME
// inside scripts, and expiries computed from the wall clock all see it.
// It applies to StartRedisCluster only (Start and StartCluster refuse it),
// where i is the master's index in Addrs. It preloads a small C library
// (LD_PRELOAD), built with gcc at start: the test is skipped without gcc,
// and fails when CI is set. StartRedisCluster checks that the offset took
// effect. The default is no offset.
func WithClockOffset(i int, d time.Duration) Option {
	return optionFunc(func(c *config) {
		if c.clockOffsets == nil {
			c.clockOffsets = make(map[int]time.Duration)
		}
		c.clockOffsets[i] = d
	})
}

// clockShim builds the shim into dir with gcc and returns its path.
func clockShim(t testing.TB, dir string) string {
	t.Helper()
	gcc := require(t, "gcc", GCCHint)
	src := filepath.Join(dir, "clockshift.c")
	lib := filepath.Join(dir, "clockshift.so")
	if err := os.WriteFile(src, []byte(clockShimSrc), 0o644); err != nil {
		t.Fatalf("redistest: clock shim: %v", err)
	}
	if out, err := exec.Command(gcc, "-shared", "-fPIC", "-O2", "-o", lib, src, "-ldl").CombinedOutput(); err != nil {
		t.Fatalf("redistest: building the clock shim: %v\n%s", err, out)
	}
	return lib
}

// clockEnv returns the environment of each of n servers under the offsets
// of cfg: nil for a server without one.
func clockEnv(t testing.TB, dir string, n int, cfg config) [][]string {
	t.Helper()
	env := make([][]string, n)
	if len(cfg.clockOffsets) == 0 {
		return env
	}
	lib := clockShim(t, dir)
	for i, d := range cfg.clockOffsets {
		if i < 0 || i >= n {
			t.Fatalf("redistest: WithClockOffset(%d, …) with %d servers", i, n)
		}
		env[i] = []string{"LD_PRELOAD=" + lib, clockOffsetEnv + "=" + strconv.FormatInt(d.Microseconds(), 10)}
	}
	return env
}

// checkClockOffsets verifies that every server with an offset reads its
// clock shifted by it (within clockSlack), with TIME and with TIME inside
// a script, so that a shim that did not load fails the test instead of
// testing nothing.
func checkClockOffsets(ctx context.Context, addrs []string, cfg config) error {
	const clockSlack = 500 * time.Millisecond
	for i, d := range cfg.clockOffsets {
		cl := directClient(addrs[i])
		t1, err := cl.Time(ctx).Result()
		var v []any
		if err == nil {
			v, err = cl.Eval(ctx, "return redis.call('TIME')", nil).Slice()
		}
		cl.Close()
		if err != nil {
			return fmt.Errorf("redistest: clock of %s: %w", addrs[i], err)
		}
		sec, _ := strconv.ParseInt(fmt.Sprint(v[0]), 10, 64)
		t2 := time.Unix(sec, 0)
		now := time.Now()
		for _, got := range []time.Duration{t1.Sub(now), t2.Sub(now)} {
			if got < d-clockSlack-time.Second || got > d+clockSlack {
				return fmt.Errorf("redistest: %s's clock is %v off ours; want %v (is the LD_PRELOAD shim loaded?)", addrs[i], got, d)
			}
		}
	}
	return nil
}
