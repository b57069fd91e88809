package main

import (
	"net"
	"sync"
	"time"
)

// proxy is a TCP proxy on 127.0.0.1 in front of one Redis node. Cut makes
// the node unreachable, as if it had died, without touching its data; Heal
// makes it reachable again. It is this example's own, so the program can be
// copied into any module; it does no more than the story needs.
type proxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup // the accept loop and one goroutine per connection

	mu    sync.Mutex // protects cut and conns
	cut   bool
	conns map[net.Conn]struct{} // both sides of every open connection
}

func newProxy(target string) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.acceptLoop)
	return p, nil
}

// Addr is the address clients dial: the proxy's, not the node's.
func (p *proxy) Addr() string { return p.ln.Addr().String() }

// Cut resets every open connection and refuses new ones until Heal.
func (p *proxy) Cut() {
	p.mu.Lock()
	p.cut = true
	conns := p.conns
	p.conns = map[net.Conn]struct{}{}
	p.mu.Unlock()
	for c := range conns {
		reset(c)
	}
}

// Heal lets new connections through again.
func (p *proxy) Heal() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

// Close stops listening, resets every connection and waits for the proxy's
// goroutines.
func (p *proxy) Close() {
	p.ln.Close()
	p.Cut()
	p.wg.Wait()
}

func (p *proxy) acceptLoop() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.wg.Go(func() { p.serve(c) })
	}
}

func (p *proxy) serve(c net.Conn) {
	var s net.Conn
	if !p.isCut() {
		s, _ = net.DialTimeout("tcp", p.target, 5*time.Second)
	}
	if s == nil || !p.track(c, s) {
		// Reset once the client has sent its first command (or after a
		// second), not at once: a reset that races the client's connect
		// becomes a dial error, and go-redis's pool backs off for up to a
		// second after a burst of dial errors, even once the node is back.
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		_, _ = c.Read(make([]byte, 1))
		reset(c)
		if s != nil {
			s.Close()
		}
		return
	}
	done := make(chan struct{}, 2)
	go pipe(s, c, done)
	go pipe(c, s, done)
	<-done // one side ended: end both, and wait for the other pipe
	c.Close()
	s.Close()
	<-done
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, s)
	p.mu.Unlock()
}

func (p *proxy) isCut() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cut
}

// track registers both sides of a connection, unless a Cut came first.
func (p *proxy) track(c, s net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return false
	}
	p.conns[c] = struct{}{}
	p.conns[s] = struct{}{}
	return true
}

func pipe(dst, src net.Conn, done chan<- struct{}) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	done <- struct{}{}
}

// reset closes c with a TCP RST, so the client sees an error at once.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
}
