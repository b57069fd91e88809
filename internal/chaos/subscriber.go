package chaos

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// subscribers are raw PSUBSCRIBEs on every Client's wake-up channel
// (lock:wake:*), one connection per node through its proxy, open for the
// whole run. They receive every handoff message, and they make every
// handoff's PUBLISH reach someone, so a release hands the key to the first
// waiter queued even when that waiter's Client is gone (a Client closed
// with its entry left on a node it could not reach): the waiter is then
// alive to the node but never answers, and only the TTL frees the key.
// (Before the queue, releases published on per-resource channels, and
// issue 12's first defect was on that path.) Messages received are counted
// in env.wakeUps.
type subscribers struct {
	pss []*redis.PubSub
	wg  sync.WaitGroup
}

func startSubscribers(e *env) *subscribers {
	s := &subscribers{}
	for i := range e.cfg.Nodes {
		// The cluster closes the client; a cut or a restart of the node
		// drops the subscription, and go-redis subscribes again.
		ps := e.cluster.Client(i).PSubscribe(context.Background(), "lock:wake:*")
		s.pss = append(s.pss, ps)
		s.wg.Go(func() {
			for range ps.Channel() {
				e.wakeUps.Add(1)
			}
		})
	}
	return s
}

func (s *subscribers) close() {
	for _, ps := range s.pss {
		ps.Close()
	}
	s.wg.Wait()
}
