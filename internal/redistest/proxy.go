package redistest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// proxyDialTimeout bounds the proxy's dial to its target. The target is
	// a local redis-server whose kernel completes the handshake even while
	// it is paused, so only an overloaded machine gets near this; Close
	// aborts a dial in flight anyway.
	proxyDialTimeout = 5 * time.Second

	// proxyQueueLen is how many chunks one direction may have in flight. A
	// full queue blocks the reader, so a slow writer pushes back on the sender
	// instead of buffering without bound.
	proxyQueueLen = 64

	// proxyBufSize is the read size per chunk.
	proxyBufSize = 32 << 10

	// refuseWait is how long a refused connection may stay open waiting for
	// the client's first bytes; see refuse.
	refuseWait = time.Second
)

// Proxy is a TCP proxy on 127.0.0.1 in front of one target address, used to
// inject network faults: added latency ([Proxy.SetLatency]) and cut links
// ([Proxy.Cut], [Proxy.Heal]).
//
// All methods are safe for concurrent use. Close stops every goroutine the
// Proxy started and waits for them.
type Proxy struct {
	ln      net.Listener
	logf    func(format string, args ...any)
	ctx     context.Context // cancelled by Close, so that dials in flight give up
	cancel  context.CancelFunc
	latency atomic.Int64 // time.Duration added to each direction
	wg      sync.WaitGroup

	mu      sync.Mutex // protects the fields below
	target  string
	cut     bool // set by Cut, cleared by Heal
	down    bool // set while the Cluster has killed the target; see setDown
	closed  bool
	links   map[*link]struct{}
	refused map[net.Conn]struct{} // being refused; Close resets them
}

// NewProxy starts a proxy that listens on 127.0.0.1 on a free port and
// forwards every connection to target. It returns an error only when it cannot
// listen; if target is down, each accepted connection is reset instead.
func NewProxy(target string) (*Proxy, error) {
	return newProxy(target, func(string, ...any) {})
}

func newProxy(target string, logf func(string, ...any)) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("redistest: proxy listen: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{
		ln:      ln,
		logf:    logf,
		ctx:     ctx,
		cancel:  cancel,
		target:  target,
		links:   make(map[*link]struct{}),
		refused: make(map[net.Conn]struct{}),
	}
	p.wg.Go(p.acceptLoop)
	return p, nil
}

// Addr returns the address the proxy listens on, in host:port form.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetLatency adds d to each direction of every connection, existing and new:
// a request/response round trip takes at least 2*d longer. It applies to data
// read after the call; data already queued keeps the delay it was read with.
// Bandwidth is not modelled: each chunk is delayed by d, independently.
// A d <= 0 removes the delay. The default is 0.
func (p *Proxy) SetLatency(d time.Duration) {
	p.latency.Store(int64(max(d, 0)))
}

// Cut resets every current connection, and each new one as soon as the
// client sends on it, until Heal. Clients see "connection reset by peer" (or
// EOF): the network between them and the target is gone.
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.cut = true
	p.mu.Unlock()
	p.resetAll()
}

// Heal ends a Cut: new connections are forwarded again. Connections reset by
// the Cut stay closed; clients have to reconnect.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

// Close stops listening, closes every connection, and waits for all of the
// proxy's goroutines to return. Calling Close again returns nil.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()

	p.cancel()
	err := p.ln.Close()
	p.resetAll()
	p.mu.Lock()
	for c := range p.refused {
		reset(c)
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

// setDown makes the proxy behave as if nothing listened at the target: it
// resets current connections and each new one. The Cluster sets it while a
// server is killed, so that Addr(i) fails even if another program (say, a
// parallel test's server) binds the dead server's port meanwhile.
func (p *Proxy) setDown(down bool) {
	p.mu.Lock()
	p.down = down
	p.mu.Unlock()
	if down {
		p.resetAll()
	}
}

// setTarget changes where new connections go; existing ones are untouched.
func (p *Proxy) setTarget(target string) {
	p.mu.Lock()
	p.target = target
	p.mu.Unlock()
}

func (p *Proxy) resetAll() {
	p.mu.Lock()
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	// Stop outside mu: stop only closes sockets, but there is no reason to
	// make serve goroutines wait on mu meanwhile.
	for _, l := range links {
		l.stop(true)
	}
}

func (p *Proxy) acceptLoop() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Likely EMFILE or ECONNABORTED: back off a little instead of
			// spinning, as net/http's Server does.
			p.logf("redistest: proxy %s: accept: %v", p.Addr(), err)
			select {
			case <-time.After(10 * time.Millisecond):
			case <-p.ctx.Done():
				return
			}
			continue
		}
		// Dial in the connection's own goroutine, so that one slow dial
		// does not hold up the accept loop.
		p.wg.Go(func() { p.serve(c) })
	}
}

func (p *Proxy) serve(c net.Conn) {
	p.mu.Lock()
	refuse, target := p.cut || p.down || p.closed, p.target
	p.mu.Unlock()
	if refuse {
		p.refuse(c)
		return
	}

	d := net.Dialer{Timeout: proxyDialTimeout}
	s, err := d.DialContext(p.ctx, "tcp", target)
	if err != nil {
		if p.ctx.Err() == nil {
			p.logf("redistest: proxy %s: %v", p.Addr(), err)
		}
		p.refuse(c)
		return
	}

	l := &link{client: c, server: s, done: make(chan struct{})}
	p.mu.Lock()
	// Cut, setDown or Close may have run while we were dialing; they could
	// not reset a link that was not registered yet, so check again.
	refuse = p.cut || p.down || p.closed
	if !refuse {
		p.links[l] = struct{}{}
	}
	p.mu.Unlock()
	if refuse {
		l.stop(true)
		return
	}

	var wg sync.WaitGroup
	wg.Go(func() { p.pump(l, c, s) })
	wg.Go(func() { p.pump(l, s, c) })
	wg.Wait()
	l.stop(false)

	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

// refuse resets c once the client has sent something, or after refuseWait.
// Resetting at once would race the client's connect(2): a reset that lands
// first becomes a dial error, and a go-redis pool that has seen PoolSize dial
// errors fails every dial for up to a second after the fault has ended (its
// tryDial loop). A reset in answer to the first command is unambiguous.
// It is a reset, not a close, so the client sees an error, not a clean EOF.
func (p *Proxy) refuse(c net.Conn) {
	p.mu.Lock()
	closed := p.closed
	if !closed {
		p.refused[c] = struct{}{}
	}
	p.mu.Unlock()
	if !closed {
		_ = c.SetReadDeadline(time.Now().Add(refuseWait))
		_, _ = c.Read(make([]byte, 1))
		p.mu.Lock()
		delete(p.refused, c)
		p.mu.Unlock()
	}
	reset(c)
}

// chunk is data read from one side, to be written to the other side no
// earlier than at.
type chunk struct {
	data []byte
	at   time.Time
}

// pump copies src to dst, delaying each chunk by the latency in force when it
// was read. A reader goroutine timestamps chunks and queues them; this
// goroutine writes each one at its time, in order. So latency adds d to every
// chunk once, instead of d per chunk in series, which a sleep-then-write loop
// would do as soon as more than one chunk is in flight.
func (p *Proxy) pump(l *link, src, dst net.Conn) {
	q := make(chan chunk, proxyQueueLen)
	var wg sync.WaitGroup
	defer wg.Wait()
	var eof atomic.Bool // set when src ended cleanly rather than by error
	wg.Go(func() {
		defer close(q)
		buf := make([]byte, proxyBufSize)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				ch := chunk{
					data: append([]byte(nil), buf[:n]...),
					at:   time.Now().Add(time.Duration(p.latency.Load())),
				}
				select {
				case q <- ch:
				case <-l.done:
					return
				}
			}
			if err != nil {
				if errors.Is(err, io.EOF) {
					eof.Store(true)
				}
				return
			}
		}
	})

	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for ch := range q {
		if wait := time.Until(ch.at); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-l.done:
				return
			}
		}
		if _, err := dst.Write(ch.data); err != nil {
			l.stop(true)
			return
		}
	}
	if !eof.Load() {
		// src failed (reset, or closed by stop): pass the failure on.
		l.stop(true)
		return
	}
	// src half-closed after everything it sent was delivered: half-close
	// dst too, so the other direction can still finish its replies.
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}

// link is one proxied connection: the accepted client side and the dialed
// server side.
type link struct {
	client, server net.Conn
	done           chan struct{} // closed by stop; unblocks the pumps
	once           sync.Once
}

// stop closes both sides; the first call wins. With rst, both peers get a TCP
// reset instead of a FIN, which is what Cut promises.
func (l *link) stop(rst bool) {
	l.once.Do(func() {
		close(l.done)
		if rst {
			setNoLinger(l.client)
			setNoLinger(l.server)
		}
		l.client.Close()
		l.server.Close()
	})
}

// reset closes c with a TCP RST.
func reset(c net.Conn) {
	setNoLinger(c)
	c.Close()
}

// setNoLinger makes the next Close send RST: SO_LINGER with a zero timeout
// discards unsent data and resets the connection.
func setNoLinger(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
}
