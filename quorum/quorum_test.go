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

// node is a fake: it answers vote after delay, or hangs until its ctx ends
// when hang is set.
type node struct {
	delay time.Duration
	vote  Vote
	hang  bool
}

var errNode = errors.New("node error")

func run(ctx context.Context, nodes []node, timeout time.Duration, wg *sync.WaitGroup, decide Decider) (*Round[Vote], Tally) {
	r := Start(ctx, len(nodes), timeout, wg, func(ctx context.Context, i int) (Vote, error) {
		nd := nodes[i]
		if nd.hang {
			// Like a Redis client that ignores the ctx on a blocked read: it
			// only gives up well after the node timeout.
			time.Sleep(10 * timeout)
			return Failed, errNode
		}
		select {
		case <-time.After(nd.delay):
		case <-ctx.Done():
			return Failed, ctx.Err()
		}
		if nd.vote == Failed {
			return Failed, errNode
		}
		return nd.vote, nil
	})
	classify := func(_ int, rep Reply[Vote]) (Vote, error) {
		if rep.Err != nil {
			return Failed, rep.Err
		}
		return rep.Val, nil
	}
	return r, r.Collect(ctx, classify, decide)
}

func TestCollect_earlyDecision(t *testing.T) {
	ms := time.Millisecond
	cases := []struct {
		name        string
		nodes       []node
		wantQuorum  bool
		wantElapsed time.Duration
		wantYes     int
		wantNo      int
		wantFailed  int
	}{
		{
			name:       "majority fast, two slow",
			nodes:      []node{{1 * ms, Yes, false}, {2 * ms, Yes, false}, {3 * ms, Yes, false}, {80 * ms, Yes, false}, {90 * ms, Yes, false}},
			wantQuorum: true, wantElapsed: 3 * ms, wantYes: 3,
		},
		{
			name:       "majority impossible after three refusals",
			nodes:      []node{{1 * ms, No, false}, {2 * ms, No, false}, {3 * ms, No, false}, {80 * ms, Yes, false}, {90 * ms, Yes, false}},
			wantQuorum: false, wantElapsed: 3 * ms, wantNo: 3,
		},
		{
			name:       "errors count against",
			nodes:      []node{{1 * ms, Failed, false}, {2 * ms, Yes, false}, {3 * ms, Failed, false}, {4 * ms, Failed, false}, {90 * ms, Yes, false}},
			wantQuorum: false, wantElapsed: 4 * ms, wantYes: 1, wantFailed: 3,
		},
		{
			name:       "even N needs three of four",
			nodes:      []node{{1 * ms, Yes, false}, {2 * ms, Yes, false}, {3 * ms, No, false}, {50 * ms, Yes, false}},
			wantQuorum: true, wantElapsed: 50 * ms, wantYes: 3, wantNo: 1,
		},
		{
			name:       "even N two of four is no quorum",
			nodes:      []node{{1 * ms, Yes, false}, {2 * ms, Yes, false}, {3 * ms, No, false}, {4 * ms, No, false}},
			wantQuorum: false, wantElapsed: 4 * ms, wantYes: 2, wantNo: 2,
		},
		{
			name:       "hung nodes stop counting at the node timeout",
			nodes:      []node{{1 * ms, Yes, false}, {2 * ms, Yes, false}, {0, 0, true}, {0, 0, true}, {0, 0, true}},
			wantQuorum: false, wantElapsed: 100 * ms, wantYes: 2, wantFailed: 3,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var wg sync.WaitGroup
				r, got := run(t.Context(), tc.nodes, 100*ms, &wg, Majority)
				if got.Quorum() != tc.wantQuorum || got.Elapsed != tc.wantElapsed ||
					got.Yes != tc.wantYes || got.No != tc.wantNo || got.Failed != tc.wantFailed {
					t.Errorf("tally = {quorum %v, yes %d, no %d, failed %d, after %v}; want {quorum %v, yes %d, no %d, failed %d, after %v}",
						got.Quorum(), got.Yes, got.No, got.Failed, got.Elapsed,
						tc.wantQuorum, tc.wantYes, tc.wantNo, tc.wantFailed, tc.wantElapsed)
				}
				// Stragglers finish in the background and are owned by wg.
				wg.Wait()
				for i := range tc.nodes {
					if _, ok := r.Reply(i); !ok {
						t.Errorf("node %d has no reply after wg.Wait", i)
					}
				}
			})
		})
	}
}

func TestCollect_timeoutError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, got := run(t.Context(), []node{{0, 0, true}}, 50*time.Millisecond, nil, Majority)
		defer r.Wait()
		var te *TimeoutError
		if !errors.As(got.Errs[0], &te) || !errors.Is(got.Errs[0], context.DeadlineExceeded) {
			t.Errorf("Errs[0] = %v; want a *TimeoutError matching context.DeadlineExceeded", got.Errs[0])
		}
	})
}

func TestCollect_ctxCancelled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		time.AfterFunc(5*time.Millisecond, cancel)
		nodes := []node{{time.Millisecond, Yes, false}, {time.Second, Yes, false}, {time.Second, Yes, false}}
		r, got := run(ctx, nodes, 10*time.Second, nil, Majority)
		r.Wait()
		if got.Quorum() || got.Elapsed != 5*time.Millisecond || !errors.Is(got.Errs[1], context.Canceled) {
			t.Errorf("tally = {quorum %v, after %v, errs[1] %v}; want no quorum after 5ms with context.Canceled",
				got.Quorum(), got.Elapsed, got.Errs[1])
		}
	})
}

func TestCollect_all(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		nodes := []node{{time.Millisecond, Yes, false}, {2 * time.Millisecond, Yes, false}, {30 * time.Millisecond, No, false}}
		_, got := run(t.Context(), nodes, time.Second, nil, All)
		if got.Elapsed != 30*time.Millisecond || got.Yes != 2 || got.No != 1 {
			t.Errorf("All: tally yes %d no %d after %v; want yes 2 no 1 after 30ms", got.Yes, got.No, got.Elapsed)
		}
	})
}

// Record recounts a node whose vote it replaces, and Counted counts a
// filled-in tally the same way: the counts always match the votes.
func TestTally_recordAndCounted(t *testing.T) {
	errDown := errors.New("down")
	tl := Tally{Votes: make([]Vote, 3), Errs: make([]error, 3), Pending: 3}
	tl.Record(0, Yes, nil)
	tl.Record(1, Vote(9), errDown) // not a vote: counts as Failed
	if tl.Yes != 1 || tl.Failed != 1 || tl.Pending != 1 || tl.Votes[1] != Failed || tl.Errs[1] != errDown {
		t.Fatalf("after two votes: %+v", tl)
	}
	tl.Record(1, No, nil) // a late answer replaces the failure
	tl.Record(2, Yes, nil)
	want := Counted([]Vote{Yes, No, Yes}, []error{nil, nil, nil})
	if tl.Yes != want.Yes || tl.No != want.No || tl.Failed != want.Failed || tl.Pending != want.Pending || tl.Yes != 2 || tl.No != 1 || tl.Pending != 0 {
		t.Fatalf("recorded %+v, counted %+v", tl, want)
	}
	if !tl.Quorum() {
		t.Fatal("2 of 3 yes is a quorum")
	}
}

// CollectWake asks decide again when wake delivers, without a reply: a
// decider that depends on more than the tally settles the round then, not
// at the node timeout.
func TestCollectWake_decidesOnWake(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		nodes := []node{{time.Millisecond, Yes, false}, {time.Millisecond, No, false}, {time.Second, Yes, false}}
		r := Start(t.Context(), len(nodes), 500*time.Millisecond, nil, func(ctx context.Context, i int) (Vote, error) {
			select {
			case <-time.After(nodes[i].delay):
				return nodes[i].vote, nil
			case <-ctx.Done():
				return Failed, ctx.Err()
			}
		})
		defer r.Wait()
		wake := make(chan struct{}, 1)
		var extra atomic.Bool // the outside fact the decider counts
		time.AfterFunc(20*time.Millisecond, func() { extra.Store(true); wake <- struct{}{} })
		got := r.CollectWake(t.Context(), func(_ int, rep Reply[Vote]) (Vote, error) { return rep.Val, rep.Err },
			func(t Tally) bool { return Majority(t) || extra.Load() }, wake)
		if got.Elapsed != 20*time.Millisecond || got.Yes != 1 || got.No != 1 || got.Pending != 1 {
			t.Errorf("tally yes %d no %d pending %d after %v; want yes 1 no 1 pending 1 after 20ms (the wake-up)",
				got.Yes, got.No, got.Pending, got.Elapsed)
		}
	})
}
