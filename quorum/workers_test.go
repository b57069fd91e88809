package quorum

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

func TestWorkers_reuse(t *testing.T) {
	var w Workers
	defer w.Close()
	var n atomic.Int32
	for range 100 {
		w.Go(func() { n.Add(1) })
		w.Wait()
	}
	if got := n.Load(); got != 100 {
		t.Errorf("ran %d functions; want 100", got)
	}
	w.mu.Lock()
	idle := len(w.idle)
	w.mu.Unlock()
	// One at a time: one worker served them all.
	if idle != 1 {
		t.Errorf("%d idle workers after sequential functions; want 1", idle)
	}
}

// A function that blocks holds its worker only: the next one starts at
// once on another, so a hung node delays nobody else.
func TestWorkers_neverWaitsForABusyWorker(t *testing.T) {
	var w Workers
	defer w.Close()
	block := make(chan struct{})
	w.Go(func() { <-block })
	done := make(chan struct{})
	w.Go(func() { close(done) })
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a function waited for a busy worker")
	}
	close(block)
	w.Wait()
}

func TestWorkers_waitCountsAdd(t *testing.T) {
	var w Workers
	defer w.Close()
	w.Add(1)
	released := make(chan struct{})
	go func() {
		w.Wait()
		close(released)
	}()
	select {
	case <-released:
		t.Fatal("Wait returned while the count was 1")
	case <-time.After(20 * time.Millisecond):
	}
	w.Done()
	<-released
}

// After Close, idle workers have exited (goleak checks the package) and Go
// still runs functions, on goroutines of their own.
func TestWorkers_close(t *testing.T) {
	var w Workers
	var wg sync.WaitGroup
	// Added before any function runs: an Add after a function's Done had
	// brought the count to 0 raced its Wait (the race detector caught that
	// reuse once in the full suite beside stress-ng, and 1 in 300 runs of
	// the package).
	wg.Add(8)
	for range 8 {
		w.Go(func() { wg.Done(); wg.Wait() }) // eight at once: eight workers
	}
	w.Wait()
	w.Close()
	w.Close()
	w.mu.Lock()
	idle := len(w.idle)
	w.mu.Unlock()
	if idle != 0 {
		t.Errorf("%d idle workers after Close; want 0", idle)
	}
	ran := make(chan struct{})
	w.Go(func() { close(ran) })
	<-ran
	w.Wait()
}

func TestStart_onWorkers(t *testing.T) {
	var w Workers
	defer w.Close()
	for range 50 {
		r := Start(context.Background(), 5, time.Second, &w, func(ctx context.Context, i int) (int, error) {
			if _, ok := NodeTimeout(ctx); !ok {
				t.Errorf("request ctx has no node timeout")
			}
			return i, nil
		})
		got := r.Collect(context.Background(), func(i int, rep Reply[int]) (Vote, error) {
			if rep.Val != i {
				t.Errorf("node %d replied %d", i, rep.Val)
			}
			return Yes, nil
		}, All)
		if got.Yes != 5 {
			t.Errorf("yes = %d; want 5", got.Yes)
		}
		w.Wait()
	}
}

// Done may be asked for before or after the reply, from many goroutines:
// its channel is closed exactly once, when the reply is in.
func TestRound_done(t *testing.T) {
	for range 200 {
		release := make(chan struct{})
		r := Start(context.Background(), 3, time.Second, nil, func(ctx context.Context, i int) (int, error) {
			<-release
			return i, nil
		})
		var wg sync.WaitGroup
		for i := range 3 {
			wg.Go(func() {
				<-r.Done(i)
				if _, ok := r.Reply(i); !ok {
					t.Errorf("Done(%d) closed before its reply", i)
				}
			})
		}
		close(release)
		for i := range 3 {
			wg.Go(func() { <-r.Done(i) })
		}
		wg.Wait()
		r.Wait()
	}
}

// On Workers as on plain goroutines, nodes that hang hold up neither a
// round (decided at the majority) nor the next rounds: their requests keep
// their workers, and new ones start for the others.
func TestCollect_onWorkersHungNodes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var w Workers
		ms := time.Millisecond
		nodes := []node{{1 * ms, Yes, false}, {2 * ms, Yes, false}, {3 * ms, Yes, false}, {0, 0, true}, {0, 0, true}}
		for round := range 3 {
			start := time.Now()
			r := Start(t.Context(), len(nodes), 100*ms, &w, func(ctx context.Context, i int) (Vote, error) {
				nd := nodes[i]
				if nd.hang {
					time.Sleep(time.Second) // ignores ctx, well past the node timeout
					return Failed, errNode
				}
				time.Sleep(nd.delay)
				return nd.vote, nil
			})
			got := r.Collect(t.Context(), func(_ int, rep Reply[Vote]) (Vote, error) { return rep.Val, rep.Err }, Majority)
			if !got.Quorum() || got.Elapsed != 3*ms || time.Since(start) != 3*ms {
				t.Errorf("round %d: quorum %v after %v; want a quorum after 3ms", round, got.Quorum(), got.Elapsed)
			}
		}
		w.Wait()
		w.Close()
	})
}

// When the ctx given to Start ends before the one given to Collect, and a
// node ignores ctx, Collect still stops waiting for it at the node timeout.
func TestCollect_startCtxEndsFirstHungNode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ms := time.Millisecond
		sctx, cancel := context.WithCancel(t.Context())
		time.AfterFunc(5*ms, cancel)
		start := time.Now()
		r := Start(sctx, 3, 100*ms, nil, func(ctx context.Context, i int) (Vote, error) {
			if i == 0 {
				time.Sleep(10 * time.Second) // ignores ctx
				return Failed, errNode
			}
			<-ctx.Done()
			return Failed, ctx.Err()
		})
		got := r.Collect(t.Context(), func(_ int, rep Reply[Vote]) (Vote, error) { return rep.Val, rep.Err }, All)
		if took := time.Since(start); took != 100*ms || got.Failed != 3 {
			t.Errorf("Collect returned after %v with %d failed; want all 3 failed at the node timeout (100ms)", took, got.Failed)
		}
		var te *TimeoutError
		if !errors.As(got.Errs[0], &te) {
			t.Errorf("the hung node's error = %v; want a *TimeoutError", got.Errs[0])
		}
		r.Wait()
	})
}
