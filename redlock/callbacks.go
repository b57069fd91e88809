package redlock

import (
	"reflect"
	"runtime"
	"sync"
	"time"
)

// callbacks runs what a loss calls out to — the Lost hook and OnLost — on
// goroutines the Client owns, one per lost lock, after the loss has been
// signalled (DESIGN step 7): a slow hook delays neither its own lock's
// signal nor any other lock's, and the renewal loop never waits for user
// code. Close waits for them (wait), except those that are themselves in
// Close: a Close called from OnLost must not wait for its own caller.
type callbacks struct {
	mu      sync.Mutex // protects the fields below
	changed sync.Cond  // signalled when running or inClose changes; L is &mu
	running int        // goroutines started and not returned
	inClose int        // of them, those calling Close now
	done    bool       // Close has waited: start runs nothing more on a goroutine
}

// start runs fn on a goroutine of its own and returns true, or returns
// false once Close has waited for the callbacks (fn is then the caller's
// to run).
func (cb *callbacks) start(fn func()) bool {
	cb.mu.Lock()
	defer cb.mu.Unlock()
	if cb.done {
		return false
	}
	cb.running++
	go runCallback(cb, fn)
	return true
}

// runCallback is the function every callback goroutine starts in:
// onCallback looks for it on the stack. It does not recover a panic of fn
// (see STYLE: a callback that panics ends the process, as anywhere else).
//
//go:noinline
func runCallback(cb *callbacks, fn func()) {
	defer func() {
		cb.mu.Lock()
		cb.running--
		cb.mu.Unlock()
		cb.changed.Broadcast()
	}()
	fn()
}

// runCallbackName is runCallback's name as runtime frames report it.
var runCallbackName = runtime.FuncForPC(reflect.ValueOf(runCallback).Pointer()).Name()

// onCallback reports whether the calling goroutine is a callback
// goroutine: Go has no goroutine identity, so it looks for runCallback on
// the stack, where it is the goroutine's first function. Close alone calls
// it (once): its cost, a walk of the stack, does not matter there.
func onCallback() bool {
	pcs := make([]uintptr, 64)
	for skip := 2; ; skip += len(pcs) {
		n := runtime.Callers(skip, pcs)
		frames := runtime.CallersFrames(pcs[:n])
		for {
			f, more := frames.Next()
			if f.Function == runCallbackName {
				return true
			}
			if !more {
				break
			}
		}
		if n < len(pcs) {
			return false
		}
	}
}

// enterClose and leaveClose bracket a Close called from a callback.
func (cb *callbacks) enterClose() {
	cb.mu.Lock()
	cb.inClose++
	cb.mu.Unlock()
	cb.changed.Broadcast()
}

func (cb *callbacks) leaveClose() {
	cb.mu.Lock()
	cb.inClose--
	cb.mu.Unlock()
}

// wait returns once every callback has returned or is calling Close, and
// starts no callback goroutine after that. It has no bound: a callback runs
// user code, and Close waits for it however long it takes.
func (cb *callbacks) wait() {
	cb.mu.Lock()
	defer cb.mu.Unlock()
	if cb.changed.L == nil {
		cb.changed.L = &cb.mu
	}
	for cb.running > cb.inClose {
		cb.changed.Wait()
	}
	cb.done = true
}

// lossCallbacks runs l's Lost hook, then (unless the Client is closed)
// OnLost, on a callback goroutine; lostDone is closed between the two, so
// that a release (which waits for it to report Release after Lost) may be
// called from OnLost.
func (c *Client) lossCallbacks(l *Lock, err error, heldFor time.Duration) {
	obs, fn := l.cfg.obs, l.cfg.onLost
	c.mu.Lock()
	if c.closed {
		fn = nil // Close ends the locks; OnLost is not called after it
	}
	c.mu.Unlock()
	if obs == nil && fn == nil {
		close(l.lostDone)
		return
	}
	run := func() {
		if obs != nil {
			obs.Lost(l.ctx, LostInfo{Lock: l.id, Resource: l.resource, HeldFor: heldFor, Err: err})
		}
		close(l.lostDone)
		if fn != nil {
			fn(l, err)
		}
	}
	if !c.cbs.start(run) {
		run() // after Close: no renewal loop is left to delay
	}
}
