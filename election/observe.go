package election

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/testhooks"
)

// Observe returns a channel of leadership changes: the current leader first
// (the zero Leader when there is none), then each new state as a majority
// of nodes sees it. A zero Leader means no leader is known to a majority:
// none is elected, or too few nodes answer to tell.
//
// Changes are noticed through the announcements candidates publish on
// Channel when they take or leave office — a subscription on every node —
// and, as a fallback for a leader whose lease simply ran out, by reading
// the leader every poll interval (WithPollInterval). Each prompt is
// answered by a majority read (Leader), never by trusting one node's
// message. A slow receiver misses intermediate states, never the latest.
//
// The channel is closed after ctx is done and the subscriptions are closed;
// the observer's goroutines have returned by then.
func (e *Election) Observe(ctx context.Context) <-chan Leader {
	out := make(chan Leader)
	kick := make(chan struct{}, 1)
	subs := make([]*redis.PubSub, len(e.nodes))
	var wg sync.WaitGroup
	for i, n := range e.nodes {
		ps := n.Subscribe(ctx, e.Channel())
		subs[i] = ps
		msgs := ps.Channel()
		wg.Go(func() {
			// ps.Channel is closed by ps.Close; go-redis resubscribes
			// after a broken connection on its own.
			for range msgs {
				select {
				case kick <- struct{}{}:
				default:
				}
			}
		})
	}
	go func() {
		defer close(out)
		defer func() {
			for _, ps := range subs {
				_ = ps.Close()
			}
			wg.Wait()
		}()
		e.observe(ctx, out, kick)
	}()
	return out
}

func (e *Election) observe(ctx context.Context, out chan<- Leader, kick <-chan struct{}) {
	poll := time.NewTicker(e.cfg.pollInterval)
	defer poll.Stop()
	var (
		last    Leader
		pending *Leader // the latest state not yet delivered
		sent    bool
	)
	read := func() {
		if sent && testhooks.ObserveSeesFirst.Load() {
			return
		}
		l, err := e.Leader(ctx)
		if err != nil && !errors.Is(err, ErrNoLeader) && ctx.Err() == nil {
			e.warn(ctx, "observe: leader not known", err)
		}
		if ctx.Err() != nil {
			return
		}
		if !sent || l.Term != last.Term {
			last, sent = l, true
			pending = &l
		}
	}
	read()
	for {
		var send chan<- Leader
		var v Leader
		if pending != nil {
			send, v = out, *pending
		}
		select {
		case <-ctx.Done():
			return
		case send <- v:
			pending = nil
		case <-kick:
			read()
		case <-poll.C:
			read()
		}
	}
}
