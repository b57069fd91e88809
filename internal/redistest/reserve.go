package redistest

import (
	"errors"
	"io"
	"net"
	"syscall"
	"time"
)

// reserve binds a TCP socket to 127.0.0.1:port without listening on it, and
// returns it. Dials to the port are refused then, as to a closed port, but
// no other server can bind it: a killed node's address stays down, where
// another test's server starting meanwhile could otherwise draw the freed
// port (freePort) and answer for it — a client of the killed node would
// then count a stranger's grant. It returns an error when the port cannot
// be bound: a connection of the dead server lingers on it (TIME_WAIT or
// FIN_WAIT2, which a bind without SO_REUSEADDR respects), or someone took
// it in the moment since the kill.
//
// The socket is made with syscall because net offers no bind without
// listen. It is close-on-exec, made under syscall.ForkLock as the net
// package does: a copy inherited by a redis-server that another test
// starts meanwhile would keep the port bound after Restart closed ours
// (seen: "port ... was taken" on Restart). It has no SO_REUSEADDR: with it,
// a server setting SO_REUSEADDR could bind the port beside it.
func reserve(port int) (io.Closer, error) {
	syscall.ForkLock.RLock()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, syscall.IPPROTO_TCP)
	if err == nil {
		syscall.CloseOnExec(fd)
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		return nil, err
	}
	sa := &syscall.SockaddrInet4{Port: port, Addr: [4]byte(net.IPv4(127, 0, 0, 1).To4())}
	if err := syscall.Bind(fd, sa); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	return reservation(fd), nil
}

// reserveWithin is reserve, tried again every few milliseconds for up to
// wait while the port is in use: another process's freePort probes ports
// with a listener it closes at once, and one that drew this port in the
// moment after the kill holds it only that long (seen once in ten runs of
// the test command under load). A connection of the dead server that
// lingers holds it for far longer, and then the last error is returned.
func reserveWithin(port int, wait time.Duration) (io.Closer, error) {
	deadline := time.Now().Add(wait)
	for {
		r, err := reserve(port)
		if err == nil || !errors.Is(err, syscall.EADDRINUSE) || time.Now().After(deadline) {
			return r, err
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// reservation is a socket bound by reserve.
type reservation int

func (r reservation) Close() error { return syscall.Close(int(r)) }
