package chaos

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// subscribers are raw SUBSCRIBEs on the wake-up channel of every resource
// (on a plain node, the channel is named like the lock key), one connection
// per node through its proxy, open for the whole run. With a subscriber
// present, a release that frees the key publishes, which is the path on
// which issue 12's first defect wrote a short marker instead of its
// tombstone. The lock clients' own waiters subscribe too (wake-up is on by
// default), but only while they wait. Messages received are counted in
// env.wakeUps.
type subscribers struct {
	pss []*redis.PubSub
	wg  sync.WaitGroup
}

func startSubscribers(e *env, resources []string) *subscribers {
	channels := make([]string, len(resources))
	for i, r := range resources {
		channels[i] = "lock:" + r
	}
	s := &subscribers{}
	for i := range e.cfg.Nodes {
		// The cluster closes the client; a cut or a restart of the node
		// drops the subscription, and go-redis subscribes again.
		ps := e.cluster.Client(i).Subscribe(context.Background(), channels...)
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
