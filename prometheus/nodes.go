package redlockprom

import (
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quorumlock/quorumlock/redlock"
)

// NodeFailureWindow is how long a node counts as failing in
// redis_lock_nodes_failing and redis_lock_quorum_headroom after a request
// to it failed. The adapter sees only the requests the Client sends, so a
// node counts as healthy again once no request failed there for this long
// (also when no request was sent). It is longer than the default renewal
// interval (10s), so a node that is down while any lock is held stays
// counted.
const NodeFailureWindow = time.Minute

// nodeHealth keeps what redis_lock_nodes_failing and
// redis_lock_quorum_headroom report: the Client's node count and quorum
// (from its rounds) and when each node last failed.
type nodeHealth struct {
	nodes, quorum atomic.Int64 // from the latest round; 0 until one was seen
	now           func() time.Time

	mu       sync.Mutex
	failedAt map[string]time.Time // protected by mu: node address (or index) → latest failure

	failingDesc, headroomDesc *prometheus.Desc
}

func newNodeHealth(cl prometheus.Labels) *nodeHealth {
	return &nodeHealth{
		now:      time.Now,
		failedAt: map[string]time.Time{},
		failingDesc: prometheus.NewDesc("redis_lock_nodes_failing",
			"Nodes with a failed request (timeout, connection, busy, restarted, or an error reply other than WRONGTYPE) in the last minute.",
			nil, cl),
		headroomDesc: prometheus.NewDesc("redis_lock_quorum_headroom",
			"Nodes that may still fail before no lock can be taken: nodes − quorum − nodes failing. 0: one more failing node is an outage; below 0: no quorum now.",
			nil, cl),
	}
}

// round records the node count and quorum of a round.
func (n *nodeHealth) round(nodes, quorum int) {
	if nodes > 0 && quorum > 0 {
		n.nodes.Store(int64(nodes))
		n.quorum.Store(int64(quorum))
	}
}

// failing reports whether the failed request says the node cannot take
// part in a quorum: the caller's ctx ending (canceled) says nothing about
// the node, nor does a key of another type (WRONGTYPE, the caller's key),
// nor a refused wake-up message or Dial's ROLE/INFO check (the ACL lacks
// a command the locks do not need).
func failing(i redlock.NodeErrorInfo) bool {
	switch i.Kind {
	case "canceled":
		return false
	case "reply":
		if i.Op == "dial" || i.Op == "publish" {
			return false
		}
		return i.Err == nil || !strings.HasPrefix(i.Err.Error(), "WRONGTYPE")
	}
	return true
}

func (n *nodeHealth) nodeError(i redlock.NodeErrorInfo) {
	if !failing(i) {
		return
	}
	key := i.Addr
	if key == "" {
		key = "#" + strconv.Itoa(i.Node)
	}
	now := n.now()
	n.mu.Lock()
	n.failedAt[key] = now
	n.mu.Unlock()
}

// countFailing returns the nodes that failed within NodeFailureWindow, and
// forgets the others.
func (n *nodeHealth) countFailing() int {
	since := n.now().Add(-NodeFailureWindow)
	n.mu.Lock()
	defer n.mu.Unlock()
	for k, at := range n.failedAt {
		if !at.After(since) {
			delete(n.failedAt, k)
		}
	}
	return len(n.failedAt)
}

func (n *nodeHealth) Describe(ch chan<- *prometheus.Desc) {
	ch <- n.failingDesc
	ch <- n.headroomDesc
}

// Collect reports the failing nodes always and the headroom once a round
// has told the node count and quorum.
func (n *nodeHealth) Collect(ch chan<- prometheus.Metric) {
	f := n.countFailing()
	ch <- prometheus.MustNewConstMetric(n.failingDesc, prometheus.GaugeValue, float64(f))
	nodes, quorum := n.nodes.Load(), n.quorum.Load()
	if nodes == 0 {
		return
	}
	ch <- prometheus.MustNewConstMetric(n.headroomDesc, prometheus.GaugeValue, float64(nodes-quorum-int64(f)))
}
