package sim

import (
	"bytes"
	"context"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/quorumlock/quorumlock/internal/scripts"
)

// network is the fault layer: every connection a node client opens is a
// pair of net.Pipes with two forwarding goroutines between them, one per
// direction, and every chunk of bytes waits in a forwarder for the delays
// and gates the fault plan sets. Nothing in it touches a socket or a
// syscall, so a bubble's goroutines block durably on it and its fake clock
// advances.
type network struct {
	mu     sync.Mutex // protects everything below
	rng    *rand.Rand // per-chunk jitter; seeded, but the order of draws follows scheduling
	base   time.Duration
	down   []bool                   // per node: dials refused, conns reset (killed)
	nodeGt []chan struct{}          // per node: open while paused (closed and nil when running)
	clGt   []chan struct{}          // per client: open while its pipes are frozen
	linkGt map[linkID]chan struct{} // per link: open while it is cut (a partition: bytes wait, as TCP retransmits)
	slow   []time.Duration          // per node: added to every chunk both ways
	delay  [][]time.Duration        // [client][node]: added to every chunk both ways
	conns  map[linkID]map[*conn]struct{}
	// tokens: per lock token seen going up (a v4 UUID in a request), its
	// client and when a request carrying it was last delivered to each
	// node (the key-back check of tokens given up, lock.go sampler).
	tokens map[string]*tokenSeen
	// aimed: per link, the delay added to a chunk that carries a fence
	// commit (phase 2 of a fenced acquire): a fault aimed at one phase.
	aimed map[linkID]time.Duration
	// drop: per link, a chunk that carries a fence commit is lost
	// (CommitDrop): the commit never lands and is never answered.
	drop map[linkID]bool
	// reply: [client][node], added to every chunk coming down (replies
	// only): the long hold's slow renewal (LongHold.SlowReply).
	reply  [][]time.Duration
	yields yieldGate // the fault aimed at yields (aimed.go)
	// yieldAt: per link, when a yield (a release carrying a ticket) was
	// last delivered to the node (the yield episode, aimed.go).
	yieldAt map[linkID]time.Time
	// ids: per client, its redlock Client's ID, read from the name of
	// the identity key its node check writes (residue.go close-left).
	ids map[int]string
	// timeDelay: every clock probe (TIME) is slowed this much, up
	// (timeUp) or down; msgDelay: per client, the messages its
	// subscriptions receive are slowed (aimed42.go).
	timeDelay  time.Duration
	timeUp     bool
	timeVaries bool // each probe's delay drawn up to timeDelay
	// probes is, per link, the last two clock probes slowed on their way
	// up (slowExtend reads the estimate's age and bias from them).
	probes map[linkID][2]probeRec
	// probeFor: per client, the delay up of each of its clock probes,
	// in place of the plan's (the guard episode's own Client, guard.go);
	// aims: per link, an extension to hold until just before its
	// not-after bound (guard.go).
	probeFor map[int]time.Duration
	aims     map[linkID]*boundAim
	msgDelay map[int]time.Duration
	rearm    *rearmTrigger // a Resume's re-arm awaited (resumePause)
	healDrop *rearmTrigger // the control heal-dropped's target (evictKey)
	closed   bool
	serve    func(node int) (net.Conn, error) // the node's server end (miniredis Dial)
}

type linkID struct{ client, node int }

func newNetwork(seed uint64, clients, nodes int, serve func(int) (net.Conn, error)) *network {
	n := &network{
		rng:     rand.New(rand.NewPCG(seed, 0x5eed)),
		base:    200 * time.Microsecond,
		down:    make([]bool, nodes),
		nodeGt:  make([]chan struct{}, nodes),
		clGt:    make([]chan struct{}, clients),
		linkGt:  make(map[linkID]chan struct{}),
		slow:    make([]time.Duration, nodes),
		delay:   make([][]time.Duration, clients),
		conns:   make(map[linkID]map[*conn]struct{}),
		tokens:  make(map[string]*tokenSeen),
		yieldAt: make(map[linkID]time.Time),
		aimed:   make(map[linkID]time.Duration),
		drop:    make(map[linkID]bool),
		reply:   make([][]time.Duration, clients),
		ids:     make(map[int]string),
		serve:   serve,
	}
	for c := range clients {
		n.delay[c] = make([]time.Duration, nodes)
		n.reply[c] = make([]time.Duration, nodes)
	}
	return n
}

// errRefused is what a dial to a killed node returns.
var errRefused = &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}

// dial opens a connection from client c to node i through the fault layer.
func (n *network) dial(ctx context.Context, c, i int) (net.Conn, error) {
	n.mu.Lock()
	if n.closed || n.down[i] {
		n.mu.Unlock()
		return nil, errRefused
	}
	n.mu.Unlock()
	srv, err := n.serve(i)
	if err != nil {
		return nil, errRefused
	}
	cli, mid := net.Pipe()
	k := &conn{n: n, id: linkID{c, i}, ends: [3]net.Conn{cli, mid, srv}, done: make(chan struct{})}
	n.mu.Lock()
	if n.closed || n.down[i] {
		n.mu.Unlock()
		k.close()
		return nil, errRefused
	}
	m := n.conns[k.id]
	if m == nil {
		m = make(map[*conn]struct{})
		n.conns[k.id] = m
	}
	m[k] = struct{}{}
	n.mu.Unlock()
	go k.forward(mid, srv, true)
	go k.forward(srv, mid, false)
	return cli, nil
}

// conn is one connection: the client's end, our end of its pipe, and the
// server's end. done is closed by close: a reset, a kill or the network's
// close, which lose the bytes in flight.
type conn struct {
	n    *network
	id   linkID
	ends [3]net.Conn
	once sync.Once
	done chan struct{}
	// Under n.mu: when bytes last went each way, and whether the
	// connection subscribed (it then receives messages nobody asked for).
	up, down time.Time
	sub      bool
	// timeReplies: clock probes sent whose replies are owed a delay
	// (aimed42.go timeDownDelay).
	timeReplies int
	tail        []byte // the end of the last chunk delivered up: a token may straddle two chunks
}

// tokenSeen is what the network saw of one lock token.
type tokenSeen struct {
	client int
	last   []time.Time // per node: a request carrying it last delivered
}

// findTokens returns the v4 UUIDs in b (lower-case hex, as
// github.com/google/uuid writes them). A scan of our own: a regexp was
// 7% of a seed's CPU.
func findTokens(b []byte) [][]byte {
	var out [][]byte
	for i := 0; i+36 <= len(b); i++ {
		if b[i+8] != '-' || b[i+13] != '-' || b[i+14] != '4' || b[i+18] != '-' || b[i+23] != '-' {
			continue
		}
		ok := true
		for j := i; j < i+36 && ok; j++ {
			switch j - i {
			case 8, 13, 18, 23:
			default:
				c := b[j]
				ok = '0' <= c && c <= '9' || 'a' <= c && c <= 'f'
			}
		}
		if ok {
			out = append(out, b[i:i+36])
			i += 35
		}
	}
	return out
}

// tokensRewritten is the ownership control (controls_test.go): the fault
// layer delivers every request with the lock tokens in it changed (one
// hex digit, the same way each time), and notes the tokens as the Client
// sent them: the nodes then hold tokens that no request of a Client
// carried.
var tokensRewritten atomic.Bool

// rewriteTokens returns a copy of b with the first hex digit of every
// lock token changed.
func rewriteTokens(b []byte) []byte {
	out := bytes.Clone(b)
	for _, t := range findTokens(out) {
		if t[0] == 'f' {
			t[0] = 'e'
		} else {
			t[0] = 'f'
		}
	}
	return out
}

// termHead is how an election's identity names its term in the JSON a
// Campaign writes (election.Leader).
var termHead = []byte(`"term":"`)

// findTerms returns the election term IDs (24 hex digits) that b's
// identities name: the residue check counts them as tokens.
func findTerms(b []byte) [][]byte {
	var out [][]byte
	for {
		i := bytes.Index(b, termHead)
		if i < 0 {
			return out
		}
		b = b[i+len(termHead):]
		if len(b) >= 24 {
			out = append(out, b[:24])
		}
	}
}

// noteTokens records the tokens in chunk b, delivered up to the node (at
// now, or at its sending for a yield held by the yield gate).
func (k *conn) noteTokens(b []byte, nodes int, now time.Time) {
	buf := b
	if len(k.tail) > 0 {
		buf = append(k.tail, b...)
	}
	found := append(findTokens(buf), findTerms(buf)...)
	k.tail = append(k.tail[:0], buf[max(0, len(buf)-35):]...)
	if len(found) == 0 {
		return
	}
	k.n.mu.Lock()
	defer k.n.mu.Unlock()
	for _, t := range found {
		ts := k.n.tokens[string(t)]
		if ts == nil {
			ts = &tokenSeen{client: k.id.client, last: make([]time.Time, nodes)}
			k.n.tokens[string(t)] = ts
		}
		ts.last[k.id.node] = now
	}
}

// client returns the client that sent a request carrying tok; false if
// none was seen.
func (n *network) client(tok string) (int, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	ts := n.tokens[tok]
	if ts == nil {
		return 0, false
	}
	return ts.client, true
}

// clientID returns client c's redlock Client ID ("" until its first
// node check was seen).
func (n *network) clientID(c int) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.ids[c]
}

// idKeyHead is the start of a Client's identity key (internal/node
// idKeys): the Client's ID follows, then ":" and the node.
var idKeyHead = []byte("lock:node:")

// noteID records client c's ID from a chunk that names its identity key.
func (n *network) noteID(c int, b []byte) {
	i := bytes.Index(b, idKeyHead)
	if i < 0 {
		return
	}
	rest := b[i+len(idKeyHead):]
	j := bytes.IndexByte(rest, ':')
	if j <= 0 {
		return
	}
	n.mu.Lock()
	if n.ids[c] == "" {
		n.ids[c] = string(rest[:j])
	}
	n.mu.Unlock()
}

// lastYield is when a yield of client c was last delivered to node i
// (zero: never).
func (n *network) lastYield(c, i int) time.Time {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.yieldAt[linkID{c, i}]
}

// lastDelivered is when a request carrying tok was last delivered to
// node i, and its client; ok false if none ever was.
func (n *network) lastDelivered(tok string, i int) (time.Time, int, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	ts := n.tokens[tok]
	if ts == nil || ts.last[i].IsZero() {
		return time.Time{}, 0, false
	}
	return ts.last[i], ts.client, true
}

func (k *conn) close() {
	k.once.Do(func() {
		close(k.done)
		for _, e := range k.ends {
			_ = e.Close()
		}
		k.n.mu.Lock()
		delete(k.n.conns[k.id], k)
		k.n.mu.Unlock()
	})
}

// forward copies src to dst, chunk by chunk, each held until its delivery
// time and while a gate on its way is closed; up is the client to server
// direction. A chunk read is accepted (the sender's write returns, as into
// a socket buffer) and waits here, and no chunk overtakes the one before
// it, as on a TCP stream. go-redis writes a request (or a pipeline) at
// once and then reads, so a request held here is one that was sent and
// will land late.
//
// Up, the next chunk (a write of up to upChunk bytes) is read only once
// the one before was delivered.
// Down, the server's writes are always accepted (queued, see queueDown):
// miniredis writes a published message to its subscribers under its
// server-wide lock, so a write that waited for a frozen client would stop
// the whole node (a dial, every other connection's command) for as long,
// where redis-server only grows that client's output buffer.
//
// As on TCP, a client that gives up and closes its connection does not
// take back what it sent: the requests already read are still delivered
// (late, or when a paused node resumes) and run, and only then does the
// server see the connection end; its replies are read and dropped. Only
// a reset, a killed node or the network's close (k.close) loses bytes in
// flight.
func (k *conn) forward(src, dst net.Conn, up bool) {
	next := k.readUp(src)
	var readAt time.Time // down: when the chunk next returned was read from the server
	if !up {
		next = k.queueDown(src, &readAt)
	}
	gone := false // down: the client closed its end; replies are dropped
	for {
		b, ok := next()
		if !ok {
			if up {
				// The client closed: everything it sent was delivered;
				// now the server sees the end.
				_ = dst.Close()
				return
			}
			k.close() // the server closed (or was killed): the connection is over
			return
		}
		if gone {
			continue
		}
		if up {
			if k.n.dropsCommit(k.id, b) || dropsControl(b) || k.n.dropsHeal(k.id, b) {
				// Lost on the way, the connection left open: the
				// client waits for the reply until its node timeout (a
				// reset would fail the commit at once, and the round
				// would be decided before the minority's commits
				// answered).
				continue
			}
			k.noteUp(b)
			k.n.noteRearm(k.id, b)
		}
		d := k.n.chunkDelay(k.id)
		sent, held := time.Now(), time.Duration(0)
		if up {
			held = k.n.yields.delay(b)
			d += k.n.aimedDelay(k.id, b) + held + k.timeUpDelay(b) + k.n.boundAimDelay(k.id, b)
		} else {
			d += k.timeDownDelay() + k.msgDelayOf()
		}
		if rd := k.n.replyDelay(k.id); !up && rd > 0 {
			// Counted from the chunk's reading, so that a stream of
			// replies is late by rd, not by rd per chunk before it.
			d = max(d, rd-time.Since(readAt))
		}
		if d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-k.done:
				t.Stop()
				return
			}
		}
		if !k.n.waitGates(k.id, k.done) {
			return
		}
		out := b
		if up && tokensRewritten.Load() {
			out = rewriteTokens(b)
		}
		if _, werr := dst.Write(out); werr != nil {
			if up {
				k.close()
				return
			}
			gone = true
			continue
		}
		if up {
			// A yield held past its bound counts from its sending: the
			// library must refuse it (see yieldGate).
			at := time.Now()
			if held > 0 {
				at = sent
			}
			k.noteTokens(b, len(k.n.down), at)
			k.n.noteID(k.id.client, b)
			if bytes.Contains(b, releaseSHA) && carriesYield(b) {
				k.n.mu.Lock()
				k.n.yieldAt[k.id] = time.Now()
				k.n.mu.Unlock()
			}
		}
		k.n.mu.Lock()
		if up {
			k.up = time.Now()
		} else {
			k.down = time.Now()
		}
		k.n.mu.Unlock()
	}
}

// upChunk is the most a client's write the up-forwarder accepts at once:
// go-redis writes a request or a pipeline in writes of at most its
// pipeline buffer (DefaultPipelineBufferSize, 128 KiB), and a write is
// accepted whole, as into a socket's send buffer. With 4 KB (until seed
// 2702, docs/simulation.md) a larger request (the rw scripts' EVAL, 7.6
// KB) was accepted a chunk per one-way delay: a client whose node timeout
// ended mid-write lost the rest, and the node got a truncated command,
// where TCP delivers the whole request late.
const upChunk = 128 << 10

// readUp returns the chunks of src as they are read, one at a time; false
// at its end.
func (k *conn) readUp(src net.Conn) func() ([]byte, bool) {
	buf := make([]byte, upChunk)
	var err error
	return func() ([]byte, bool) {
		for err == nil {
			var m int
			m, err = src.Read(buf)
			if m > 0 {
				return buf[:m], true
			}
		}
		return nil, false
	}
}

// downLimit is how many bytes may wait for a client that does not read
// before its connection is closed, as redis-server's
// client-output-buffer-limit does (32 MB for pub/sub by default; the
// simulated replies are small).
const downLimit = 1 << 20

// queueDown reads src on a goroutine of its own into an unbounded queue
// (closing the connection past downLimit) and returns its chunks in order;
// false once src ended and everything read was returned, or the connection
// closed.
func (k *conn) queueDown(src net.Conn, readAt *time.Time) func() ([]byte, bool) {
	var (
		mu     sync.Mutex
		q      [][]byte
		at     []time.Time // when each chunk of q was read
		queued int
		ended  bool
	)
	ready := make(chan struct{}, 1)
	signal := func() {
		select {
		case ready <- struct{}{}:
		default:
		}
	}
	go func() {
		for {
			buf := make([]byte, 4096)
			m, err := src.Read(buf)
			mu.Lock()
			if m > 0 {
				q = append(q, buf[:m])
				at = append(at, time.Now())
				queued += m
			}
			over := queued > downLimit
			if err != nil {
				ended = true
			}
			mu.Unlock()
			signal()
			if over {
				k.close()
			}
			if err != nil || over {
				return
			}
		}
	}()
	return func() ([]byte, bool) {
		for {
			mu.Lock()
			if len(q) > 0 {
				b := q[0]
				q = q[1:]
				*readAt, at = at[0], at[1:]
				queued -= len(b)
				mu.Unlock()
				return b, true
			}
			end := ended
			mu.Unlock()
			if end {
				return nil, false
			}
			select {
			case <-ready:
			case <-k.done:
				return nil, false
			}
		}
	}
}

// noteUp marks a connection that subscribes: it then receives messages
// nobody asked for, which idle must not count as replies.
func (k *conn) noteUp(b []byte) {
	if !bytes.Contains(b, []byte("ubscribe")) { // go-redis sends "subscribe", "psubscribe", "ssubscribe"
		return
	}
	k.n.mu.Lock()
	k.sub = true
	k.n.mu.Unlock()
}

// chunkDelay is the one-way latency of a chunk on link id now: the base
// latency with jitter, plus the node's slowness and the link's delay.
func (n *network) chunkDelay(id linkID) time.Duration {
	n.mu.Lock()
	defer n.mu.Unlock()
	d := n.base + time.Duration(n.rng.Int64N(int64(n.base)))
	return d + n.slow[id.node] + n.delay[id.client][id.node]
}

// maxDelay is the longest one-way latency of any link now: the base
// latency's most, plus its node's slowness and its own delay.
func (n *network) maxDelay() time.Duration {
	n.mu.Lock()
	defer n.mu.Unlock()
	var d time.Duration
	for c := range n.delay {
		for i := range n.delay[c] {
			d = max(d, n.slow[i]+n.delay[c][i])
		}
	}
	return 2*n.base + d
}

// waitGates waits while the node is paused or the client frozen; false
// when the connection closed meanwhile.
func (n *network) waitGates(id linkID, done chan struct{}) bool {
	for {
		n.mu.Lock()
		g := n.nodeGt[id.node]
		if g == nil {
			g = n.clGt[id.client]
		}
		if g == nil {
			g = n.linkGt[id]
		}
		n.mu.Unlock()
		if g == nil {
			return true
		}
		select {
		case <-g:
		case <-done:
			return false
		}
	}
}

// reset closes the connections of the links that match (client or node -1:
// any).
func (n *network) reset(client, node int) {
	n.mu.Lock()
	var ks []*conn
	for id, m := range n.conns {
		if (client < 0 || id.client == client) && (node < 0 || id.node == node) {
			for k := range m {
				ks = append(ks, k)
			}
		}
	}
	n.mu.Unlock()
	for _, k := range ks {
		k.close()
	}
}

func (n *network) setDown(node int, down bool) {
	n.mu.Lock()
	n.down[node] = down
	n.mu.Unlock()
	if down {
		n.reset(-1, node)
	}
}

func gate(g *chan struct{}, closed bool) {
	switch {
	case closed && *g == nil:
		*g = make(chan struct{})
	case !closed && *g != nil:
		close(*g)
		*g = nil
	}
}

func (n *network) pauseNode(node int, paused bool) {
	n.mu.Lock()
	gate(&n.nodeGt[node], paused)
	n.mu.Unlock()
}

func (n *network) freezeClient(client int, frozen bool) {
	n.mu.Lock()
	gate(&n.clGt[client], frozen)
	n.mu.Unlock()
}

var commitSHA = []byte(scripts.CommitHash())

// aimedDelay is the delay a fault aimed at the fence commit adds to chunk
// b on link id: the link's aimed delay if b carries a commit, else 0.
func (n *network) aimedDelay(id linkID, b []byte) time.Duration {
	n.mu.Lock()
	d := n.aimed[id]
	n.mu.Unlock()
	if d == 0 || !bytes.Contains(b, commitSHA) {
		return 0
	}
	return d
}

// aimCommit sets (d > 0) or clears the delay of client's fence commits
// to node.
func (n *network) aimCommit(client, node int, d time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if d == 0 {
		delete(n.aimed, linkID{client, node})
		return
	}
	n.aimed[linkID{client, node}] = d
}

// dropsCommit reports whether chunk b on link id carries a fence commit
// that the link's CommitDrop fault loses.
func (n *network) dropsCommit(id linkID, b []byte) bool {
	n.mu.Lock()
	drop := n.drop[id]
	n.mu.Unlock()
	return drop && bytes.Contains(b, commitSHA)
}

// dropCommit sets or clears the loss of client's fence commits to node.
func (n *network) dropCommit(client, node int, drop bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !drop {
		delete(n.drop, linkID{client, node})
		return
	}
	n.drop[linkID{client, node}] = true
}

// replyDelay is the delay added to a chunk coming down link id.
func (n *network) replyDelay(id linkID) time.Duration {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.reply[id.client][id.node]
}

// setReplyDelay sets the delay added to the replies client gets from node.
func (n *network) setReplyDelay(client, node int, d time.Duration) {
	n.mu.Lock()
	n.reply[client][node] = d
	n.mu.Unlock()
}

// cutLink closes (or opens) the gate of client's link to node: its
// bytes wait both ways, and are delivered when it opens.
func (n *network) cutLink(client, node int, cut bool) {
	n.mu.Lock()
	g := n.linkGt[linkID{client, node}]
	gate(&g, cut)
	if g == nil {
		delete(n.linkGt, linkID{client, node})
	} else {
		n.linkGt[linkID{client, node}] = g
	}
	n.mu.Unlock()
}

func (n *network) setSlow(node int, d time.Duration) {
	n.mu.Lock()
	n.slow[node] = d
	n.mu.Unlock()
}

func (n *network) setDelay(client, node int, d time.Duration) {
	n.mu.Lock()
	n.delay[client][node] = d
	n.mu.Unlock()
}

// idle reports whether no request of client can still change anything
// on a node or bring it a reply: on every connection of the client, the
// last bytes up were delivered at least quiet ago (longer than any delay
// then: they have run on the node), and, but on a subscriber connection,
// bytes came down after them (the reply).
func (n *network) idle(client int, quiet time.Duration) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	now := time.Now()
	for id, m := range n.conns {
		if id.client != client {
			continue
		}
		for k := range m {
			if k.up.IsZero() {
				continue
			}
			if now.Sub(k.up) < quiet || (!k.sub && !k.down.After(k.up)) {
				return false
			}
		}
	}
	return true
}

// close refuses new dials and closes every connection, and opens every
// gate.
func (n *network) close() {
	n.mu.Lock()
	n.closed = true
	for i := range n.nodeGt {
		gate(&n.nodeGt[i], false)
	}
	for i := range n.clGt {
		gate(&n.clGt[i], false)
	}
	for id, g := range n.linkGt {
		gate(&g, false)
		delete(n.linkGt, id)
	}
	n.mu.Unlock()
	n.reset(-1, -1)
}
