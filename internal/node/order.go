package node

import (
	"context"
	"slices"

	"github.com/quorumlock/quorumlock/internal/scripts"
)

// The order of a Client's own requests to one key on one node: an acquire
// goes after this Client's releases of the key in flight there when its
// round was registered (Token.Follow, Request), so that its own leftovers
// never refuse it.

// relKey names a lock key on one node; Set.releasing holds, per
// relKey, one channel per release of it in flight there, closed when that
// release ends.
type relKey struct {
	key  string // the lock key on the node
	node int
}

// ReleaseBegin registers a release of keys on node i (under each of its
// lock keys: a multi-lock's every resource), before it is handed to a
// goroutine or sent; done ends it. Every sender of a release registers
// it: Unlock's round, a refused call's cleanup and a lost call's abandon
// (package redlock's release.go), and the retry loop's pipelines
// (releaser.go). This Client's next acquire of any of those keys waits on each node for the
// releases registered there before its round was (Token.Follow), so
// that its own leftovers never refuse it: a TryLock right after a refused
// one found the first one's grant still there
// (TestReal_evenNNeedsThreeOfFour, once beside stress-ng).
func (s *Set) ReleaseBegin(keys scripts.Keys, i int) (done func()) {
	locks := keys.LockKeys()
	f := make(chan struct{}) // closed when the release has ended
	s.relMu.Lock()
	if s.releasing == nil {
		s.releasing = make(map[relKey][]chan struct{})
	}
	for _, key := range locks {
		k := relKey{key, i}
		s.releasing[k] = append(s.releasing[k], f)
	}
	s.relMu.Unlock()
	return func() {
		s.relMu.Lock()
		for _, key := range locks {
			k := relKey{key, i}
			fs := s.releasing[k]
			if j := slices.Index(fs, f); j >= 0 {
				fs = slices.Delete(fs, j, j+1)
			}
			if len(fs) == 0 {
				delete(s.releasing, k)
			} else {
				s.releasing[k] = fs
			}
		}
		s.relMu.Unlock()
		close(f)
	}
}

// releasesBefore returns, per node, this Client's releases of keys in
// flight now (nil: none anywhere). An acquire round takes it when it is
// registered, and each of its requests waits for those only
// (Request): a release registered later is never one it must
// follow, and may be its own call's cleanup, which waits for the
// request's answer — a request that started late waited for it, the two
// until the node timeout, and every acquire of the key on that node
// behind them (lockbench's semaphore: waits in steps of one node timeout;
// TestLate_lateRequestDoesNotWaitForItsOwnCleanup).
func (s *Set) releasesBefore(keys []scripts.Keys) [][]chan struct{} {
	s.relMu.Lock()
	defer s.relMu.Unlock()
	if len(s.releasing) == 0 {
		return nil
	}
	var out [][]chan struct{}
	for i, k := range keys {
		for _, key := range k.LockKeys() {
			if fs := s.releasing[relKey{key, i}]; len(fs) > 0 {
				if out == nil {
					out = make([][]chan struct{}, len(keys))
				}
				out[i] = append(out[i], fs...)
			}
		}
	}
	return out
}

// awaitReleases waits until the releases fs took for node i have ended
// (each within its node timeout), or ctx ends.
func awaitReleases(ctx context.Context, fs [][]chan struct{}, i int) {
	if fs == nil {
		return
	}
	for _, f := range fs[i] {
		select {
		case <-f:
		case <-ctx.Done():
			return
		}
	}
}
