package quorum

import (
	"sync"
	"time"
)

// Workers runs functions on goroutines it keeps for reuse: a request to a
// node runs deep in the Redis client, and a fresh goroutine grows its stack
// there several times (copying it each time), which cost about a seventh of
// the client's CPU with a goroutine per request. A function handed to Go
// never waits for a worker: when none is idle, a new one starts, so a node
// that hangs (its requests holding their workers) delays no other request.
// A worker that finds maxIdle others idle exits, and each Go lets the
// longest-idle worker go if it has been idle for longer than idleFor (no
// timer: a Client that stops working keeps its idle workers until Close).
//
// Workers counts every function until it returns, in the sync.WaitGroup it
// embeds: its Add, Done and Wait are that WaitGroup's, over the same count,
// so one Workers can own everything an operation leaves behind (its Go is
// Workers' own). The zero value is ready to use.
type Workers struct {
	waitGroup // functions handed to Go or run, and Add's count

	mu     sync.Mutex // protects idle, closed
	idle   []*worker  // parked workers, the most recently parked last
	closed bool
}

// waitGroup is sync.WaitGroup under a name that does not export the field.
type waitGroup = sync.WaitGroup

// worker is one parked goroutine: it takes its next task from tasks; a nil
// task tells it to exit.
type worker struct {
	tasks  chan task // buffered 1
	parked time.Time
	exited chan struct{} // closed when it returns after a nil task
}

// task is what a worker runs: a function, or a round's slot (a pointer, so
// handing it over allocates nothing).
type task interface{ run() }

type funcTask func()

func (f funcTask) run() { f() }

const (
	maxIdle = 256
	idleFor = 30 * time.Second
)

// Go runs f on an idle worker, or on a new one, and counts it until it
// returns. After Close it runs f on a goroutine of its own.
func (p *Workers) Go(f func()) { p.run(funcTask(f)) }

func (p *Workers) run(t task) {
	p.waitGroup.Add(1)
	p.mu.Lock()
	n := len(p.idle)
	if n == 0 || p.closed {
		p.mu.Unlock()
		go p.work(t)
		return
	}
	w := p.idle[n-1]
	p.idle[n-1] = nil
	p.idle = p.idle[:n-1]
	// The worker parked longest is the first: let it go if it has been
	// idle for long (one per call keeps this cheap).
	var old *worker
	if len(p.idle) > 0 && time.Since(p.idle[0].parked) > idleFor {
		old = p.idle[0]
		copy(p.idle, p.idle[1:])
		p.idle[len(p.idle)-1] = nil
		p.idle = p.idle[:len(p.idle)-1]
	}
	p.mu.Unlock()
	w.tasks <- t
	if old != nil {
		old.tasks <- nil
	}
}

// work runs t, then whatever it is handed while parked, until told to exit
// or Close.
func (p *Workers) work(t task) {
	var w *worker
	for {
		t.run()
		p.mu.Lock()
		if p.closed || len(p.idle) >= maxIdle {
			p.mu.Unlock()
			p.waitGroup.Done()
			return
		}
		if w == nil {
			w = &worker{tasks: make(chan task, 1), exited: make(chan struct{})}
		}
		w.parked = time.Now()
		p.idle = append(p.idle, w)
		p.mu.Unlock()
		// Done only once parked (or on the way out, above): when Wait
		// returns, every worker is idle or gone, so a Close after Wait
		// lets every one of them go and waits for it.
		p.waitGroup.Done()
		if t = <-w.tasks; t == nil {
			close(w.exited)
			return
		}
	}
}

// Close lets the idle workers go and waits for them to exit; a worker busy
// now exits when its function returns. Functions handed to Go afterwards
// run on goroutines of their own. It is idempotent.
func (p *Workers) Close() {
	p.mu.Lock()
	p.closed = true
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, w := range idle {
		w.tasks <- nil
	}
	for _, w := range idle {
		<-w.exited
	}
}
