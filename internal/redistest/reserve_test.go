package redistest

import (
	"errors"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// A port that another process holds for a moment (a freePort probe's
// listener) is reserved once it is let go, within reserveWithin's wait;
// one held past the wait gives EADDRINUSE, not a hang.
func TestReserveWithin_waitsOutAMomentaryHolder(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	if _, err := reserveWithin(port, 20*time.Millisecond); !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("reserveWithin a held port = %v; want EADDRINUSE", err)
	}
	time.AfterFunc(30*time.Millisecond, func() { ln.Close() })
	r, err := reserveWithin(port, 5*time.Second)
	if err != nil {
		t.Fatalf("reserveWithin a port let go after 30ms = %v; want a reservation", err)
	}
	defer r.Close()
	if c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second); err == nil {
		c.Close()
		t.Errorf("a dial to the reserved port succeeded; want it refused")
	}
}
